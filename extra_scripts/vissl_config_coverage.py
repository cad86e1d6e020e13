"""How many of VISSL's own config files the engine accepts, and why it refuses the others.

    python extra_scripts/vissl_config_coverage.py [VISSL_CONFIG_TREE] [--top 15] [--list] [--hydra]
        [--catalog FILE] [--any-dataset] [--override config.KEY=VALUE ...]
        [--run N [--seed 0] [--run-batch 2] [--run-timeout 900] [--run-memory-gb 20]]

For every .yaml under VISSL's config tree (default /work/shared/vissl/configs/config) the file
is composed as a VISSL user runs it, over this engine's defaults.yaml, with
``config.MACHINE.DEVICE=cpu``, then checked as before a launch: keys and types, unsupported
VISSL settings (ssl_engine/config/unsupported.py), derived settings and combinations, and the
names of the components it asks for (trunk, heads, loss, meters, collators, data sources,
transforms, task, train step) against the engine's registries, the trunk's settings and the
task's own checks: what the launcher refuses from the config alone
(``check_config_before_launch``). Data paths are not opened (no data is needed). A file whose
images come from IMG_RETRIEVAL.DATASET_PATH is checked as tools/instance_retrieval_test.py
checks it (``check_retrieval_config``: its DATA may name nothing).

Pairing: a base file names data (DATA_SOURCES or DATASET_NAMES, or IMG_RETRIEVAL.DATASET_PATH,
where the instance-retrieval tool reads its images) for every split it runs: TRAIN
unless TEST_ONLY, TEST when TEST_MODEL or TEST_ONLY (VISSL's defaults, as the engine's: TEST_MODEL
true, TEST_ONLY false), and does not sit in a folder whose name ends with "dataset(s)". Any
other file is a fragment that VISSL's docs add to a base config with ``config=<base>
+config/<folder>=<file>``: a model, transforms, optimizer or head setting that names no data; a
data setting (semi_sup_datasets/...); or a file that names the data of one split but runs
another without data (a jigsaw permutation's or PIRL's transforms with their TRAIN data, meant
for the method's base file that turns TEST_MODEL off; VISSL's DINO trunk-only extraction
config, whose TEST split is given by feature_extraction/dataset/...). It is composed over a
base file of the nearest folder above it that holds base files, as in VISSL's benchmark
instructions (e.g. benchmark/fulltune/cifar10/models/resnet50 over
benchmark/fulltune/cifar10/<its config>, feature_extraction/trunk_only/rn50_layers over
feature_extraction/extract_resnet_in1k_8gpu): the first (by name) of those it was written for
(``vissl_config_pairing.fits``, from what the fragment itself says): heads it gives the
student (MODEL.HEAD) or the distillation teacher (DISTILLATION.TEACHER_MODEL.HEAD) are the same
kinds, in order, as that model's heads in the base and end in the same size where both say it
(a logit-distillation student over the logit-distillation base, an MSN teacher over the MSN
distillation base); a trunk it gives without heads has a feature size (a transformer's
HIDDEN_DIM) that the base's first head takes (its first dims; identity takes any); data with
a mask input (INPUT_KEY_NAMES) goes over a base whose student trunk masks (iBOT's or MSN's).
Where no base fits, the first base by name. A fragment that names no data also brings the
fragment it was written to go with: the first file (by name) of the sibling folder its name
points to (``<anything>_<its name>``: geolocalization/partitioning/middle with
models_middle/...), or, for heads without a trunk whose first head takes another input size
than the base's head of that kind, the first file of a sibling folder giving a trunk whose
head of that kind takes that size (pretrain/swav/heads/d7392_... with models/regnet128Gf).
A fragment with no base file above it is composed after the first file that names data in a
``dataset``/``datasets`` folder inside its own folder or beside one of the folders above it
(fairness/extract_label_predictions/models/... after .../datasets/...,
feature_extraction/extract_dino_vit_trunk_only after feature_extraction/dataset/imagenette160).
A data file of such a folder with no base above it is composed under the first (by name) of
the fragments so paired with its folder (fairness/extract_label_predictions/datasets/utk_faces
under .../models/<the first model>; pretrain/datasets/imagenet under pretrain/seer/models/...).
Fragments with none of these are composed alone. Files that have no ``config:`` section at all are not
engine configs (detectron2's files for VISSL's object-detection benchmark) and are counted apart.

Catalog: DATASET_NAMES are looked up in the dataset catalog that VISSL's tree ships
(``<tree>/dataset_catalog.json``; ``--catalog`` names another), as a VISSL user's run does; the
paths it gives are not opened. ``--any-dataset`` adds a placeholder entry for every other name
the tree uses (VISSL's shipped catalog lacks its internal datasets), to show what refuses
those files next.

Running: ``--run N`` then trains up to N of the accepted files, evenly over the folders
(seeded), for 2 iterations each on synthetic data on the CPU, each in its own process under a
time and memory limit, and prints what ran and the failures grouped by the first line of their
error (extra_scripts/vissl_config_run.py says what is changed to run them here).

Composition: VISSL's files are ``# @package _global_`` files without defaults lists, so by default
the script merges them with OmegaConf the way Hydra does (dicts merged, lists replaced), which
takes milliseconds per file (``config.MACHINE.DEVICE=cpu`` is set as a string, as Hydra
would); ``--hydra`` composes every file through Hydra instead (the
engine's own ``compose_config``, a temporary folder holding defaults.yaml and VISSL's tree, about
ten times slower) to confirm the two agree.
"""
import argparse
import collections
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from vissl_common import BASE_OVERRIDES, REPO, complete_catalog, compose_fast
from vissl_config_pairing import config_names, retrieval_config
from vissl_config_run import pick, print_table, run_sample  # (--run)

ENV_SET = ("SSL_ENGINE_DATASET_CATALOG_PATH", "SSL_ENGINE_CONFIG_DIR")  # restored after a run


def check_names(engine_name: str, cfg) -> None:
    """What the launcher refuses from the config alone: the component names it asks for, the
    trunk's settings and the task's own checks (not the data paths or output folders)."""
    from ssl_engine.engines.prelaunch import check_config_before_launch

    check_config_before_launch(engine_name, cfg)


def check_file(engine_name: str, cfg) -> None:
    """Derived settings and ``check_names``; a retrieval config (``retrieval_config``) is
    checked as tools/instance_retrieval_test.py checks it instead (its DATA may be empty)."""
    from ssl_engine.config.derive import derive_settings

    if retrieval_config(cfg):
        from ssl_engine.engines.instance_retrieval import check_retrieval_config

        check_retrieval_config(cfg)
        return
    derive_settings(cfg)
    check_names(engine_name, cfg)


def reason_of(message: str) -> str:
    """Group a refusal: the unsupported key (or name), the unknown key, or the kind of error."""
    patterns = [
        (r"^(config\.[\w.]+?=[\w./-]+) is not supported: the \w+ (trunk|loss|meter)", r"\1"),
        (r"^(config\.[\w.]+)=.* is not supported", r"unsupported \1"),
        (r"^unknown config key '([^']+)'", r"unknown key \1"),
        (r"^config key '([^']+)' expects", r"wrong type \1"),
        (r"^config\.[\w.\[\]]+=(.+?): no (.+?) is registered under this name", r"no \2 \1"),
    ]
    for pattern, repl in patterns:
        match = re.match(pattern, message)
        if match:
            return match.expand(repl)
    return re.sub(r"\d+", "N", message)[:90]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tree", nargs="?", default=str(REPO.parent / "shared/vissl/configs/config"),
                        help="VISSL's configs/config folder")
    parser.add_argument("--top", type=int, default=15, help="reasons shown")
    parser.add_argument("--list", action="store_true",
                        help="also print every refused file with its whole refusal")
    parser.add_argument("--hydra", action="store_true", help="compose through Hydra (slower)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="one more override for every file (string values), e.g. "
                             "config.DISTRIBUTED.BACKEND=gloo")
    parser.add_argument("--catalog", help="dataset catalog JSON (default: the tree's "
                        "dataset_catalog.json, when it has one)")
    parser.add_argument("--any-dataset", action="store_true",
                        help="add a placeholder catalog entry for every DATASET_NAMES the tree "
                             "uses that the catalog lacks (the next refusals behind the data)")
    parser.add_argument("--run", type=int, default=0, metavar="N",
                        help="then train up to N accepted files for 2 iterations each on "
                             "synthetic data (extra_scripts/vissl_config_run.py)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --run sample")
    parser.add_argument("--run-batch", type=int, default=2, help="images per step in --run")
    parser.add_argument("--run-timeout", type=float, default=900,
                        help="seconds a --run file may take")
    parser.add_argument("--run-memory-gb", type=float, default=20,
                        help="address space of a --run process (0: no limit)")
    args = parser.parse_args(argv)
    overrides = [*BASE_OVERRIDES, *args.override]
    import logging

    saved_env = {var: os.environ.get(var) for var in ENV_SET}
    saved_level = logging.getLogger("ssl_engine").level
    # per-file warnings (nccl -> gloo, older keys moved) would drown the report
    logging.getLogger("ssl_engine").setLevel(logging.ERROR)
    try:
        return measure(args, overrides)
    finally:
        logging.getLogger("ssl_engine").setLevel(saved_level)
        for var, value in saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value


def measure(args, overrides) -> int:
    """Compose and check every file of ``args.tree`` with ``overrides``; print the table."""
    import ssl_engine.losses  # noqa: F401  (the losses' derived settings and key rules)
    import ssl_engine.models  # noqa: F401  (the trunks')
    from ssl_engine.config import AttrDict, ConfigError, compose_config
    from ssl_engine.config.compose import load_defaults
    from ssl_engine.config.validate import validate_config

    root = Path(args.tree).resolve()
    schema = load_defaults()
    schema.pop("defaults", None)
    names, foreign = config_names(root)
    catalog = args.catalog or (str(root / "dataset_catalog.json")
                               if (root / "dataset_catalog.json").is_file() else None)
    tmp_catalog = None
    if args.any_dataset:
        tmp_catalog = complete_catalog(root, names, catalog)
        catalog = f"{catalog or 'none'} + a placeholder for every other name"
        os.environ["SSL_ENGINE_DATASET_CATALOG_PATH"] = tmp_catalog
    elif catalog:
        os.environ["SSL_ENGINE_DATASET_CATALOG_PATH"] = str(Path(catalog).resolve())
    tmp = None
    if args.hydra:
        tmp = Path(tempfile.mkdtemp(prefix="vissl_configs_"))
        shutil.copytree(root, tmp / "config")
        shutil.copy(REPO / "configs/config/defaults.yaml", tmp / "config/defaults.yaml")
        os.environ["SSL_ENGINE_CONFIG_DIR"] = str(tmp)
    start = time.perf_counter()
    reasons = collections.Counter()
    examples = {}
    accepted, refused = [], []
    try:
        for name, hydra_args in names:
            try:
                if args.hydra:
                    engine_name, cfg = compose_config(hydra_args + overrides)
                else:
                    composed = compose_fast(root, hydra_args, schema, overrides)
                    validate_config(composed, schema)
                    engine_name = composed.get("engine_name", "train")
                    cfg = AttrDict(composed["config"])
                check_file(engine_name, cfg)
                accepted.append((name, hydra_args))
            except (ConfigError, KeyError, TypeError, ValueError) as err:
                text = str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
                reason = reason_of(text)
                reasons[reason] += 1
                examples.setdefault(reason, name)
                refused.append((name, text))
        print_validation(root, names, foreign, catalog, len(accepted), reasons, examples,
                         args.top, time.perf_counter() - start)
        if args.list:
            print("\nrefused files:")
            for name, text in refused:
                print(f"  {name}: {text.splitlines()[0] if text else ''}")
        if args.run > 0:
            picked = pick(accepted, args.run, args.seed)
            print(f"\n--run {args.run}: {len(picked)} of the {len(accepted)} accepted files "
                  f"(seed {args.seed}), 2 iterations each on synthetic data", flush=True)
            results, seconds = run_sample(root, picked, overrides, args.run_batch,
                                          args.run_timeout, args.run_memory_gb)
            print_table(results, seconds)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if tmp_catalog is not None:
            os.unlink(tmp_catalog)
    return 0


def print_validation(root, names, foreign, catalog, accepted, reasons, examples, top, seconds):
    total = len(names)
    print(f"{total + len(foreign)} config files under {root} ({seconds:.0f} s)")
    print(f"  not engine configs:   {len(foreign)} (no config: section; e.g. {foreign[0]})"
          if foreign else "  not engine configs:   0")
    print(f"  engine configs:       {total} (dataset catalog: {catalog or 'none'})")
    print(f"  compose and validate: {accepted}")
    print(f"  refused:              {total - accepted} ({len(reasons)} reasons)")
    print(f"\n{'files':>5}  reason (first refusal of each file)  [example]")
    for reason, count in reasons.most_common(top):
        print(f"{count:>5}  {reason}  [{examples[reason]}]")


if __name__ == "__main__":
    sys.exit(main())
