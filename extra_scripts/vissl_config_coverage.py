"""How many of VISSL's own config files the engine accepts, and why it refuses the others.

    python extra_scripts/vissl_config_coverage.py [VISSL_CONFIG_TREE] [--top 15] [--hydra]

For every .yaml under VISSL's config tree (default /work/shared/vissl/configs/config) the file
is composed as a VISSL user runs it, over this engine's defaults.yaml, with
``config.MACHINE.DEVICE=cpu``, then checked as before a launch: keys and types, unsupported
VISSL settings (ssl_engine/config/unsupported.py), derived settings and combinations, and the
names of the components it asks for (trunk, heads, loss, meters, collators, data sources,
transforms, task, train step) against the engine's registries. Data paths and dataset catalog
entries are not looked up (no data is needed).

Pairing: files in a folder named models, transforms, dataset, datasets, optimization or
optimizers are fragments that VISSL's docs add to a base config with
``config=<base> +config/<folder>=<file>``; each is composed over the first config file (by name)
of the nearest folder above it that holds config files, as in VISSL's benchmark instructions
(e.g. benchmark/fulltune/cifar10/models/resnet50 over benchmark/fulltune/cifar10/<its config>).
Fragments with no such base are composed alone.

Composition: VISSL's files are ``# @package _global_`` files without defaults lists, so by default
the script merges them with OmegaConf the way Hydra does (dicts merged, lists replaced), which
takes milliseconds per file (``config.MACHINE.DEVICE=cpu`` is set as a string, as Hydra
would); ``--hydra`` composes every file through Hydra instead (the
engine's own ``compose_config``, a temporary folder holding defaults.yaml and VISSL's tree, about
ten times slower) to confirm the two agree.
"""
import argparse
import collections
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FRAGMENT_FOLDERS = {"models", "transforms", "dataset", "datasets", "optimization", "optimizers"}
OVERRIDES = ["config.MACHINE.DEVICE=cpu"]


def config_names(root: Path):
    """(name, [hydra arguments]) of every config file: base files alone, fragments over a base."""
    out = []
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root).with_suffix("")
        if rel.parent.name not in FRAGMENT_FOLDERS:
            out.append((str(rel), [f"config={rel}"]))
            continue
        base = None
        for folder in rel.parents[1:]:
            files = sorted(p for p in (root / folder).glob("*.yaml"))
            if files:
                base = files[0].relative_to(root).with_suffix("")
                break
        args = [f"config={base}"] if base else []
        out.append((str(rel), args + [f"+config/{rel.parent}={rel.name}"]))
    return out


def _merge(into: dict, update: dict) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def compose_fast(root: Path, args, defaults):
    """Hydra's merge of ``_global_`` files without defaults lists (dicts merged, lists and
    values replaced), on plain containers."""
    import copy

    from omegaconf import OmegaConf

    from ssl_engine.config import ConfigError

    merged = copy.deepcopy(defaults)
    for arg in args:
        name = arg.split("=", 1)[1] if arg.startswith("config=") else \
            arg[len("+config/"):].replace("=", "/")
        try:
            update = OmegaConf.to_container(OmegaConf.load(root / f"{name}.yaml"))
        except Exception as err:  # unreadable yaml
            raise ConfigError(f"compose failed: {type(err).__name__}") from None
        if isinstance(update, dict):
            update.pop("defaults", None)
            _merge(merged, update)
    for item in OVERRIDES:
        key, value = item.split("=", 1)
        *parents, last = key.split(".")
        node = merged
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return merged


def check_names(cfg) -> None:
    """The component names a config asks for, looked up in the engine's registries."""
    import ssl_engine.data  # noqa: F401  (registers data sources, transforms, collators)
    import ssl_engine.losses  # noqa: F401
    import ssl_engine.meters  # noqa: F401
    import ssl_engine.models  # noqa: F401
    import ssl_engine.trainer  # noqa: F401  (registers the tasks)
    from ssl_engine.config import ConfigError
    from ssl_engine.data.registry import COLLATOR_REGISTRY, DATASOURCE_REGISTRY, TRANSFORM_REGISTRY
    from ssl_engine.models.registry import MODEL_HEADS, MODEL_TRUNKS
    from ssl_engine.losses import LOSS_REGISTRY
    from ssl_engine.meters import METER_REGISTRY
    from ssl_engine.trainer.train_steps import TRAIN_STEP_REGISTRY
    from ssl_engine.utils.classy import TASK_REGISTRY

    def need(registry, name, kind):
        if name not in registry:
            raise ConfigError(f"no {kind} named '{name}'")

    def heads(params):
        for item in params or []:
            if item and isinstance(item[0], str):
                yield item[0]
            elif item and isinstance(item[0], list):
                yield from heads(item)

    need(MODEL_TRUNKS, cfg["MODEL"]["TRUNK"]["NAME"], "trunk")
    for name in heads(cfg["MODEL"]["HEAD"]["PARAMS"]):
        need(MODEL_HEADS, name, "head")
    if cfg["LOSS"]["name"] and not cfg["MODEL"]["FEATURE_EVAL_SETTINGS"]["FREEZE_TRUNK_AND_HEAD"]:
        need(LOSS_REGISTRY, cfg["LOSS"]["name"], "loss")
    for name in cfg["METERS"]["names"]:
        need(METER_REGISTRY, name, "meter")
    for split in ("TRAIN", "TEST"):
        data = cfg["DATA"][split]
        need(COLLATOR_REGISTRY, data["COLLATE_FUNCTION"], "collator")
        for source in data["DATA_SOURCES"]:
            need(DATASOURCE_REGISTRY, source, "data source")
        for spec in data["TRANSFORMS"]:
            need(TRANSFORM_REGISTRY, spec.get("name"), "transform")
    need(TASK_REGISTRY, cfg["TRAINER"]["TASK_NAME"], "task")
    need(TRAIN_STEP_REGISTRY, cfg["TRAINER"]["TRAIN_STEP_NAME"], "train step")


def reason_of(message: str) -> str:
    """Group a refusal: the unsupported key (or name), the unknown key, or the kind of error."""
    patterns = [
        (r"^(config\.[\w.]+?=[\w./-]+) is not supported: the \w+ (trunk|loss|meter)", r"\1"),
        (r"^(config\.[\w.]+)=.* is not supported", r"unsupported \1"),
        (r"^unknown config key '([^']+)'", r"unknown key \1"),
        (r"^config key '([^']+)' expects", r"wrong type \1"),
        (r"^no (.+) named '([^']+)'", r"no \1 \2"),
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
    parser.add_argument("--hydra", action="store_true", help="compose through Hydra (slower)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="one more override for every file (string values), e.g. "
                             "config.DISTRIBUTED.BACKEND=gloo")
    args = parser.parse_args(argv)
    OVERRIDES.extend(args.override)

    from ssl_engine.config import AttrDict, ConfigError, compose_config
    from ssl_engine.config.compose import load_defaults
    from ssl_engine.config.derive import derive_settings
    from ssl_engine.config.validate import validate_config

    root = Path(args.tree).resolve()
    schema = load_defaults()
    schema.pop("defaults", None)
    names = config_names(root)
    tmp = None
    if args.hydra:
        import os

        tmp = Path(tempfile.mkdtemp(prefix="vissl_configs_"))
        shutil.copytree(root, tmp / "config")
        shutil.copy(REPO / "configs/config/defaults.yaml", tmp / "config/defaults.yaml")
        os.environ["SSL_ENGINE_CONFIG_DIR"] = str(tmp)
    import logging

    # the warning of each older key moved (one per file) would drown the report
    logging.getLogger("ssl_engine.config.legacy_keys").setLevel(logging.ERROR)
    start = time.perf_counter()
    reasons = collections.Counter()
    examples = {}
    accepted = 0
    try:
        for name, hydra_args in names:
            try:
                if args.hydra:
                    _, cfg = compose_config(hydra_args + OVERRIDES)
                else:
                    composed = compose_fast(root, hydra_args, schema)
                    validate_config(composed, schema)
                    cfg = AttrDict(composed["config"])
                derive_settings(cfg)
                check_names(cfg)
                accepted += 1
            except (ConfigError, KeyError, TypeError, ValueError) as err:
                text = str(err) if isinstance(err, ConfigError) else f"{type(err).__name__}: {err}"
                reason = reason_of(text)
                reasons[reason] += 1
                examples.setdefault(reason, name)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    total = len(names)
    print(f"{total} config files under {root} ({time.perf_counter() - start:.0f} s)")
    print(f"  compose and validate: {accepted}")
    print(f"  refused:              {total - accepted} ({len(reasons)} reasons)")
    print(f"\n{'files':>5}  reason (first refusal of each file)  [example]")
    for reason, count in reasons.most_common(args.top):
        print(f"{count:>5}  {reason}  [{examples[reason]}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
