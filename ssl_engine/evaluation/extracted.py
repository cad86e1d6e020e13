"""Extracted feature files: where they are, whether they are complete, loading them, and
running the ``extract_features`` engine when they are missing.

A split and layer has three files in the extraction folder (``EXTRACT_FEATURES.OUTPUT_DIR``,
or ``CHECKPOINT.DIR`` when empty): ``<split>_<layer>_features.npy`` (float32, N x D),
``<split>_<layer>_targets.npy`` and ``<split>_<layer>_inds.npy`` (int64, N), row i holding
dataset index i.  The engine only ever gives these names to complete files.
"""
import json
import logging
import sys
from pathlib import Path
from typing import Callable, Dict, NamedTuple, Sequence

import numpy as np

from ssl_engine.data.paths import SPLITS

logger = logging.getLogger(__name__)

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
    weights = cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE
    weights_id = None
    if weights:
        stat = Path(weights).stat()
        weights_id = {"path": str(Path(weights).resolve()), "size": stat.st_size,
                      "mtime_ns": stat.st_mtime_ns}
    data_keys = ("DATA_SOURCES", "DATA_PATHS", "LABEL_PATHS", "LABEL_TYPE", "TRANSFORMS",
                 "DATA_LIMIT", "DATA_LIMIT_SAMPLING", "DATASET_NAMES", "SYNTHETIC")
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


def extraction_layers(cfg) -> list:
    """The layer names the extraction of ``cfg`` writes (those of the model it builds)."""
    from ssl_engine.models import build_model

    return list(build_model(cfg.MODEL).extract_layer_names())


def evaluation_layer(cfg, requested: str = "") -> str:
    """``requested`` if given (it must be one the model extracts), else the first layer."""
    layers = extraction_layers(cfg)
    if not requested:
        return layers[0]
    if requested not in layers:
        raise ValueError(f"layer '{requested}' is not extracted by this config; its layers "
                         f"are: {', '.join(layers)}")
    return requested


def get_or_extract(cfg, layer: str, splits: Sequence[str] = SPLITS) -> Dict[str, ExtractedFeatures]:
    """The features of ``layer`` for ``splits``, loaded from the extraction folder; when any is
    missing or was extracted from other weights, model or data settings (see
    ``has_extracted``), the ``extract_features`` engine runs first (in this process or the processes
    ``DISTRIBUTED.NUM_PROC_PER_NODE`` asks for)."""
    from ssl_engine.engines.launcher import check_before_launch, launch_distributed

    folder = extraction_dir(cfg)
    missing = [split for split in splits if not has_extracted(folder, split, layer, cfg)]
    if missing:
        logger.info("extracting features of %s into %s", ", ".join(missing), folder)
        cfg.EXTRACT_FEATURES.SPLITS = list(missing)
        check_before_launch("extract_features", cfg)
        launch_distributed(cfg, "extract_features")
    else:
        logger.info("reusing the extracted features of layer %s in %s", layer, folder)
    return {split: load_extracted(folder, split, layer) for split in splits}


Evaluation = Callable[[object, str, Dict[str, ExtractedFeatures]], Dict[str, object]]


def run_evaluation_tool(argv: Sequence[str], evaluate: Evaluation) -> int:
    """The command line of the evaluation tools: ``config=<group>/<name> [config.A.B=v ...]``.

    Gets (or extracts) the TRAIN and TEST features of NEAREST_NEIGHBOR.FEATURES_LAYER (default:
    the first extracted layer), calls ``evaluate(cfg, layer, {split: features})`` and appends the
    record it returns to ``metrics.json`` in the extraction folder. Returns the exit status."""
    from ssl_engine.config import ConfigError, load_config
    from ssl_engine.engines.launcher import import_plugins
    from ssl_engine.hooks.log_hooks import append_metrics
    from ssl_engine.trainer.feature_extraction import ExtractionError
    from ssl_engine.utils.checkpoint import CheckpointError
    from ssl_engine.utils.logger import setup_logging
    from ssl_engine.utils.registry import UnknownNameError
    from ssl_engine.utils.run_lock import RunLockError

    setup_logging(None)
    try:
        import_plugins()
        _, cfg = load_config(list(argv))
        layer = evaluation_layer(cfg, cfg.NEAREST_NEIGHBOR.FEATURES_LAYER)
        data = get_or_extract(cfg, layer)
        record = evaluate(cfg, layer, data)
    except (CheckpointError, ConfigError, ExtractionError, FileNotFoundError,
            NotADirectoryError, RunLockError, UnknownNameError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    append_metrics(str(extraction_dir(cfg)), record)
    return 0
