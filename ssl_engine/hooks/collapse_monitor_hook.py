"""Collapse, seen as it happens: statistics of the model's embeddings (and of the loss's own
distributions where it has them) logged with the loss, and a warning when they show collapse.

- ``embedding_std``: the per-dimension standard deviation of the L2-normalised first model
  output over the batch, averaged over dimensions and scaled by sqrt(dim) (the SimSiam paper's
  collapse plot): about 1 for embeddings spread over the sphere, 0 when every sample maps to
  one point (left out when the loss's ``monitor_embedding`` is false: DINO's output are
  prototype scores).
- a loss may add its own (``collapse_statistics()``, values of its last computation) and say
  when they mean collapse (``collapse_warning(statistics)``): SwAV the entropies of its
  assignments and predictions, DINO the entropy of the teacher's distribution.
"""
import logging
import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ssl_engine.hooks.base import SSLHook
from ssl_engine.utils.distributed import is_primary
from ssl_engine.utils.metrics_store import MetricsWriter, Record

logger = logging.getLogger(__name__)


def embedding_std(embedding: torch.Tensor) -> torch.Tensor:
    """sqrt(D) x the mean over dimensions of the batch std of the L2-normalised rows."""
    normalised = F.normalize(embedding.detach().float(), dim=1)
    return normalised.std(dim=0).mean() * math.sqrt(normalised.shape[1])


class CollapseMonitorHook(SSLHook):
    """After every training forward pass, the statistics go to the metrics store's series
    ``"monitor"`` (the log averages them like the loss terms); the first time the means of
    a log line show collapse, a warning (at once for a hand-made task without a config)."""

    def __init__(self, min_embedding_std: float):
        super().__init__()
        self.min_embedding_std = float(min_embedding_std)
        self.warned = False

    def statistics(self, task) -> Dict[str, torch.Tensor]:
        stats: Dict[str, torch.Tensor] = {}
        output = task.last_model_output
        first = output[0] if isinstance(output, (list, tuple)) else output
        if (task.loss.monitor_embedding and torch.is_tensor(first) and first.dim() == 2
                and first.shape[0] > 1):
            stats["embedding_std"] = embedding_std(first)
        stats.update({name: value.detach().float()
                      for name, value in task.loss.collapse_statistics().items()})
        return stats

    def warning(self, task, stats: Dict[str, torch.Tensor]) -> Optional[str]:
        std = stats.get("embedding_std")
        if std is not None and float(std) < self.min_embedding_std:
            return (f"embedding_std {float(std):.3f} is below {self.min_embedding_std} "
                    "(HOOKS.COLLAPSE_MONITOR.MIN_EMBEDDING_STD): the embeddings have collapsed "
                    "towards a point")
        return task.loss.collapse_warning(stats)

    def on_start(self, task) -> None:
        task.metrics.add_writer(_WarnOnRows(self, task))

    def on_loss_and_meter(self, task) -> None:
        if not task.train:
            return
        stats = self.statistics(task)
        task.metrics.put("monitor", stats)
        if getattr(task, "config", None) is None:  # a hand-made task: no log rows to wait for
            self.warn_once(task, stats)

    def warn_once(self, task, stats) -> None:
        """The warning, the first time ``stats`` (tensors or the log's floats) show
        collapse."""
        if self.warned:
            return
        message = self.warning(task, stats)
        if message:
            self.warned = True
            if is_primary():
                logger.warning("collapse at iteration %d: %s; the features will be no better than "
                               "a random network's unless it recovers (docs/methods.md)",
                               task.iteration, message)


class _WarnOnRows(MetricsWriter):
    """The monitor's warning judged on the statistics the log line shows (the means of the
    window, already read back from the device): judging each step's tensors would make the
    host wait for the device at every step."""

    def __init__(self, hook: CollapseMonitorHook, task):
        self.hook, self.task = hook, task

    def write(self, record: Record) -> None:
        monitor = record.row.get("monitor") if record.kind == "step" else None
        if monitor:
            self.hook.warn_once(self.task, monitor)
