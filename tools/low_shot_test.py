#!/usr/bin/env python
"""Low-shot accuracy of extracted features: a k-NN on SHOTS labelled TRAIN images per class,
mean ± std over SEEDS draws, on every TEST image.

    python tools/low_shot_test.py config=feature_extraction/extract_resnet_digits \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> [config.LOW_SHOT.SHOTS=[1,5,10] ...]

The layer is NEAREST_NEIGHBOR.FEATURES_LAYER (default: the first extracted one). Features
already extracted are reused; otherwise the extract_features engine runs first. The result is
printed and appended to metrics.json as {"low_shot": ...}.
"""
import sys

from ssl_engine.engines.evaluate_extracted import run_evaluation_tool
from ssl_engine.evaluation.low_shot import low_shot_eval


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


def main(argv) -> int:
    return run_evaluation_tool(argv, evaluate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
