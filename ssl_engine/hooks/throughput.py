"""Achieved TFLOP/s and MFU of a training step from the FLOPs the FlopsHook counted
(hooks/flops_hook.py): the values the log line and metrics.json show beside the step time."""
from typing import Dict


def throughput(task, seconds_per_iteration: float, training: bool = None) -> Dict[str, float]:
    """{"tflops_per_sec", and "mfu" where the peak is known} of a training step taking
    ``seconds_per_iteration``; {} until the FLOPs are counted, and for test steps
    (``training``: whether the seconds are a training step's; default: the task's phase)."""
    flops = getattr(task, "flops_per_iteration", None)  # hand-made tasks have none
    training = task.train if training is None else training
    if not flops or not training or seconds_per_iteration <= 0:
        return {}
    tflops = flops / seconds_per_iteration / 1e12
    peak = getattr(task, "peak_tflops", None)
    return {"tflops_per_sec": tflops, **({"mfu": tflops / peak} if peak else {})}


def throughput_text(values: Dict[str, float]) -> str:
    """" | 1.23 TFLOP/s (MFU 12.3%)" of ``throughput``'s values, "" without them."""
    if "tflops_per_sec" not in values:
        return ""
    mfu = f" (MFU {100 * values['mfu']:.1f}%)" if "mfu" in values else ""
    return f" | {values['tflops_per_sec']:.3g} TFLOP/s{mfu}"
