"""Progress logging: every LOG_FREQUENCY iterations and at every phase end, a row of the
task's metrics store (``task.metrics``, ssl_engine/utils/metrics_store.py) that its writers get:
the log line, ``metrics.json`` (one JSON object per line) in CHECKPOINT.DIR, TensorBoard and the
trackers. The loss, its terms, the collapse statistics and any other series are the means of
the store's window (every entry put since the last row, over ranks) and of the phase."""
import json
import logging
import math
import os
import resource
import time
from pathlib import Path
from typing import Any, Dict, Tuple

import torch

from ssl_engine.data.device_augmentation import PARAMS_KEY
from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.throughput import throughput
from ssl_engine.hooks.metrics_writers import JsonWriter, LogLineWriter
from ssl_engine.utils.distributed import get_world_size, is_primary
from ssl_engine.utils.loss_watch import NonFiniteLossError, non_finite_message

logger = logging.getLogger(__name__)


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated on ``device``, or the process's peak resident memory."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def meter_values(task) -> Dict[str, Any]:
    return {meter.name: meter.value for meter in task.meters}


# The series of the metrics store the log reports under names of their own; any other series
# (a user hook's) goes to the log line and to metrics.json's "metrics" / "metrics_avg".
OWN_SERIES = ("loss", "loss_terms", "monitor")


def other_series(values: Dict[str, Any]) -> Dict[str, Any]:
    """The reduced series of ``values`` (``MetricsStore.reduce``) not in OWN_SERIES."""
    return {name: value for name, value in values.items() if name not in OWN_SERIES}


def _written_after(line: str, phase_idx: int, iteration_in_phase: int) -> bool:
    """Whether a metrics.json row is of a step or phase after batch ``iteration_in_phase`` of
    phase ``phase_idx`` (rows without a phase, e.g. the k-NN's, have no place of their own; a
    line a killed run left half-written counts as after)."""
    try:
        row = json.loads(line)
    except ValueError:
        return True
    if not isinstance(row, dict) or "phase_idx" not in row:
        return False
    if row["phase_idx"] != phase_idx:
        return row["phase_idx"] > phase_idx
    done = row.get("iteration_in_phase")  # None: a row of the whole phase, at its end
    return done is None or done > iteration_in_phase


def drop_metrics_after(folder: str, phase_idx: int, iteration_in_phase: int) -> None:
    """Cut metrics.json before its first row written after the position a run continues from:
    a resumed run writes those rows again, and the file keeps one row per step."""
    path = Path(folder) / "metrics.json"
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    for index, line in enumerate(lines):
        if _written_after(line, phase_idx, iteration_in_phase):
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text("".join(lines[:index]))
            os.replace(tmp, path)
            return


def batch_counts(batch) -> Tuple[int, int]:
    """(images, views) in a collated batch: the distinct ``data_idx`` (every view of an image
    shares it), and the rows of every image tensor the model or a momentum encoder sees."""
    def rows(obj) -> int:
        if torch.is_tensor(obj):
            return obj.shape[0] if obj.dim() == 4 else 0
        if isinstance(obj, (list, tuple)):
            return sum(rows(item) for item in obj)
        if isinstance(obj, dict):  # named inputs (the masking collator)
            return sum(rows(item) for item in obj.values())
        return 0

    if PARAMS_KEY in batch:  # augmented on the device: a row of drawn parameters a view (a
        # multi-crop's host batch holds each image once, whatever its views)
        views = sum(len(params) for params, _ in batch[PARAMS_KEY])
    else:
        views = rows(batch.get("input")) + rows(batch.get("input_momentum")) or len(batch["target"])
    if "data_idx" in batch:
        return int(torch.unique(batch["data_idx"]).numel()), views
    return len(batch["target"]), views


def check_window_loss(task, values: Dict[str, Any]) -> None:
    """HOOKS.CHECK_NAN where the log reads the window's values: a mean loss that is not
    finite stops the run (NonFiniteLossError, on every rank: the mean is over the ranks),
    naming this rank's first non-finite loss (utils/loss_watch.py); a finite one clears the
    watch. No read-back of its own unless the run stops."""
    watch = getattr(task, "loss_watch", None)  # hand-made tasks of the tests have none
    config = getattr(task, "config", None)
    if watch is None or "loss" not in values or \
            (config is not None and not config.HOOKS.get("CHECK_NAN", True)):
        return
    if math.isfinite(values["loss"]):
        watch.all_finite()
        return
    watch.check()  # raises when this rank saw it
    raise NonFiniteLossError(non_finite_message(values["loss"], (
        task.iteration, task.phase_idx, task.iteration_num_in_phase)).replace(
        "loss is", "the mean loss over the ranks (another rank's loss) is", 1))


class LogLossLrEtaHook(SSLHook):
    """Logs phase, iteration, loss, lr, images/s, data time, ETA and peak memory."""

    def __init__(self, log_frequency: int, output_dir: str):
        super().__init__()
        self.log_frequency = log_frequency
        self.output_dir = output_dir
        self._phase_start = self._window_start = time.perf_counter()
        self._window_steps = 0
        self._window_data_time = 0.0
        self._train_time = 0.0
        self._train_steps = 0

    def on_start(self, task) -> None:
        if is_primary():
            Path(self.output_dir).mkdir(parents=True, exist_ok=True)
            drop_metrics_after(self.output_dir, *task.resume_position)
            task.metrics.add_writer(LogLineWriter())
            task.metrics.add_writer(JsonWriter(self.output_dir))
            logger.info("run: %d phases, %d train iterations per epoch, world size %d",
                        len(task.phases), task.num_train_iters_per_epoch, get_world_size())

    def on_phase_start(self, task) -> None:
        self._phase_start = self._window_start = time.perf_counter()
        self._window_steps = 0
        self._window_data_time = 0.0

    def _eta_seconds(self, task) -> float:
        if not self._train_steps:
            return float("nan")
        remaining = task.max_iteration - task.iteration
        return remaining * self._train_time / self._train_steps

    def on_step(self, task) -> None:
        self._window_steps += 1
        self._window_data_time += task.data_time
        if task.train:
            self._train_time += task.step_time
            self._train_steps += 1
        count = task.iteration if task.train else task.iteration_num_in_phase
        last_of_phase = task.iteration_num_in_phase == task.num_iters_in_phase
        if count % self.log_frequency and not last_of_phase:
            return
        values = task.metrics.reduce_window()  # collective: every rank
        loss, terms = values.get("loss", float("nan")), values.get("loss_terms", {})
        check_window_loss(task, values)
        monitor = values.get("monitor", {}) if task.train else {}
        others = other_series(values)
        elapsed = time.perf_counter() - self._window_start
        per_iteration = elapsed / max(self._window_steps, 1)
        # the loader's batch on the host when the step kept it: counting its images there waits
        # for no device
        batch = getattr(task, "last_host_batch", None) or task.last_batch
        images, views = (count * get_world_size() for count in batch_counts(batch))
        record = {
            "phase": task.phase_type,
            "phase_idx": task.phase_idx,
            "train_phase_idx": task.train_phase_idx,
            "iteration": task.iteration,
            "iteration_in_phase": task.iteration_num_in_phase,
            "loss": loss,
            **({"loss_terms": terms} if terms else {}),
            **({"monitor": monitor} if monitor else {}),
            **({"metrics": others} if others else {}),
            "lr": task.optimizer.get_lr() if task.optimizer else None,
            "images_per_sec": images * self._window_steps / max(elapsed, 1e-9),
            "views_per_sec": views * self._window_steps / max(elapsed, 1e-9),
            "data_time": self._window_data_time / self._window_steps,
            "iteration_seconds": per_iteration,
            **throughput(task, per_iteration),  # tflops_per_sec, mfu (hooks/flops_hook.py)
            "eta_seconds": self._eta_seconds(task) if task.train else None,
            "peak_mem_mb": peak_memory_mb(task.device),
        }
        self._window_start, self._window_steps, self._window_data_time = time.perf_counter(), 0, 0.0
        if not is_primary():
            return
        task.metrics.write(record, task.iteration, kind="step", reduced=True,
                           num_iters_in_phase=task.num_iters_in_phase)

    def on_phase_end(self, task) -> None:
        values = task.metrics.reduce_phase()  # from the windows: every rank
        others = other_series(values)
        record = {
            "phase_end": task.phase_type,
            "phase_idx": task.phase_idx,
            "train_phase_idx": task.train_phase_idx,
            "iteration": task.iteration,
            "loss_avg": values.get("loss", float("nan")),
            "loss_terms_avg": values.get("loss_terms", {}),
            "monitor_avg": values.get("monitor", {}),
            **({"metrics_avg": others} if others else {}),
            "meters": meter_values(task),
            "phase_time_seconds": time.perf_counter() - self._phase_start,
        }
        if is_primary():
            task.metrics.write(record, task.iteration, kind="phase_end", reduced=True)

    def on_end(self, task) -> None:
        if is_primary():
            logger.info("done: %d iterations, %d phases", task.iteration, len(task.phases))
