"""The FLOPs of a training iteration, and the achieved TFLOP/s and MFU beside the step time.

The first training iteration of a run is counted with torch's ``FlopCounterMode`` (every
matrix product, convolution and attention of the forward and backward passes, the hooks'
included: a momentum teacher's forward, for example; elementwise work is not counted). It is
this process's count: with several processes, each counts its own share. The log line then
shows ``flops / seconds per iteration`` as TFLOP/s and, on a GPU of ``utils/peak_flops.py``'s
table, the model FLOPs utilisation (MFU: TFLOP/s over the device's dense peak at the step's
precision). A compiled model (MODEL.COMPILE) is not counted: the counter would run with its
first, compiling iteration.
"""
import logging
from typing import Optional

from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.metrics_writers import write_row
from ssl_engine.utils.distributed import is_primary
from ssl_engine.utils.peak_flops import peak_tflops, precision_name

logger = logging.getLogger(__name__)


class FlopsHook(SSLHook):
    """Counts the first training iteration's FLOPs into ``task.flops_per_iteration`` (and the
    device's peak into ``task.peak_tflops``: the attributes this hook gives the task, which
    hooks/throughput.py reads), logs them and writes them to the task's metrics
    store. Put it before the log hook, so that the first log line has them."""

    def __init__(self, output_dir: str):
        super().__init__()
        self.output_dir = output_dir
        self._mode = None

    def on_phase_start(self, task) -> None:
        compiled = bool(task.config.MODEL.COMPILE.get("USE_COMPILE", False))
        counted = getattr(task, "flops_per_iteration", None) is not None
        if task.train and not counted and not compiled:
            from torch.utils.flop_counter import FlopCounterMode

            self._mode = FlopCounterMode(display=False)
            self._mode.__enter__()

    def on_step(self, task) -> None:
        if self._mode is None:
            return
        flops = self._stop()
        task.flops_per_iteration = flops
        task.peak_tflops = peak_tflops(task.device, task.amp.dtype)
        if is_primary():
            where = (f"; peak of this GPU at {precision_name(task.amp.dtype)}: "
                     f"{task.peak_tflops:g} TFLOP/s (dense)" if task.peak_tflops else "")
            logger.info("FLOPs of one training iteration (this process, forward and backward): "
                        "%.4g GFLOP%s", flops / 1e9, where)
            write_row(task, {"flops_per_iteration": flops, "peak_tflops": task.peak_tflops,
                             "precision": precision_name(task.amp.dtype)}, self.output_dir)

    def _stop(self) -> Optional[int]:
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        return int(mode.get_total_flops())

    def on_phase_end(self, task) -> None:
        if self._mode is not None:  # a phase without a step
            self._stop()

    on_exception = on_phase_end
