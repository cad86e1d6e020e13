"""How vissl_config_coverage.py pairs VISSL's config files: which are base files, which are
fragments, and which base (and sibling fragment) each fragment is composed over (the rules are
in vissl_config_coverage.py's docstring)."""
from pathlib import Path

DATASET_FOLDER_ENDINGS = ("dataset", "datasets")  # e.g. semi_sup_datasets: data fragments


def _load(path: Path):
    """The file as plain data (PyYAML keeps the last of duplicated keys, as detectron2 does)."""
    import yaml

    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except Exception:  # noqa: BLE001  (unreadable: reported by the composition)
        return None


def _data_splits(data) -> set:
    """The splits (TRAIN, TEST) whose data the file names."""
    cfg = data.get("config") if isinstance(data, dict) else None
    if retrieval_config(cfg):
        return {"TRAIN", "TEST"}
    splits = ((cfg or {}).get("DATA") or {}) if isinstance(cfg, dict) else {}
    return {split for split in ("TRAIN", "TEST")
            if isinstance(splits.get(split), dict) and (splits[split].get("DATA_SOURCES")
                                                        or splits[split].get("DATASET_NAMES"))}


def _run_splits(data) -> set:
    """The splits the file runs, with VISSL's (and the engine's) defaults TEST_MODEL true and
    TEST_ONLY false for what it does not set."""
    cfg = data.get("config") if isinstance(data, dict) else None
    cfg = cfg if isinstance(cfg, dict) else {}
    test_only = bool(cfg.get("TEST_ONLY", False))
    return ({"TEST"} if test_only or cfg.get("TEST_MODEL", True) else set()) | (
        set() if test_only else {"TRAIN"})


def retrieval_config(cfg) -> bool:
    """Whether the ``config`` section names its images by IMG_RETRIEVAL.DATASET_PATH: a file
    VISSL runs with tools/instance_retrieval_test.py, whose DATA names nothing."""
    section = cfg.get("IMG_RETRIEVAL") if isinstance(cfg, dict) else None
    return isinstance(section, dict) and bool(section.get("DATASET_PATH"))


def config_names(root: Path):
    """(name, [hydra arguments]) of every engine config file, base files alone and fragments
    over a base; and the names of the files that are not engine configs."""
    rels, bases, with_data, foreign, loaded = [], set(), set(), [], {}
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root).with_suffix("")
        data = _load(path)
        if isinstance(data, dict) and "config" not in data and "defaults" not in data:
            foreign.append(str(rel))
            continue
        rels.append(rel)
        loaded[rel] = data
        named = _data_splits(data)
        if named:
            with_data.add(rel)
            if (_run_splits(data) <= named
                    and not rel.parent.name.lower().endswith(DATASET_FOLDER_ENDINGS)):
                bases.add(rel)

    def first_base(folder: Path, among=bases, fragment=None):
        found = sorted(r for r in among if r.parent == folder)
        fitting = [r for r in found if fragment is None or fits(loaded[fragment], loaded[r])]
        return (fitting or found or [None])[0]

    out = []
    for rel in rels:
        if rel in bases:
            out.append((str(rel), [f"config={rel}"]))
            continue
        args = []
        for folder in rel.parents:
            base = first_base(folder, fragment=rel) if folder != rel.parent else None
            if base is not None:
                args = [f"config={base}"]
                break
            dataset = next((b for name in ("dataset", "datasets")
                            for b in [first_base(folder / name, with_data)] if b is not None
                            and folder / name not in rel.parents), None)
            if dataset is not None:
                args = [f"config={dataset}"]
                break
        partner = None if rel in with_data else (
            named_partner(rel, rels) or trunk_partner(rel, args, rels, loaded))
        if args and partner is not None:
            args.append(f"+config/{partner.parent}={partner.name}")
        out.append((str(rel), args + [f"+config/{rel.parent}={rel.name}"]))
    return _pair_lone_data_files(out), foreign


def named_partner(rel: Path, rels):
    """The fragment that ``rel`` (a fragment naming no data) is written to go with, by the
    folders' names: the first file (by name) of a sibling folder named ``<anything>_<rel's
    name>`` (geolocalisation's partitioning/middle goes with models_middle/...)."""
    found = sorted(r for r in rels if r.parent.parent == rel.parent.parent
                   and r.parent != rel.parent
                   and r.parent.name.lower().endswith("_" + rel.name.lower()))
    return found[0] if found else None


def _first_input(data):
    """(name, dims[0]) of the student's first head, or None."""
    heads = _section(data, "MODEL", "HEAD", "PARAMS")
    first = heads[0] if heads and isinstance(heads[0], (list, tuple)) and heads[0] else None
    params = first[1] if first and len(first) > 1 and isinstance(first[1], dict) else {}
    dims = params.get("dims")
    return (first[0], dims[0]) if first and isinstance(dims, list) and dims else None


def trunk_partner(rel: Path, args, rels, loaded):
    """For a heads fragment (heads, no trunk) whose first head takes another input size than
    the base's first head of that kind (a head written for another trunk): the first file (by
    name) of a sibling folder that gives the trunk it was written for, i.e. whose first head of
    the same kind takes that size (pretrain/swav/heads/d7392_... goes with
    models/regnet128Gf)."""
    given = _first_input(loaded[rel])
    if _section(loaded[rel], "MODEL", "TRUNK"):  # it gives its trunk itself
        return None
    base = Path(args[0][len("config="):]) if args and args[0].startswith("config=") else None
    had = _first_input(loaded.get(base)) if base is not None else None
    if given is None or had is None or given[0] != had[0] or given[1] == had[1]:
        return None
    found = sorted(r for r in rels if r.parent.parent == rel.parent.parent
                   and r.parent != rel.parent and _first_input(loaded[r]) == given
                   and _section(loaded[r], "MODEL", "TRUNK"))
    return found[0] if found else None


def _section(data, *keys):
    node = data.get("config") if isinstance(data, dict) else None
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node


MODELS = (("MODEL",), ("DISTILLATION", "TEACHER_MODEL"))  # the student's and a teacher's


def _heads(model):
    """(names of the heads in order, the last head's output size or None), or None when the
    model section gives no heads."""
    heads = (_section({"config": model}, "HEAD", "PARAMS") if isinstance(model, dict) else None)
    if not heads:
        return None
    heads = [h for h in heads if isinstance(h, (list, tuple)) and h]
    last = heads[-1][1] if heads and len(heads[-1]) > 1 and isinstance(heads[-1][1], dict) \
        else {}
    dims = last.get("dims")
    return [h[0] for h in heads], (dims[-1] if isinstance(dims, list) and dims else None)


def _same_heads(given, had) -> bool:
    """The same kinds of heads (names, in order), ending in the same size where both say it."""
    if had is None or given[0] != had[0]:
        return False
    return given[1] is None or had[1] is None or given[1] == had[1]


def _feature_size(trunk):
    """A trunk's feature size where the file says it: a transformer's HIDDEN_DIM."""
    for key, section in (trunk or {}).items():
        if isinstance(section, dict) and key.upper().endswith("TRANSFORMERS") \
                and isinstance(section.get("HIDDEN_DIM"), int):
            return section["HIDDEN_DIM"]
    return None


def _masks(model) -> bool:
    """Whether a model's trunk does masked image modeling (iBOT's or MSN's)."""
    trunk = _section({"config": model}, "TRUNK") or {}
    return any(isinstance(section, dict) and str((section.get("MASKED_IMAGE_MODELING") or {})
                                                 .get("NAME", "none")).lower() != "none"
               for section in trunk.values())


def fits(fragment, base) -> bool:
    """Whether ``base`` is a base the fragment was written for: the heads it gives a model
    (the student, or the distillation teacher) are the same kind (names, in order) as that
    model's heads in the base, ending in the same size (the last head's last dims) where both
    say it; a trunk it gives without heads has a feature size that the
    base's first head takes (its first dims; an identity head takes any); data with a mask
    input (INPUT_KEY_NAMES) goes with a student trunk that masks. What the fragment does not
    say fits any base."""
    for path in MODELS:
        given, had = _section(fragment, *path), _section(base, *path)
        if not isinstance(given, dict):
            continue
        heads = _heads(given)
        if heads is not None and not _same_heads(heads, _heads(had or {})):
            return False
        size = _feature_size(given.get("TRUNK")) if heads is None else None
        first = _first_input({"config": {"MODEL": had}}) if isinstance(had, dict) else None
        if size is not None and first and first[0] != "identity" and first[1] != size:
            return False
    inputs = _section(fragment, "DATA", "TRAIN", "INPUT_KEY_NAMES") or []
    return "mask" not in inputs or _masks(_section(base, "MODEL"))


def _pair_lone_data_files(out):
    """A data file of a dataset(s) folder with no base above it goes with the fragment that
    VISSL's folders pair with that folder (the first by name of those composed after the
    folder's first data file): its data under that model, as a user runs it."""
    partner = {}
    for name, args in out:
        if len(args) == 2 and args[0].startswith("config="):
            partner.setdefault(Path(args[0][len("config="):]).parent, (name, args[1]))
    paired = []
    for name, args in out:
        rel = Path(name)
        lone = len(args) == 1 and rel.parent.name.lower().endswith(DATASET_FOLDER_ENDINGS)
        if lone and rel.parent in partner:
            args = [f"config={rel}", partner[rel.parent][1]]
        paired.append((name, args))
    return paired
