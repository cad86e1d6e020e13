"""HOOKS.MODEL_COMPLEXITY (flops and parameters at the start) and HOOKS.PERF_STATS (time spent
in each part of the train step; at the end, with the achieved TFLOP/s and MFU of the FLOPs
hooks/flops_hook.py counted)."""
import collections
import logging
import time
from typing import Dict, List

import torch

from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.metrics_writers import write_row
from ssl_engine.hooks.throughput import throughput, throughput_text
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
    """At the start: logs the model's flops and parameters and writes them to the task's
    metrics store (metrics.json, the trackers)."""

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
            write_row(task, {"model_complexity": self.complexity,
                             "input_shape": self.input_shape}, self.output_dir)


# The parts of a step, in order. The step's events end them: data and forward at on_forward
# (the data part is ``task.data_time``, the wait for the batch), loss (and meters) at
# on_loss_and_meter, backward at on_backward, optimizer (gradient clipping, the update and its
# schedules) at on_update, and other (what the step does after the update) at on_step.  The
# time spent inside hooks (``task.hook_seconds``, counted by the task around every event) is
# taken out of the part it fell in and shown as its own part, hooks.
STEP_PARTS = ("data", "forward", "loss", "backward", "optimizer", "other", "hooks")
EVENT_PARTS = {"on_loss_and_meter": "loss", "on_backward": "backward", "on_update": "optimizer",
               "on_step": "other"}


class StepTimes:
    """Seconds per part of the step (STEP_PARTS), summed over ``steps`` steps."""

    def __init__(self):
        self.totals: Dict[str, float] = dict.fromkeys(STEP_PARTS, 0.0)
        self.steps = 0

    def add(self, part: str, seconds: float) -> None:
        self.totals[part] += seconds

    def mean_ms(self) -> Dict[str, float]:
        """Milliseconds per step of each part that took any time, and their total."""
        means = {part: 1000 * total / max(self.steps, 1)
                 for part, total in self.totals.items() if total > 0}
        means["total"] = sum(means.values())
        return means


def format_ms(means: Dict[str, float]) -> str:
    return ", ".join(f"{part} {ms:.1f} ms" for part, ms in means.items())


def _synchronize(task) -> None:
    device = getattr(task, "device", None)
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


class PerfStatsHook(SSLHook):
    """Where the time of a step goes (STEP_PARTS), measured with two clock reads per event.

    Its rows go to the task's metrics store as rank 0's (not reduced).
    At the end of the run: one log line and one metrics.json record (``step_time_ms``,
    ``scope`` "run") with the mean milliseconds of each part over the run's training steps
    (``scope`` "phase": a phase's).  At each phase end the
    phase's means go to metrics.json (and to the log at debug level); with ``frequency`` > 0
    they are also logged every ``frequency`` iterations, and with ``rolling_window`` > 0 the
    mean batch time of the last ``rolling_window`` iterations every as many iterations.

    Put it first among the hooks, so that the other hooks of an event are counted as hooks
    time of that event."""

    def __init__(self, output_dir: str, frequency: int = -1, rolling_window: int = -1,
                 synchronize_gpu: bool = False):
        self.output_dir = output_dir
        self.synchronize_gpu = bool(synchronize_gpu)
        self.frequency, self.rolling_window = int(frequency), int(rolling_window)
        self.phase = StepTimes()
        self.run = StepTimes()  # the training steps of the whole run
        self.batch_times = collections.deque(maxlen=max(self.rolling_window, 1))
        self._last = self._step_start = 0.0
        self._hook_seconds = 0.0

    def _mark(self, task, part: str, data_seconds: float = 0.0) -> None:
        """Ends ``part`` now: the time since the last mark, less the hooks' and the data's
        time in it, which go to their own parts.  On a GPU with ``synchronize_gpu`` the part
        ends when the GPU has run the work queued in it; without, a part counts its kernel
        launches only, and the wait for them falls in whichever part reads a result back
        first (waiting at every part would stop the CPU from running ahead of the GPU)."""
        if self.synchronize_gpu:
            _synchronize(task)
        now, hook_seconds = time.perf_counter(), task.hook_seconds
        hooks = hook_seconds - self._hook_seconds
        own = now - self._last - hooks - data_seconds
        for times in (self.phase, self.run) if task.train else (self.phase,):
            times.add(part, own)
            times.add("hooks", hooks)
            times.add("data", data_seconds)
        self._last, self._hook_seconds = now, hook_seconds

    def on_phase_start(self, task) -> None:
        self.phase = StepTimes()
        if self.synchronize_gpu:
            _synchronize(task)
        self._last = self._step_start = time.perf_counter()
        self._hook_seconds = task.hook_seconds

    def on_forward(self, task) -> None:
        self._mark(task, "forward", data_seconds=task.data_time)

    def on_loss_and_meter(self, task) -> None:
        self._mark(task, "loss")

    def on_backward(self, task) -> None:
        self._mark(task, "backward")

    def on_update(self, task) -> None:
        self._mark(task, "optimizer")

    def on_step(self, task) -> None:
        self._mark(task, "other")
        self.phase.steps += 1
        if task.train:
            self.run.steps += 1
        self.batch_times.append(self._last - self._step_start)
        self._step_start = self._last
        if self.frequency > 0 and self.phase.steps % self.frequency == 0 and is_primary():
            logger.info("step time (%s, mean of the phase's %d iterations): %s",
                        task.phase_type, self.phase.steps, format_ms(self.phase.mean_ms()))
        if self.rolling_window > 0 and self.phase.steps % self.rolling_window == 0 and \
                is_primary():
            logger.info("mean batch time of the last %d iterations: %.1f ms",
                        len(self.batch_times), 1000 * sum(self.batch_times) / len(self.batch_times))

    def mean_ms(self) -> Dict[str, float]:
        """The current phase's mean milliseconds per step, by part."""
        return self.phase.mean_ms()

    def on_phase_end(self, task) -> None:
        if self.phase.steps and is_primary():
            means = self.phase.mean_ms()
            logger.debug("step time of %s phase %d (%d iterations, mean per iteration): %s",
                         task.phase_type, task.phase_idx, self.phase.steps, format_ms(means))
            write_row(task, {"step_time_ms": means, "scope": "phase",
                             "phase_type": task.phase_type, "phase_idx": task.phase_idx,
                             "iterations": self.phase.steps}, self.output_dir)

    def on_end(self, task) -> None:
        if self.run.steps and is_primary():
            means = self.run.mean_ms()
            # achieved TFLOP/s (and MFU) at the mean step time, with the FLOPs counted
            speed = throughput(task, means["total"] / 1000, training=True)
            logger.info("step time (mean of this run's %d training iterations): %s%s",
                        self.run.steps, format_ms(means), throughput_text(speed))
            write_row(task, {"step_time_ms": means, "scope": "run", "phase_type": "train",
                             "iterations": self.run.steps, **speed}, self.output_dir)
