#!/usr/bin/env python
"""Weighted k-NN top-1/top-5 of extracted features (TEST queries, TRAIN as the memory bank).

    python tools/nearest_neighbor_test.py config=feature_extraction/extract_resnet_digits \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> [config.NEAREST_NEIGHBOR.TOPK=20 ...]

Features already extracted in the output folder are reused; otherwise the extract_features
engine runs first. The result is printed and appended to metrics.json as {"knn": ...}.
"""
import sys

from ssl_engine.engines.evaluate_extracted import run_evaluation_tool
from ssl_engine.evaluation.knn import knn_classify


def evaluate(cfg, layer, data):
    settings = cfg.NEAREST_NEIGHBOR
    train, test = data["TRAIN"], data["TEST"]
    accuracy = knn_classify(train.features, train.targets, test.features, test.targets,
                            topk=settings.TOPK, sigma=settings.SIGMA,
                            chunk_size=settings.CHUNK_SIZE,
                            device="cuda" if settings.USE_CUDA else "cpu")
    print(f"k-NN ({layer}, k={settings.TOPK}, sigma={settings.SIGMA}): "
          f"top-1 {accuracy['top1']:.2f}%  top-5 {accuracy['top5']:.2f}%")
    return {"knn": {"layer": layer, "topk": settings.TOPK, "sigma": settings.SIGMA, **accuracy}}


def main(argv) -> int:
    return run_evaluation_tool(argv, evaluate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
