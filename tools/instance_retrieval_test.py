#!/usr/bin/env python
"""VISSL's instance-retrieval benchmark (IMG_RETRIEVAL): Revisited Oxford / Paris (easy, medium,
hard mAP and mP@k) and Copydays (mAP per query split).

    python tools/instance_retrieval_test.py \
        config=benchmark/instance_retrieval/eval_resnet_1gpu_roxford \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \
        config.IMG_RETRIEVAL.DATASET_PATH=/data/revisitop/datasets

The images are read from IMG_RETRIEVAL.DATASET_PATH/<TRAIN_DATASET_NAME> (the whitening) and
/<EVAL_DATASET_NAME> (the database and queries); see ssl_engine/evaluation/retrieval_data.py for
the layouts and ssl_engine/evaluation/retrieval.py for the descriptors. The scores are printed
and appended to CHECKPOINT.DIR/metrics.json as {"instance_retrieval": ...}; with
SAVE_RETRIEVAL_RANKINGS_SCORES the rankings ([Q, N] database indices, best first) and the
similarities are saved as retrieval_rankings.npy and retrieval_similarity_scores.npy, with
SAVE_FEATURES the descriptors as retrieval_{database,query}_features.npy.
"""
import sys

from ssl_engine.config import compose_config
from ssl_engine.engines.evaluate_extracted import run_tool
from ssl_engine.engines.instance_retrieval import check_retrieval_config, run_retrieval


def load(argv):
    engine_name, cfg = compose_config(argv)
    return engine_name, check_retrieval_config(cfg)


def main(argv) -> int:
    return run_tool(argv, run_retrieval, load=load)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
