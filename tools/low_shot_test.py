#!/usr/bin/env python
"""Low-shot accuracy of extracted features, in one of two ways chosen by the config.

VISSL's low-shot benchmark (a config whose TRAIN split is limited, ``DATA.TRAIN.DATA_LIMIT``
> 0, such as VISSL's benchmark/low_shot_transfer/*/logistic_regression_* files)::

    python tools/low_shot_test.py config=benchmark/low_shot_transfer/imagenet/logistic_regression_in1k \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint>

For each seed of LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.SEEDS the TRAIN split is drawn with
DATA_LIMIT_SAMPLING.SEED = seed (DATA_LIMIT images, per class with IS_BALANCED), the features
of both splits are extracted into CHECKPOINT.DIR/seed<seed>, and a logistic regression is fitted
on the train features of every extracted layer for each LAMBDA (a number or a list; the best
test top-1 over lambdas is reported), as VISSL did; then mean and std over the seeds.
LOW_SHOT_BENCHMARK.FEATURES.PATH names a folder of features already extracted instead (one
result, no extraction).

The engine's own low-shot k-NN (any other config): a k-NN on LOW_SHOT.SHOTS labelled TRAIN
images per class, mean ± std over LOW_SHOT.SEEDS draws, on every TEST image::

    python tools/low_shot_test.py config=feature_extraction/extract_resnet_digits \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> [config.LOW_SHOT.SHOTS=[1,5,10] ...]

Its layer is NEAREST_NEIGHBOR.FEATURES_LAYER (default: the first extracted one). Features
already extracted are reused; otherwise the extract_features engine runs first. The result is
printed and appended to metrics.json as {"low_shot": ...} (k-NN) or
{"low_shot_benchmark": ...} (logistic regression).
"""
import copy
import sys
from pathlib import Path

import numpy as np

from ssl_engine.engines.evaluate_extracted import (evaluation_layer, extraction_layers,
                                                   get_or_extract, run_tool)
from ssl_engine.evaluation.low_shot import logistic_regression_eval, low_shot_eval
from ssl_engine.extraction.files import extraction_dir, load_extracted


def evaluate(cfg, layer, data):
    settings = cfg.LOW_SHOT
    train, test = data["TRAIN"], data["TEST"]
    results = low_shot_eval(train.features, train.targets, test.features, test.targets,
                            shots=settings.SHOTS, seeds=settings.SEEDS, k=settings.K)
    print(f"low-shot ({layer}, k={settings.K}, {len(settings.SEEDS)} seeds):")
    for shot, stats in results.items():
        print(f"  {shot:>4}-shot top-1 {stats['mean']:.2f} ± {stats['std']:.2f} %")
    return {"low_shot": {"layer": layer, "k": settings.K, "seeds": list(settings.SEEDS),
                         "shots": {str(shot): stats for shot, stats in results.items()}}}


def _lambdas(settings):
    value = settings.LOGISTIC_REGRESSION.LAMBDA
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]


def _regress_layers(cfg, layers, load, seed_name: str):
    out = {}
    for layer in layers:
        data = load(layer)
        out[layer] = logistic_regression_eval(data["TRAIN"].features, data["TRAIN"].targets,
                                              data["TEST"].features, data["TEST"].targets,
                                              _lambdas(cfg.LOW_SHOT_BENCHMARK))
        print(f"low-shot logistic regression ({layer}, {seed_name}): " + ", ".join(
            f"lambda {r['lambda']:g}: top-1 {r['top1']:.2f}%" for r in out[layer]["per_lambda"]))
    return out


def vissl_low_shot(cfg):
    """VISSL's LOW_SHOT_BENCHMARK protocol; (folder of metrics.json, record)."""
    settings = cfg.LOW_SHOT_BENCHMARK
    layers = extraction_layers(cfg)
    if settings.FEATURES.PATH:
        folder = Path(settings.FEATURES.PATH)
        per_layer = _regress_layers(cfg, layers, lambda layer: {
            split: load_extracted(folder, split, layer) for split in ("TRAIN", "TEST")},
            "given features")
        return extraction_dir(cfg), {"low_shot_benchmark": {"features": str(folder),
                                                            "layers": per_layer}}
    folder = extraction_dir(cfg)
    seeds = [int(seed) for seed in settings.LOGISTIC_REGRESSION.SEEDS]
    runs = []
    for seed in seeds:
        seed_cfg = copy.deepcopy(cfg)
        seed_cfg.DATA.TRAIN.DATA_LIMIT_SAMPLING.SEED = seed
        seed_cfg.CHECKPOINT.DIR = str(folder / f"seed{seed}")
        seed_cfg.EXTRACT_FEATURES.OUTPUT_DIR = ""
        runs.append(_regress_layers(seed_cfg, layers,
                                    lambda layer: get_or_extract(seed_cfg, layer), f"seed {seed}"))
    summary = {}
    for layer in layers:
        top1 = [run[layer]["top1"] for run in runs]
        summary[layer] = {"per_seed": top1, "mean": float(np.mean(top1)),
                          "std": float(np.std(top1)), "runs": [run[layer] for run in runs]}
        print(f"low-shot logistic regression ({layer}, {len(seeds)} seeds): top-1 "
              f"{summary[layer]['mean']:.2f} ± {summary[layer]['std']:.2f} %")
    return folder, {"low_shot_benchmark": {"seeds": seeds, "data_limit": cfg.DATA.TRAIN.DATA_LIMIT,
                                           "layers": summary}}


def run(cfg):
    """VISSL's benchmark where the TRAIN split is limited, else the k-NN on LOW_SHOT.SHOTS."""
    if cfg.DATA.TRAIN.DATA_LIMIT > 0:
        return vissl_low_shot(cfg)
    layer = evaluation_layer(cfg, cfg.NEAREST_NEIGHBOR.FEATURES_LAYER)
    return extraction_dir(cfg), evaluate(cfg, layer, get_or_extract(cfg, layer))


def main(argv) -> int:
    return run_tool(argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
