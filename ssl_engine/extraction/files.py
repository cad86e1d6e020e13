"""Extracted feature files: where they are, whether they are complete and current, and loading
them. Written by the extraction (``write_splits.py``); read by the evaluation tools
(``ssl_engine.engines.evaluate_extracted``, ``tools/train_svm.py``), which run the
``extract_features`` engine first when files are missing or stale.

This is the extraction's output format, so it lives here rather than in
``ssl_engine.evaluation``: whether files are current is judged against the extraction's own
record of what it read (``extraction_signature``, which applies the one-view rewrite of
``one_view.py``), and no module of ``ssl_engine.evaluation`` reads files: k-NN, SVM and
low-shot compute on the arrays they are given.

A split and layer has three files in the extraction folder (``EXTRACT_FEATURES.OUTPUT_DIR``,
or ``CHECKPOINT.DIR`` when empty): ``<split>_<layer>_features.npy`` (float32, N x D),
``<split>_<layer>_targets.npy`` and ``<split>_<layer>_inds.npy`` (int64, N), row i holding
dataset index i.  The engine only ever gives these names to complete files.  The index of a
split, ``<split>_extraction.json``, records what its files were extracted from and lists them:
an extraction of a split leaves the files of its layers only (those of other layers, from an
earlier extraction into the folder, are removed).
"""
import json
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence

import numpy as np

from ssl_engine.extraction.one_view import extraction_config

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


def split_files(folder, split: str, layers: Sequence[str]) -> List[Path]:
    """The files of ``split`` and ``layers`` (each once, in layer order)."""
    return list(dict.fromkeys(path for layer in layers
                              for path in extracted_paths(folder, split, layer).values()))


def write_index(folder, cfg, split: str, layers: Sequence[str], num_samples: int) -> None:
    """Write the index of ``split`` (after its files): what they were extracted from (see
    ``extraction_signature``), their ``layers``, ``samples`` (rows per file) and ``files``."""
    record = {**extraction_signature(cfg, split), "layers": list(layers),
              "samples": int(num_samples),
              "files": [path.name for path in split_files(folder, split, layers)]}
    path = signature_path(folder, split)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)


def layers_in(folder, split: str) -> List[str]:
    """The layers (sorted) of which ``folder`` holds a features file of ``split``."""
    prefix, suffix = f"{split.lower()}_", "_features.npy"
    names = [path.name for path in Path(folder).glob(f"{prefix}*{suffix}")]
    return sorted(name[len(prefix):-len(suffix)] for name in names)


def stale_files(folder, split: str, layers: Sequence[str]) -> List[Path]:
    """The files of ``split`` in ``folder`` of layers other than ``layers``: what an earlier
    extraction of the split into the folder left (a layer is known by its features file;
    other files, label predictions included, are not the extraction's)."""
    others = [layer for layer in layers_in(folder, split) if layer not in layers]
    return [path for path in split_files(folder, split, others) if path.is_file()]


def has_extracted(folder, split: str, layer: str, cfg=None) -> bool:
    """All three files of ``split`` and ``layer`` exist and, when ``cfg`` is given, the index
    of the split lists the layer and says it was extracted with the same model, weights, data
    settings and seed as ``cfg`` asks for."""
    if not all(path.is_file() for path in extracted_paths(folder, split, layer).values()):
        return False
    if cfg is None:
        return True
    try:
        recorded = json.loads(signature_path(folder, split).read_text())
    except (OSError, ValueError):
        return False
    signature = extraction_signature(cfg, split)
    return (isinstance(recorded, dict) and layer in recorded.get("layers", ())
            and {key: recorded.get(key) for key in signature} == signature)


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
    return [layer for layer in layers_in(folder, splits[0])
            if all(has_extracted(folder, split, layer) for split in splits)]
