"""HOOKS.MODEL_COMPLEXITY (flops and parameters at the start) and HOOKS.PERF_STATS (time spent
in each part of the train step)."""
import collections
import logging
import time
from typing import Dict, List

import torch

from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.log_hooks import append_metrics
from ssl_engine.utils.distributed import is_primary

logger = logging.getLogger(__name__)


def model_complexity(model: torch.nn.Module, input_shape: List[int]) -> Dict[str, int]:
    """fvcore's count of the forward pass on one zero input of ``input_shape`` ([C, H, W]):
    flops (one multiply-add counts as one), and parameters (all, and trainable)."""
    from fvcore.nn import FlopCountAnalysis

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            analysis = FlopCountAnalysis(model, torch.zeros(1, *input_shape, device=device))
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            flops = int(analysis.total())
    finally:
        model.train(was_training)
    return {"flops": flops,
            "params": sum(p.numel() for p in model.parameters()),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)}


class ModelComplexityHook(SSLHook):
    """At the start: logs the model's flops and parameters and writes them to metrics.json."""

    def __init__(self, input_shape: List[int], output_dir: str):
        if len(input_shape) != 3:
            raise ValueError("config.HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE must be [C, H, W], got "
                             f"{list(input_shape)}")
        self.input_shape, self.output_dir = [int(x) for x in input_shape], output_dir
        self.complexity: Dict[str, int] = {}

    def on_start(self, task) -> None:
        self.complexity = model_complexity(task.base_model, self.input_shape)
        if is_primary():
            logger.info("model complexity for input %s: %.4g GFLOPs, %d parameters (%d "
                        "trainable)", self.input_shape, self.complexity["flops"] / 1e9,
                        self.complexity["params"], self.complexity["trainable_params"])
            append_metrics(self.output_dir, {"model_complexity": self.complexity,
                                             "input_shape": self.input_shape})


# the events of a train step, in order, and the name of the part that ends at each
STEP_PARTS = (("on_forward", "data_and_forward"), ("on_loss_and_meter", "loss_and_meters"),
              ("on_backward", "backward"), ("on_update", "update"), ("on_step", "step_end"))


class PerfStatsHook(SSLHook):
    """Milliseconds spent in each part of the train step (data and forward, loss and meters,
    backward, update), averaged over the phase and logged at its end, and every
    ``frequency`` iterations when > 0; with ``rolling_window`` > 0, also the mean batch time
    of the last ``rolling_window`` iterations, every as many iterations."""

    def __init__(self, frequency: int = -1, rolling_window: int = -1):
        self.frequency, self.rolling_window = int(frequency), int(rolling_window)
        self.totals: Dict[str, float] = collections.defaultdict(float)
        self.steps = 0
        self.batch_times = collections.deque(maxlen=max(self.rolling_window, 1))
        self._last = None

    def _mark(self, part: str) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.totals[part] += now - self._last
        self._last = now

    def on_phase_start(self, task) -> None:
        self.totals.clear()
        self.steps = 0
        self._last = time.perf_counter()
        self._step_start = self._last

    def on_forward(self, task) -> None:
        self._mark("data_and_forward")

    def on_loss_and_meter(self, task) -> None:
        self._mark("loss_and_meters")

    def on_backward(self, task) -> None:
        self._mark("backward")

    def on_update(self, task) -> None:
        self._mark("update")

    def on_step(self, task) -> None:
        self._mark("step_end")
        self.steps += 1
        self.batch_times.append(self._last - self._step_start)
        self._step_start = self._last
        if self.frequency > 0 and self.steps % self.frequency == 0:
            self._log(task, "perf stats")
        if self.rolling_window > 0 and self.steps % self.rolling_window == 0 and is_primary():
            logger.info("mean batch time of the last %d iterations: %.1f ms",
                        len(self.batch_times), 1000 * sum(self.batch_times) / len(self.batch_times))

    def mean_ms(self) -> Dict[str, float]:
        return {part: 1000 * total / max(self.steps, 1) for part, total in self.totals.items()}

    def on_phase_end(self, task) -> None:
        if self.steps:
            self._log(task, "perf stats of the phase")

    def _log(self, task, what: str) -> None:
        if is_primary():
            parts = ", ".join(f"{part} {ms:.1f} ms" for part, ms in self.mean_ms().items())
            logger.info("%s (%s, %d iterations, mean per iteration): %s",
                        what, "train" if task.train else "test", self.steps, parts)
