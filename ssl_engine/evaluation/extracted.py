"""Extracted feature files: where they are, whether they are complete, and loading them.
(Running the ``extract_features`` engine when they are missing is
``ssl_engine.engines.evaluate_extracted``'s work: this package builds no model and starts no
process.)

A split and layer has three files in the extraction folder (``EXTRACT_FEATURES.OUTPUT_DIR``,
or ``CHECKPOINT.DIR`` when empty): ``<split>_<layer>_features.npy`` (float32, N x D),
``<split>_<layer>_targets.npy`` and ``<split>_<layer>_inds.npy`` (int64, N), row i holding
dataset index i.  The engine only ever gives these names to complete files.
"""
import json
from pathlib import Path
from typing import Dict, NamedTuple

import numpy as np

from ssl_engine.data.extraction_view import extraction_config

FILE_KINDS = ("features", "targets", "inds")


class ExtractedFeatures(NamedTuple):
    features: np.ndarray
    targets: np.ndarray
    inds: np.ndarray


def extraction_dir(cfg) -> Path:
    """The folder extracted features go to: EXTRACT_FEATURES.OUTPUT_DIR or CHECKPOINT.DIR."""
    return Path(cfg.EXTRACT_FEATURES.OUTPUT_DIR or cfg.CHECKPOINT.DIR).expanduser().absolute()


def extracted_paths(folder, split: str, layer: str) -> Dict[str, Path]:
    """{"features" | "targets" | "inds": path} of ``split`` (any case) and ``layer``."""
    stem = f"{split.lower()}_{layer}"
    return {kind: Path(folder) / f"{stem}_{kind}.npy" for kind in FILE_KINDS}


def signature_path(folder, split: str) -> Path:
    return Path(folder) / f"{split.lower()}_extraction.json"


def extraction_signature(cfg, split: str) -> Dict[str, object]:
    """What the features of ``split`` depend on: the model settings, the weights file (path,
    size, modification time), the split's data settings and the seed."""
    cfg, _ = extraction_config(cfg, [split])  # the settings extraction reads the split with
    weights = cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE
    weights_id = None
    if weights:
        stat = Path(weights).stat()
        weights_id = {"path": str(Path(weights).resolve()), "size": stat.st_size,
                      "mtime_ns": stat.st_mtime_ns}
    data_keys = ("DATA_SOURCES", "DATA_PATHS", "LABEL_PATHS", "LABEL_TYPE", "TRANSFORMS",
                 "COLLATE_FUNCTION", "DATA_LIMIT", "DATA_LIMIT_SAMPLING", "DATASET_NAMES",
                 "SYNTHETIC")
    return json.loads(json.dumps({
        "model": cfg.MODEL.to_dict(),
        "weights": weights_id,
        "data": {key: cfg.DATA[split.upper()][key] for key in data_keys},
        "seed": cfg.SEED_VALUE,
    }))


def write_signature(folder, cfg, split: str) -> None:
    """Record what the files of ``split`` were extracted from (written after them)."""
    path = signature_path(folder, split)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(extraction_signature(cfg, split), indent=1, sort_keys=True))
    tmp.replace(path)


def has_extracted(folder, split: str, layer: str, cfg=None) -> bool:
    """All three files of ``split`` and ``layer`` exist and, when ``cfg`` is given, were
    extracted with the same model, weights, data settings and seed as ``cfg`` asks for."""
    if not all(path.is_file() for path in extracted_paths(folder, split, layer).values()):
        return False
    if cfg is None:
        return True
    try:
        recorded = json.loads(signature_path(folder, split).read_text())
    except (OSError, ValueError):
        return False
    return recorded == extraction_signature(cfg, split)


def load_extracted(folder, split: str, layer: str, mmap: bool = False) -> ExtractedFeatures:
    """The three arrays of ``split`` and ``layer`` (memory-mapped when ``mmap``)."""
    paths = extracted_paths(folder, split, layer)
    missing = [str(path) for path in paths.values() if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"no extracted features: missing {', '.join(missing)}")
    mode = "r" if mmap else None
    return ExtractedFeatures(*(np.load(paths[kind], mmap_mode=mode) for kind in FILE_KINDS))


def extracted_layers(folder, splits) -> list:
    """The layers (sorted) whose three files exist in ``folder`` for every split of ``splits``."""
    suffix = "_features.npy"
    first = str(splits[0]).lower() + "_"
    names = [p.name for p in Path(folder).glob(f"{first}*{suffix}")]
    layers = sorted(name[len(first):-len(suffix)] for name in names)
    return [layer for layer in layers if all(has_extracted(folder, split, layer)
                                             for split in splits)]
