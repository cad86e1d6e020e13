"""VISSL's HOOKS.MEMORY_SUMMARY and HOOKS.LOG_GPU_STATS.

- ``MemorySummaryHook``: once, after training iteration ``LOG_ITERATION_NUM``, the memory the
  run holds: on a GPU torch's CUDA allocator summary; on the CPU the process's resident memory
  (now and at its peak) and the bytes of the model's parameters and buffers and of the
  optimizer's state. With ``DUMP_MEMORY_ON_EXCEPTION``, after an exception, the live tensors
  of the process, largest first.
- ``GpuStatsHook``: at the start, on a GPU run, nvidia-smi's report (or torch's device
  properties where nvidia-smi is missing). A CPU run has no GPU to report.

Every process logs its own summary (memory differs between ranks); the GPU report is logged
once per machine (local rank 0).
"""
import gc
import logging
import os
import resource
import subprocess
import warnings
from typing import Iterable, List, Tuple

import torch

from ssl_engine.hooks.base import SSLHook
from ssl_engine.utils.distributed import get_rank

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
DUMP_TOP = 20  # live tensors listed after an exception


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen, total = set(), 0
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor) and id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * tensor.element_size()
    return total


def optimizer_state_tensors(optimizer) -> List[torch.Tensor]:
    """The tensors of the torch optimizer inside the engine's and classy_vision's wrappers."""
    inner = optimizer
    for _ in range(4):  # SSLOptimizer -> classy optimizer -> torch optimizer
        if isinstance(getattr(inner, "state", None), dict) and hasattr(inner, "param_groups"):
            break
        inner = getattr(inner, "classy_optimizer", None) or getattr(inner, "optimizer", None)
    state = getattr(inner, "state", {}) or {}
    return [value for per_param in state.values() if isinstance(per_param, dict)
            for value in per_param.values() if isinstance(value, torch.Tensor)]


def resident_mib() -> Tuple[float, float]:
    """(current, peak) resident memory of this process in MiB (current: nan where /proc is
    missing)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
    except (OSError, ValueError, IndexError):
        return float("nan"), peak
    return current, max(peak, current)  # the kernel's peak can lag the current reading


def memory_summary(task) -> str:
    device = getattr(task, "device", torch.device("cpu"))
    if device.type == "cuda":
        return torch.cuda.memory_summary(device, abbreviated=True)
    current, peak = resident_mib()
    model = task.base_model
    weights = tensor_bytes(list(model.parameters()) + list(model.buffers())) / MIB
    optimizer = getattr(task, "optimizer", None)
    state = tensor_bytes(optimizer_state_tensors(optimizer)) / MIB if optimizer else 0.0
    return (f"resident memory {current:.1f} MiB (peak {peak:.1f} MiB); model parameters and "
            f"buffers {weights:.1f} MiB; optimizer state {state:.1f} MiB")


def live_tensors() -> List[Tuple[int, str]]:
    """(bytes, description) of the tensors the garbage collector can reach, largest first."""
    found, seen = [], set()
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and id(obj) not in seen:
                    seen.add(id(obj))
                    size = obj.numel() * obj.element_size()
                    found.append((size, f"{tuple(obj.shape)} {obj.dtype} {obj.device}"))
            except Exception:  # noqa: BLE001  (objects failing isinstance or attribute access)
                continue
    return sorted(found, key=lambda item: -item[0])


class MemorySummaryHook(SSLHook):
    """HOOKS.MEMORY_SUMMARY: see the module docstring."""

    def __init__(self, print_summary: bool = True, log_iteration: int = 0,
                 dump_on_exception: bool = False):
        self.print_summary = bool(print_summary)
        self.log_iteration = int(log_iteration)
        self.dump_on_exception = bool(dump_on_exception)
        self.done = False

    def on_step(self, task) -> None:
        if not self.print_summary or self.done or not task.train:
            return
        if task.iteration > self.log_iteration:  # iteration LOG_ITERATION_NUM (from 0) is done
            self.done = True
            logger.info("memory of rank %d after iteration %d: %s", get_rank(),
                        task.iteration - 1, memory_summary(task))

    def on_exception(self, task) -> None:
        if not self.dump_on_exception:
            return
        tensors = live_tensors()
        total = sum(size for size, _ in tensors) / MIB
        lines = [f"{size / MIB:10.2f} MiB  {what}" for size, what in tensors[:DUMP_TOP]]
        logger.error("live tensors of rank %d after the exception: %d, %.1f MiB in all; the "
                     "largest:\n%s", get_rank(), len(tensors), total, "\n".join(lines))


class GpuStatsHook(SSLHook):
    """HOOKS.LOG_GPU_STATS: see the module docstring."""

    def on_start(self, task) -> None:
        device = getattr(task, "device", torch.device("cpu"))
        if device.type != "cuda" or int(os.environ.get("LOCAL_RANK", "0")) != 0:
            return
        try:
            report = subprocess.run(["nvidia-smi"], capture_output=True, text=True,
                                    timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            report = ""
        if not report:
            props = torch.cuda.get_device_properties(device)
            report = (f"nvidia-smi gave nothing; {torch.cuda.device_count()} GPU(s), this one "
                      f"{props.name}, {props.total_memory / MIB:.0f} MiB")
        logger.info("GPU stats:\n%s", report)
