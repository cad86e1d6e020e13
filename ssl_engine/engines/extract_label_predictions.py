"""The ``extract_label_predictions`` engine: the class predictions of a frozen model's heads
(top-k classes, softmax scores), with targets and dataset indices, as numpy per split and
output (ssl_engine/extraction/label_predictions.py)."""
from ssl_engine.engines.extract_features import check_extract_config, extraction_engine
from ssl_engine.engines.registry import register_engine
from ssl_engine.extraction.label_predictions import check_prediction_config


def check_label_predictions_config(cfg) -> None:
    """Heads and meters fit (label_predictions.check_prediction_config), then what
    extract_features checks: splits, data, output folder, weights file."""
    check_prediction_config(cfg)
    check_extract_config(cfg)


extract_label_predictions_main = register_engine(
    "extract_label_predictions", check_before_launch=check_label_predictions_config)(
        extraction_engine("extract_label_predictions",
                          "``<split>_<output>_{predictions,conf_scores,targets,inds}.npy``"))
