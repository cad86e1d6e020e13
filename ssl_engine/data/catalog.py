"""DATASET_NAMES looked up in a dataset catalog: a JSON file in VISSL's format,

    {"<name>": {"train": ["<data path>", "<labels path>"], "val": ["<data path>", "<labels path>"]}}

A split whose DATA_PATHS is empty (or holds only "") and whose DATASET_NAMES is not takes its
paths from the catalog ("train" for DATA.TRAIN, "val" for DATA.TEST). A labels path is used when that file
exists (VISSL's rule: labels are optional). Where DATA_SOURCES is empty too, the source follows
from the entry: a torchvision dataset name reads with torchvision_dataset, a folder with
disk_folder, a .npy file with disk_filelist.

The catalog file: DATA.DATASET_CATALOG_PATH, else the environment variable
SSL_ENGINE_DATASET_CATALOG_PATH, else VISSL's VISSL_DATASET_CATALOG_PATH, else
configs/config/dataset_catalog.json of this repository when it exists.
"""
import json
import os
from typing import Dict

from ssl_engine.data.datasources.torchvision_dataset import NAMES as TORCHVISION_NAMES
from ssl_engine.data.registry import DATASOURCE_REGISTRY
from ssl_engine.utils.errors import ConfigError

ENV_VARS = ("SSL_ENGINE_DATASET_CATALOG_PATH", "VISSL_DATASET_CATALOG_PATH")
CATALOG_SPLITS = {"TRAIN": "train", "TEST": "val"}
_REPO_CATALOG = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "config",
                             "dataset_catalog.json")


def catalog_path(cfg):
    """(path, where it was named) of the catalog file, or (None, None) when none is set and
    the repository has none."""
    configured = cfg.DATA.get("DATASET_CATALOG_PATH", "")
    if configured:
        return os.path.expanduser(configured), "config.DATA.DATASET_CATALOG_PATH"
    for var in ENV_VARS:
        if os.environ.get(var):
            return os.path.expanduser(os.environ[var]), f"the environment variable {var}"
    if os.path.isfile(_REPO_CATALOG):
        return os.path.normpath(_REPO_CATALOG), "the repository's default"
    return None, None


def load_catalog(path: str, origin: str) -> Dict[str, dict]:
    """The catalog's {name: {split: [data, labels]}} (ConfigError for a missing/bad file)."""
    if not os.path.isfile(path):
        raise ConfigError(f"dataset catalog {path} (from {origin}) does not exist")
    try:
        with open(path) as f:
            catalog = json.load(f)
    except (OSError, ValueError) as err:
        raise ConfigError(f"dataset catalog {path} cannot be read as JSON: {err}") from None
    if not isinstance(catalog, dict) or not all(isinstance(v, dict) for v in catalog.values()):
        raise ConfigError(f"dataset catalog {path} must map each dataset name to "
                          '{"train": [data, labels], "val": [data, labels]}')
    return catalog


def _infer_source(name: str, data_path: str) -> str:
    if name in TORCHVISION_NAMES:
        return "torchvision_dataset"
    return "disk_filelist" if data_path.endswith(".npy") else "disk_folder"


def needs_catalog(cfg, split: str) -> bool:
    """Whether the split's paths are to be looked up: names given, DATA_PATHS empty, and some
    source (or no source yet) reads a path."""
    data = cfg.DATA[split]
    if not data.DATASET_NAMES or any(str(path) for path in data.DATA_PATHS):
        return False
    sources = list(data.DATA_SOURCES)
    if not sources:
        return True
    known = [DATASOURCE_REGISTRY.get(s) for s in sources if s in DATASOURCE_REGISTRY]
    return len(known) < len(sources) or any(cls.needs_path for cls in known)


def resolve_dataset_names(cfg, split: str) -> None:
    """Fill DATA_PATHS (empty, or only "") and, where empty, DATA_SOURCES and LABEL_PATHS of
    ``split`` in place from the catalog; nothing when ``needs_catalog`` is false. ConfigError
    for a name the catalog lacks, naming the catalog file and the names it has."""
    if not needs_catalog(cfg, split):
        return
    data = cfg.DATA[split]
    names = list(data.DATASET_NAMES)
    sources = list(data.DATA_SOURCES)
    if sources and len(sources) != len(names):
        raise ConfigError(f"config.DATA.{split}.DATASET_NAMES has {len(names)} entries but "
                          f"config.DATA.{split}.DATA_SOURCES has {len(sources)}: give one name "
                          "per source")
    path, origin = catalog_path(cfg)
    if path is None:
        raise ConfigError(
            f"config.DATA.{split}.DATASET_NAMES={names} with empty config.DATA.{split}.DATA_PATHS "
            "needs a dataset catalog: set config.DATA.DATASET_CATALOG_PATH (or the environment "
            f"variable {ENV_VARS[0]}), or give config.DATA.{split}.DATA_PATHS")
    catalog = load_catalog(path, origin)
    catalog_split = CATALOG_SPLITS[split]
    data_paths, label_paths, inferred = [], [], []
    for index, name in enumerate(names):
        key = f"config.DATA.{split}.DATASET_NAMES[{index}]={name!r}"
        if name not in catalog:
            raise ConfigError(f"{key} is not in the dataset catalog {path}, which has: "
                              f"{', '.join(sorted(catalog)) or '(no datasets)'}")
        entry = catalog[name].get(catalog_split)
        if not isinstance(entry, (list, tuple)) or not entry or not isinstance(entry[0], str):
            raise ConfigError(f"{key}: the catalog {path} has no \"{catalog_split}\" entry "
                              "[data path, labels path] for it")
        data_paths.append(entry[0])
        labels = entry[1] if len(entry) > 1 and isinstance(entry[1], str) else ""
        label_paths.append(labels if labels and os.path.isfile(labels) else "")
        inferred.append(_infer_source(name, entry[0]))
    data.DATA_PATHS = data_paths
    if not sources:
        data.DATA_SOURCES = inferred
    if not data.LABEL_PATHS and any(label_paths):
        data.LABEL_PATHS = label_paths
