"""Label predictions of a classification model, streamed to disk as the features are
(``write_splits.py``: every rank writes its rows, rank 0 places them by dataset index; any number of
processes). Called by ``extractor.FeatureExtractor.extract_label_predictions``; its config check
by the ``extract_label_predictions`` engine before launch.

For every split of EXTRACT_FEATURES.SPLITS and every output of the heads, into
EXTRACT_FEATURES.OUTPUT_DIR (or CHECKPOINT.DIR):

- ``<split>_<output>_predictions.npy``: int64 [N, k], the k best classes of each image, best
  first (k: the largest of METERS.accuracy_list_meter.topk_values);
- ``<split>_<output>_conf_scores.npy``: float32 [N, C], the softmax of the output;
- ``<split>_<output>_targets.npy``: int64 [N], the labels;
- ``<split>_<output>_inds.npy``: int64 [N], the dataset index of each row (row i is index i).

``<output>`` is the evaluated stage of the head with LINEAR_EVAL_FEAT_POOL_OPS_MAP (one head
per stage), else ``heads`` (one output) or ``heads0``, ``heads1``, ... The top-k accuracy of
every output over each split is logged (the labels >= 0 only).
"""
import logging
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

from ssl_engine.extraction.write_splits import extract_features
from ssl_engine.utils.distributed import get_rank

logger = logging.getLogger(__name__)

KINDS = ("predictions", "conf_scores")
METER = "accuracy_list_meter"  # the meter whose topk_values give k


def prediction_paths(folder, split: str, layer: str) -> Dict[str, Path]:
    """The files of one written "layer" ``<output>:<kind>`` (kind: predictions or
    conf_scores); the two kinds of an output share its targets and inds files."""
    output, kind = layer.rsplit(":", 1)
    stem = f"{split.lower()}_{output}"
    return {"features": Path(folder) / f"{stem}_{kind}.npy",
            "targets": Path(folder) / f"{stem}_targets.npy",
            "inds": Path(folder) / f"{stem}_inds.npy"}


def prediction_names(model) -> List[str]:
    """The names of the model's outputs, in the order of ``model(x)``."""
    settings = model.eval_settings
    if settings.extract_trunk_features_only or not len(model.heads):
        raise ValueError(
            "extract_label_predictions takes the class scores of the heads: give heads "
            "(config.MODEL.HEAD.PARAMS) and set "
            "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=false")
    if settings.heads_per_stage:
        return list(settings.stages)
    return list(model.extract_layer_names())


def top_k(cfg) -> int:
    """k: the largest of METERS.accuracy_list_meter.topk_values."""
    values = (cfg.METERS.get(METER) or {}).get("topk_values") or [1]
    return max(int(value) for value in values)


def check_prediction_config(cfg) -> None:
    """Heads to predict with, and no meter other than accuracy_list_meter (whose topk_values
    give the number of classes saved per image)."""
    if not cfg.MODEL.HEAD.PARAMS:
        raise ValueError("engine_name=extract_label_predictions needs heads that give class "
                         "scores: config.MODEL.HEAD.PARAMS is empty")
    if cfg.MODEL.FEATURE_EVAL_SETTINGS.get("EXTRACT_TRUNK_FEATURES_ONLY", False):
        raise ValueError("engine_name=extract_label_predictions saves the predictions of the "
                         "heads: set config.MODEL.FEATURE_EVAL_SETTINGS."
                         "EXTRACT_TRUNK_FEATURES_ONLY=false (extract_features saves trunk "
                         "features)")
    names = [name for name in [cfg.METERS.get("name"), *(cfg.METERS.get("names") or [])]
             if name]
    others = sorted({name for name in names if name != METER})
    if others:
        raise ValueError(f"config.METERS names {others}: extract_label_predictions predicts with "
                         f"{METER} only (its topk_values give the classes saved per image); "
                         f"set config.METERS.names=[{METER}]")
    if top_k(cfg) < 1:
        raise ValueError(f"config.METERS.{METER}.topk_values must be >= 1, got "
                         f"{list(cfg.METERS[METER].topk_values)}")


def _log_accuracy(folder: Path, split: str, outputs: List[str], k: int) -> None:
    for output in outputs:
        paths = prediction_paths(folder, split, f"{output}:predictions")
        predictions, targets = np.load(paths["features"]), np.load(paths["targets"])
        labelled = targets >= 0
        if not labelled.any():
            continue
        hits = predictions[labelled] == targets[labelled, None]
        accuracy = {f"top_{j}": round(100.0 * float(hits[:, :j].any(1).mean()), 4)
                    for j in sorted({1, k})}
        logger.info("%s %s: accuracy %s over %d labelled images", split.lower(), output,
                    accuracy, int(labelled.sum()))


def extract_label_predictions(model: torch.nn.Module, datasets: Dict[str, object], cfg,
                              device: torch.device, folder: Path) -> Dict[str, Dict]:
    """Write the files above for every dataset (split -> dataset); return
    {split: {output: {"predictions" | "conf_scores" | "targets" | "inds": path}}}."""
    outputs = prediction_names(model)
    k = top_k(cfg)

    def predict(inputs) -> Dict[str, torch.Tensor]:
        scores = model(inputs)
        if len(scores) != len(outputs):
            raise ValueError(f"the model gives {len(scores)} outputs for the {len(outputs)} "
                             f"named {outputs}")
        rows = {}
        for output, score in zip(outputs, scores):
            score = score.float().flatten(1)
            if score.shape[1] < k:
                raise ValueError(
                    f"output {output} scores {score.shape[1]} classes, fewer than the top "
                    f"{k} asked by config.METERS.{METER}.topk_values; lower them")
            rows[f"{output}:predictions"] = score.topk(k, dim=1, sorted=True).indices
            rows[f"{output}:conf_scores"] = score.softmax(dim=1)
        return rows

    layers = [f"{output}:{kind}" for output in outputs for kind in KINDS]
    written = extract_features(model, datasets, cfg, device, folder, layers=layers,
                               features_fn=predict, paths=prediction_paths, index=False)
    result = {}
    for split, per_layer in written.items():
        result[split] = {}
        for output in outputs:
            files = per_layer[f"{output}:predictions"]
            result[split][output] = {
                "predictions": files["features"],
                "conf_scores": per_layer[f"{output}:conf_scores"]["features"],
                "targets": files["targets"], "inds": files["inds"]}
        if get_rank() == 0:
            _log_accuracy(folder, split, outputs, k)
    return result
