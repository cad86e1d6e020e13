"""The ``extract_label_predictions`` engine: the class predictions of a frozen model's heads
(top-k classes, softmax scores), with targets and dataset indices, as numpy per split and
output (ssl_engine/extraction/label_predictions.py)."""
from typing import Callable, List, Optional

from ssl_engine.engines.extract_features import check_extract_config
from ssl_engine.engines.registry import register_engine
from ssl_engine.extraction.extractor import FeatureExtractor
from ssl_engine.extraction.label_predictions import check_prediction_config
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.trainer.process import machine_ranks
from ssl_engine.utils.logger import setup_logging


def check_label_predictions_config(cfg) -> None:
    """Heads and meters fit (label_predictions.check_prediction_config), then what
    extract_features checks: splits, data, output folder, weights file."""
    check_prediction_config(cfg)
    check_extract_config(cfg)


@register_engine("extract_label_predictions", check_before_launch=check_label_predictions_config)
def extract_label_predictions_main(cfg, dist_run_id: str, checkpoint_path: Optional[str] = None,
                                   checkpoint_folder: Optional[str] = None,
                                   hook_generator: Callable[..., List] = default_hook_generator
                                   ) -> None:
    """Write ``<split>_<output>_{predictions,conf_scores,targets,inds}.npy`` into
    EXTRACT_FEATURES.OUTPUT_DIR (or CHECKPOINT.DIR). The weights come from
    MODEL.WEIGHTS_INIT; hooks are not run."""
    _, rank, _ = machine_ranks()
    setup_logging(checkpoint_folder or cfg.CHECKPOINT.DIR, rank)
    FeatureExtractor(cfg, dist_run_id, checkpoint_folder).extract_label_predictions()
