"""Mean average precision of multi-label predictions, one meter per model output."""
from typing import Any, Dict, Sequence

import torch
import torch.distributed as dist

from ssl_engine.meters.list_meter import ListMeter
from ssl_engine.utils.average_precision import average_precision
from ssl_engine.utils.classy import register_meter

NO_POSITIVE_AP = -1.0  # the AP of a class without positives: left out of the mean


class _MeanAP:
    """The scores and 0/1/-1 labels of one output; AP per class and their mean."""

    def __init__(self, num_classes: int, max_samples: int):
        self.num_classes, self.max_samples = num_classes, max_samples
        self.reset()

    def reset(self) -> None:
        empty = (torch.zeros(0, self.num_classes), torch.zeros(0, self.num_classes, dtype=torch.int8))
        self.synced, self.local = empty, empty  # rows of every rank up to the last sync; since

    def rows(self):
        return tuple(torch.cat([a, b]) for a, b in zip(self.synced, self.local))

    def update(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        if scores.dim() != 2 or scores.shape != labels.shape or scores.shape[1] != self.num_classes:
            raise ValueError(
                f"mean_ap_list_meter needs [N, {self.num_classes}] scores and 0/1/-1 labels of "
                f"the same shape (METERS.mean_ap_list_meter.num_classes), got {tuple(scores.shape)}"
                f" and {tuple(labels.shape)}")
        if not torch.isin(labels, torch.tensor([-1, 0, 1], dtype=labels.dtype)).all():
            raise ValueError("mean_ap_list_meter labels must be 1 (present), 0 (absent) or -1 "
                             "(unknown)")
        self.local = (torch.cat([self.local[0], scores.float().cpu()]),
                      torch.cat([self.local[1], labels.to(torch.int8).cpu()]))
        stored = len(self.synced[0]) + len(self.local[0])
        if 0 < self.max_samples < stored:
            raise ValueError(f"mean_ap_list_meter holds {stored} samples, more than "
                             f"METERS.mean_ap_list_meter.max_cpu_capacity={self.max_samples}")

    def sync_state(self) -> None:
        """Every rank gets the rows every rank has seen since the last sync."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, self.local)
        else:
            gathered = [self.local]
        self.synced = tuple(torch.cat([part] + [g[i] for g in gathered])
                            for i, part in enumerate(self.synced))
        self.local = (self.local[0][:0], self.local[1][:0])

    def value(self):
        scores, labels = self.rows()
        per_class = [average_precision(scores[:, c], labels[:, c], no_positives=NO_POSITIVE_AP)
                     for c in range(self.num_classes)]
        valid = [ap for ap in per_class if ap >= 0]
        return (sum(valid) / len(valid) if valid else 0.0), per_class

    def get_classy_state(self) -> Dict[str, Any]:
        return {"synced": self.synced, "local": self.local}

    def set_classy_state(self, state: Dict[str, Any]) -> None:
        self.synced, self.local = state["synced"], state["local"]


@register_meter("mean_ap_list_meter")
class MeanAPListMeter(ListMeter):
    """Multi-label mean AP per model output. ``update(output, target)``: ``output`` one
    [N, num_classes] score tensor per meter, ``target`` [N, num_classes] with 1 (present),
    0 (absent), -1 (unknown, not counted). ``value``: ``{"mAP": {meter_name: percent},
    "AP": {meter_name: [AP per class in [0, 1], -1 for a class without positives]}}``.
    Every score is kept until the phase ends (``max_cpu_capacity`` > 0 bounds them)."""

    meter_name = "mean_ap_list_meter"

    def __init__(self, num_classes: int, num_meters: int = 1, meter_names: Sequence[str] = (),
                 max_cpu_capacity: int = -1):
        if num_classes < 1 or num_meters < 1:
            raise ValueError("METERS.mean_ap_list_meter needs num_classes >= 1 and num_meters "
                             f">= 1, got num_classes={num_classes}, num_meters={num_meters}")
        super().__init__([_MeanAP(num_classes, int(max_cpu_capacity)) for _ in range(num_meters)],
                         meter_names)
        self.num_classes = num_classes

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "MeanAPListMeter":
        return cls(num_classes=int(config.get("num_classes", 9605)),
                   num_meters=int(config.get("num_meters", 1)),
                   meter_names=list(config.get("meter_names", None) or []),
                   max_cpu_capacity=int(config.get("max_cpu_capacity", -1)))

    @property
    def value(self) -> Dict[str, Dict[str, Any]]:
        values = [meter.value() for meter in self._meters]
        return {"mAP": {name: 100.0 * v[0] for name, v in zip(self.meter_names, values)},
                "AP": {name: v[1] for name, v in zip(self.meter_names, values)}}

    def __repr__(self) -> str:
        parts = [f"mAP[{name}]={value:.2f}" for name, value in self.value["mAP"].items()]
        return f"{self.name}({', '.join(parts)})"
