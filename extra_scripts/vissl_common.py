"""What the VISSL config scripts share (vissl_config_coverage.py, vissl_config_run.py,
vissl_config_rerun.py): the fast composition of a file with its overrides and the dataset
catalog completed with placeholders.  It imports none of those scripts."""
import json
import os
import tempfile
from pathlib import Path

from vissl_config_pairing import _load

REPO = Path(__file__).resolve().parents[1]
BASE_OVERRIDES = ("config.MACHINE.DEVICE=cpu",)  # every file, before --override's


def _merge(into: dict, update: dict) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def compose_fast(root: Path, args, defaults, overrides=BASE_OVERRIDES):
    """Hydra's merge of ``_global_`` files without defaults lists (dicts merged, lists and
    values replaced), on plain containers, then ``overrides`` (``KEY=VALUE``, string values)."""
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
    for item in overrides:
        key, value = item.split("=", 1)
        *parents, last = key.split(".")
        node = merged
        for part in parents:
            if node.get(part) is None:  # e.g. an empty "MACHINE:" in a file: Hydra's override
                node[part] = {}         # (OmegaConf.update) makes the null a new mapping
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"Could not override '{key}': {part} is not a mapping "
                                  "in the composed config")
        node[last] = value
    return merged


def complete_catalog(root: Path, names, catalog) -> str:
    """A temporary catalog: ``catalog``'s entries plus, for every DATASET_NAMES entry of the
    tree's files that it lacks, placeholder folders (never opened)."""
    entries = json.loads(Path(catalog).read_text()) if catalog else {}
    for name, _ in names:
        cfg = (_load(root / f"{name}.yaml") or {}).get("config") or {}
        for split in ("TRAIN", "TEST"):
            data = ((cfg.get("DATA") or {}).get(split) or {}) if isinstance(cfg, dict) else {}
            for dataset in data.get("DATASET_NAMES") or []:
                entries.setdefault(str(dataset), {
                    part: [f"/placeholder/{dataset}/{part}", "<unused>"]
                    for part in ("train", "val")})
    handle, path = tempfile.mkstemp(prefix="dataset_catalog_", suffix=".json")
    with os.fdopen(handle, "w") as f:
        json.dump(entries, f)
    return path
