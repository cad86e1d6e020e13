"""Evaluation of extracted features from the command line (``tools/nearest_neighbor_test.py``,
``tools/low_shot_test.py``, ``tools/train_svm.py``):
the features are read from the extraction folder, and the
``extract_features`` engine runs first when they are missing or stale.
"""
import logging
import sys
from pathlib import Path
from typing import Callable, Dict, Sequence, Tuple

from ssl_engine.config import ConfigError, load_config
from ssl_engine.data.paths import SPLITS
from ssl_engine.engines.launcher import launch_distributed
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.engines.plugins import import_plugins
from ssl_engine.extraction.errors import ExtractionError
from ssl_engine.extraction.files import (ExtractedFeatures, extraction_dir, has_extracted,
                                         load_extracted)
from ssl_engine.hooks.metrics_writers import JsonWriter
from ssl_engine.models import build_model
from ssl_engine.checkpoint import CheckpointError
from ssl_engine.utils.logger import setup_logging
from ssl_engine.utils.metrics_store import MetricsStore
from ssl_engine.utils.registry import UnknownNameError
from ssl_engine.utils.run_lock import RunLockError

logger = logging.getLogger(__name__)


def extraction_layers(cfg) -> list:
    """The layer names the extraction of ``cfg`` writes (those of the model it builds)."""
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
    ``has_extracted``), the ``extract_features`` engine runs first (in this process or the
    processes ``DISTRIBUTED.NUM_PROC_PER_NODE`` asks for)."""
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
    def run(cfg):
        layer = evaluation_layer(cfg, cfg.NEAREST_NEIGHBOR.FEATURES_LAYER)
        data = get_or_extract(cfg, layer)
        return extraction_dir(cfg), evaluate(cfg, layer, data)

    return run_tool(argv, run)


def run_tool(argv: Sequence[str], run: Callable[[object], Tuple[Path, Dict[str, object]]],
             load: Callable = load_config) -> int:
    """Compose the config of ``argv`` (``config=<group>/<name> [config.A.B=v ...]``) with
    ``load`` (default: ``load_config``), call ``run(cfg)``, which returns ``(folder, record)``,
    and write ``record`` through a metrics store to ``folder/metrics.json``. A configuration, data or checkpoint error
    is printed as one line and gives exit status 2; success gives 0."""
    setup_logging(None)
    try:
        import_plugins()
        _, cfg = load(list(argv))
        folder, record = run(cfg)
    except (CheckpointError, ConfigError, ExtractionError, FileNotFoundError,
            NotADirectoryError, RunLockError, UnknownNameError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    Path(folder).mkdir(parents=True, exist_ok=True)
    store = MetricsStore()  # values of this process alone: not reduced
    store.add_writer(JsonWriter(str(folder)))
    store.write(record, 0, kind="evaluation")
    store.close()
    return 0
