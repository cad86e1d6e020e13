#!/usr/bin/env python
"""Linear SVMs on extracted features (VISSL's SVM benchmark, e.g. VOC07 mean AP).

    python tools/train_svm.py config=feature_extraction/extract_resnet_digits \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> [config.SVM.costs.costs_list=[0.1,1] ...]

(or any config whose model extracts features, e.g. VISSL's
benchmark/linear_image_classification/voc07/eval_resnet_8gpu_transfer_voc07_svm.)

For every extracted layer (only NEAREST_NEIGHBOR.FEATURES_LAYER when it is set), one linear SVM
per class (SVM.cls_list, empty: all) and per cost is trained on the TRAIN features, the cost
chosen by SVM.cross_val_folds-fold cross-validation, and the chosen SVMs are tested on the TEST
features: AP per class and mean AP, plus top-1 accuracy for single-label targets.

Features come from SVM_FEATURES_PATH when it is set (a folder of an earlier extraction, used
as it is); otherwise from the extraction folder, where the extract_features engine runs first
when they are missing or stale. Models go to CHECKPOINT.DIR/svm/<layer>/ (.npz arrays; reused
unless SVM.force_retrain or the data changed), the results to CHECKPOINT.DIR/svm/results.json
and, as {"svm": ...}, to CHECKPOINT.DIR/metrics.json.
"""
import json
import logging
import math
import sys
from pathlib import Path

from ssl_engine.data.paths import SPLITS
from ssl_engine.engines.evaluate_extracted import (evaluation_layer, extraction_layers,
                                                   get_or_extract, run_tool)
from ssl_engine.evaluation.svm import SVMSettings, check_settings, svm_eval
from ssl_engine.extraction.files import extracted_layers, load_extracted

logger = logging.getLogger("train_svm")


def svm_layers(cfg) -> list:
    """The layers to evaluate: NEAREST_NEIGHBOR.FEATURES_LAYER if set, else every layer the
    model extracts, or every layer with TRAIN and TEST files in SVM_FEATURES_PATH."""
    requested = cfg.NEAREST_NEIGHBOR.FEATURES_LAYER
    if cfg.SVM_FEATURES_PATH:
        folder = Path(cfg.SVM_FEATURES_PATH).expanduser()
        if not folder.is_dir():
            raise NotADirectoryError(f"SVM_FEATURES_PATH {folder} is not a folder")
        if requested:
            return [requested]
        found = extracted_layers(folder, SPLITS)
        if not found:
            raise FileNotFoundError(f"no layer has TRAIN and TEST features in SVM_FEATURES_PATH "
                                    f"{folder} (<split>_<layer>_features/targets/inds.npy)")
        return found
    return [evaluation_layer(cfg, requested)] if requested else extraction_layers(cfg)


def layer_data(cfg, layer: str):
    if cfg.SVM_FEATURES_PATH:
        folder = Path(cfg.SVM_FEATURES_PATH).expanduser()
        logger.info("reading the features of layer %s from %s", layer, folder)
        return {split: load_extracted(folder, split, layer) for split in SPLITS}
    return get_or_extract(cfg, layer)


def _json_safe(value):
    """NaN (an AP of a class without test positive) as null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    return value


def run(cfg):
    settings = SVMSettings.from_config(cfg.SVM)
    check_settings(settings)  # before any extraction
    layers = svm_layers(cfg)
    out_dir = Path(cfg.CHECKPOINT.DIR).expanduser().absolute()
    results = {}
    for layer in layers:
        data = layer_data(cfg, layer)
        train, test = data["TRAIN"], data["TEST"]
        logger.info("SVMs of layer %s", layer)
        result = svm_eval(train.features, train.targets, test.features, test.targets,
                          settings, classes=list(cfg.SVM.cls_list),
                          model_dir=out_dir / "svm" / layer,
                          force_retrain=bool(cfg.SVM.force_retrain))
        results[layer] = result
        summary = f"SVM {layer}: mAP {result['mAP']:.2f}"
        if "top1" in result:
            summary += f", top-1 {result['top1']:.2f}%"
        print(summary + f" ({len(result['classes'])} classes)")
        for cls, cost, ap in zip(result["classes"], result["chosen_cost"], result["test_ap"]):
            print(f"  class {cls:>4}  cost {cost:<8g}  AP {100.0 * ap:.2f}")
    record = _json_safe({"svm": {
        "settings": {**settings._asdict(), "costs": list(settings.costs)},
        "features": str(cfg.SVM_FEATURES_PATH or ""),
        "layers": results,
    }})
    path = out_dir / "svm" / "results.json"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)
    logger.info("SVM results written to %s", path)
    return out_dir, record


def main(argv) -> int:
    return run_tool(argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
