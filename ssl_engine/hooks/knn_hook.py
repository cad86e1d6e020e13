"""k-NN accuracy of the trunk features at the end of every test phase (HOOKS.KNN_EVAL)."""
import logging

import torch

from ssl_engine.evaluation.knn import knn_classify
from ssl_engine.evaluation.labelled_features import EvalSplits, evaluation_mode
from ssl_engine.hooks.base import SSLHook

logger = logging.getLogger(__name__)


def check_labelled_splits(cfg, option: str) -> None:
    """Refuse a config whose TRAIN or TEST split has no data source: ``option`` needs both."""
    for split in ("TRAIN", "TEST"):
        if not cfg.DATA[split].DATA_SOURCES:
            raise ValueError(f"config.{option} needs labelled TRAIN and TEST data: set "
                             f"config.DATA.{split}.DATA_SOURCES")


def knn_device(cfg, device: torch.device) -> torch.device:
    """Where the similarities are computed: the run's GPU when NEAREST_NEIGHBOR.USE_CUDA."""
    use_gpu = cfg.NEAREST_NEIGHBOR.USE_CUDA and device.type == "cuda"
    return device if use_gpu else torch.device("cpu")


def trunk_features_fn(model, layer: str):
    """Maps a batch to ``{layer: trunk stage output}`` of ``model`` (a BaseSSL model)."""
    return lambda x: {layer: model.trunk(x, out_feat_keys=[layer])[0]}


def knn_settings(cfg) -> dict:
    nn_cfg = cfg.NEAREST_NEIGHBOR
    return {"topk": nn_cfg.TOPK, "sigma": nn_cfg.SIGMA, "chunk_size": nn_cfg.CHUNK_SIZE}


class KnnEvalHook(SSLHook):
    """At the end of every test phase: features of the labelled TRAIN and TEST splits (both
    read with the TEST transforms) at trunk stage HOOKS.KNN_EVAL.LAYER, then the weighted k-NN
    of NEAREST_NEIGHBOR on rank 0, logged and written to the task's metrics store as
    ``{"knn": ...}`` (computed on rank 0 alone: not reduced) for metrics.json, TensorBoard and
    the trackers.

    Every rank computes the features of its share and rank 0 gathers them. The model's modes
    and every random generator are restored afterwards, so training is not changed.
    """

    def __init__(self, cfg):
        super().__init__()
        if not cfg.TEST_MODEL:
            raise ValueError("config.HOOKS.KNN_EVAL.USE_KNN_EVAL runs at the end of test phases: "
                             "set config.TEST_MODEL=true")
        check_labelled_splits(cfg, "HOOKS.KNN_EVAL.USE_KNN_EVAL")
        self.cfg = cfg
        self.layer = cfg.HOOKS.KNN_EVAL.LAYER
        self.splits = None

    def on_phase_end(self, task) -> None:
        if task.train:
            return
        model = task.base_model
        with evaluation_mode(model):
            if self.splits is None:
                self.splits = EvalSplits(self.cfg)
            data = self.splits.features(trunk_features_fn(model, self.layer), task.device)
            if data is None:  # not rank 0
                return
            train, test = data["TRAIN"], data["TEST"]
            result = knn_classify(train.features[self.layer], train.targets,
                                  test.features[self.layer], test.targets,
                                  device=knn_device(self.cfg, task.device),
                                  **knn_settings(self.cfg))
        logger.info("kNN top-1 %.2f / top-5 %.2f (layer %s, k=%d, train phase %d)",
                    result["top1"], result["top5"], self.layer, self.cfg.NEAREST_NEIGHBOR.TOPK,
                    task.train_phase_idx)
        task.metrics.write({"knn": {
            "layer": self.layer, "top1": result["top1"], "top5": result["top5"],
            "train_phase_idx": task.train_phase_idx}}, task.iteration)
