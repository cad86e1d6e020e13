"""At the end of training, how good the learned features are beside a randomly initialised
network and raw pixels (HOOKS.FEATURE_REPORT)."""
import logging

import torch

from ssl_engine.data.seeding import seeded_rngs
from ssl_engine.evaluation.knn import knn_classify
from ssl_engine.evaluation.labelled_features import EvalSplits, evaluation_mode
from ssl_engine.evaluation.low_shot import low_shot_eval
from ssl_engine.evaluation.feature_report import feature_report_table
from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.knn_hook import check_labelled_splits, knn_device, knn_settings
from ssl_engine.models import build_model

logger = logging.getLogger(__name__)


def random_init_model(cfg, device: torch.device) -> torch.nn.Module:
    """``build_model(cfg.MODEL)`` initialised from SEED_VALUE, the same on every rank; the
    caller's random generators are left as they were."""
    with seeded_rngs(int(cfg.SEED_VALUE)):
        model = build_model(cfg.MODEL)
    return model.to(device)


class FeatureReportHook(SSLHook):
    """On ``on_end``: for the trunk stage HOOKS.FEATURE_REPORT.LAYER of the trained model, of a
    randomly initialised one, and for the raw (TEST-transformed) pixels, the weighted k-NN
    top-1 (NEAREST_NEIGHBOR) and the low-shot accuracy (LOW_SHOT) on the labelled TRAIN/TEST
    splits. Rank 0 logs a table and writes ``{"feature_report": ...}`` to the task's metrics
    store (not reduced: rank 0's)."""

    def __init__(self, cfg):
        super().__init__()
        check_labelled_splits(cfg, "HOOKS.FEATURE_REPORT.ENABLED")
        self.cfg = cfg
        self.layer = cfg.HOOKS.FEATURE_REPORT.LAYER

    def on_end(self, task) -> None:
        cfg, layer = self.cfg, self.layer
        random_model = random_init_model(cfg, task.device)
        learned = task.base_model

        def features_fn(x):
            return {"learned": learned.trunk(x, out_feat_keys=[layer])[0],
                    "random_init": random_model.trunk(x, out_feat_keys=[layer])[0],
                    "raw_pixels": x}

        with evaluation_mode(learned, random_model):
            data = EvalSplits(cfg).features(features_fn, task.device)
            if data is None:  # not rank 0
                return
            report = {name: self._evaluate(data, name, task.device)
                      for name in ("learned", "random_init", "raw_pixels")}
        shots = [int(shot) for shot in cfg.LOW_SHOT.SHOTS]
        logger.info("feature report, layer %s (kNN k=%d; low-shot %d-NN, mean ± std over %d "
                    "seeds):\n%s", layer, cfg.NEAREST_NEIGHBOR.TOPK, cfg.LOW_SHOT.K,
                    len(cfg.LOW_SHOT.SEEDS), feature_report_table(report, shots))
        task.metrics.write({"feature_report": {
            "layer": layer, "train_phase_idx": task.train_phase_idx, **report}}, task.iteration)

    def _evaluate(self, data, name: str, device: torch.device) -> dict:
        cfg = self.cfg
        train, test = data["TRAIN"], data["TEST"]
        args = (train.features[name], train.targets, test.features[name], test.targets)
        knn = knn_classify(*args, device=knn_device(cfg, device), **knn_settings(cfg))
        low_shot = low_shot_eval(*args, shots=[int(s) for s in cfg.LOW_SHOT.SHOTS],
                                 seeds=[int(s) for s in cfg.LOW_SHOT.SEEDS], k=int(cfg.LOW_SHOT.K))
        return {"knn_top1": knn["top1"], "knn_top5": knn["top5"], "low_shot": low_shot}
