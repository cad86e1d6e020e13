"""HOOKS.EMA_MODEL: drives the task's average of the weights (``task.ema_model``, a
``models.ema.ModelEMA``, in the task's checkpointed state) and, with ENABLE_EMA_METERS, runs
the test phases' meters on it too."""
import contextlib
import logging
from typing import Any, Dict, List

import torch

from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.metrics_writers import write_row
from ssl_engine.meters import build_meters
from ssl_engine.utils.device import float32_outputs, to_device
from ssl_engine.utils.distributed import is_primary

logger = logging.getLogger(__name__)


class EmaModelHook(SSLHook):
    """After optimizer update ``k`` (0-based) of ``K``, when ``k`` is a multiple of UPDATE_ITER:
    the average becomes a copy of the weights while ``k / K < WARMUP``, then moves as
    ``ema = DECAY * ema + (1 - DECAY) * weights``.  Both depend only on the weights and on
    ``k``, so a resumed run continues exactly."""

    def __init__(self, update_iter: int, warmup: float, meters_cfg=None,
                 output_dir: str = "."):
        super().__init__()
        self.update_iter = int(update_iter)
        self.warmup = float(warmup)
        self.meters_cfg = meters_cfg  # None: no meters on the average
        self.output_dir = output_dir
        self.meters: List[Any] = []

    @classmethod
    def from_config(cls, cfg) -> "EmaModelHook":
        ema_cfg = cfg.HOOKS.EMA_MODEL
        return cls(ema_cfg.UPDATE_ITER, ema_cfg.WARMUP,
                   cfg.METERS if ema_cfg.ENABLE_EMA_METERS else None, cfg.CHECKPOINT.DIR)

    def on_start(self, task) -> None:
        if self.meters_cfg is not None:
            self.meters = build_meters(self.meters_cfg)

    def on_update(self, task) -> None:
        if task.iteration % self.update_iter:
            return
        if task.where < self.warmup:
            task.ema_model.set(task.base_model)
        else:
            task.ema_model.update(task.base_model)

    # ------------------------------------------------------------------ meters
    def on_phase_start(self, task) -> None:
        if not task.train:
            for meter in self.meters:
                meter.reset()

    @torch.no_grad()
    def on_loss_and_meter(self, task) -> None:
        if task.train or not self.meters:
            return
        ema = task.ema_model
        same_device = ema.device == task.device
        inputs = to_device(task.last_batch["input"], ema.device)
        with task.amp.autocast() if same_device else contextlib.nullcontext():
            output = float32_outputs(ema.module(inputs))
        output = task.meter_output(task.to_device(output))
        for meter in self.meters:
            meter.update(output, task.last_batch["target"])

    def on_phase_end(self, task) -> None:
        if task.train or not self.meters:
            return
        for meter in self.meters:
            meter.sync_state()
        values: Dict[str, Any] = {meter.name: meter.value for meter in self.meters}
        if is_primary():
            logger.info("end of test phase %d with the EMA weights: meters %s",
                        task.phase_idx, values)
            write_row(task, {  # synced meters: the same on every rank, not reduced
                "ema_phase_end": "test", "phase_idx": task.phase_idx,
                "train_phase_idx": task.train_phase_idx, "iteration": task.iteration,
                "meters_ema": values}, self.output_dir)
