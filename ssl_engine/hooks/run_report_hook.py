"""The run report (HOOKS.RUN_REPORT): the composed config saved at the start, report.png and
report.html written into CHECKPOINT.DIR at the end of training (ssl_engine/report)."""
import logging
from pathlib import Path

import yaml

from ssl_engine.config import ConfigError
from ssl_engine.hooks.base import SSLHook
from ssl_engine.models.fsdp_names import FSDP_TASK
from ssl_engine.report import CONFIG_NAME, feature_map, has_test_split, write_report
from ssl_engine.utils.distributed import is_primary

logger = logging.getLogger(__name__)


def save_config(cfg, folder) -> Path:
    """The composed config as ``folder/config.yaml`` (what tools/report.py reads back)."""
    path = Path(folder) / CONFIG_NAME
    path.write_text(yaml.safe_dump({"config": cfg.to_dict()}, sort_keys=False))
    return path


class RunReportHook(SSLHook):
    """On ``on_start`` rank 0 saves the composed config; on ``on_end`` it writes the report:
    the curves of metrics.json and, where the config has a TEST split and the trunk trains
    unsharded (not MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON, not the FSDP task), the 2-D map
    of at most MAX_SAMPLES of its images' features at trunk stage LAYER (FEATURE_REPORT.LAYER
    when empty) beside their raw pixels'. No collective: the other ranks do nothing."""

    def __init__(self, cfg):
        super().__init__()
        settings = cfg.HOOKS.RUN_REPORT
        if int(settings.MAX_SAMPLES) < 0:
            raise ConfigError("config.HOOKS.RUN_REPORT.MAX_SAMPLES must be 0 (no map) or more; "
                              f"got {settings.MAX_SAMPLES}")
        self.cfg = cfg
        self.max_samples = int(settings.MAX_SAMPLES)
        self.layer = settings.LAYER or cfg.HOOKS.FEATURE_REPORT.LAYER

    def on_start(self, task) -> None:
        if is_primary():
            save_config(self.cfg, task.checkpoint_folder)

    def on_end(self, task) -> None:
        if not is_primary():
            return
        points = None
        frozen_trunk = self.cfg.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON  # nothing new to map
        # a sharded trunk's forward is a collective: rank 0 alone cannot run it
        sharded = self.cfg.TRAINER.TASK_NAME == FSDP_TASK
        if self.max_samples and has_test_split(self.cfg) and not frozen_trunk and not sharded:
            try:
                points = feature_map(self.cfg, task.base_model, self.layer, task.device,
                                     self.max_samples)
            # a trunk without LAYER, data that cannot be read: the curves are still drawn
            except (RuntimeError, ValueError, KeyError, IndexError, AssertionError) as error:
                logger.warning("run report: no feature map (%s: %s)", type(error).__name__,
                               error)
        png, html = write_report(task.checkpoint_folder, points)
        logger.info("run report: %s and %s", png, html)
