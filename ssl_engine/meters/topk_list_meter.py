"""One classy_vision top-k meter per model output, under VISSL's list-meter names.

``accuracy_list_meter``, ``precision_at_k_list_meter`` and ``recall_at_k_list_meter`` differ only
in the classy meter each output gets; their config keys are the same
(``METERS.<name>.{num_meters, topk_values, meter_names}``).
"""
from typing import Any, Dict, Sequence

from ssl_engine.meters.list_meter import ListMeter
from ssl_engine.utils.classy import AccuracyMeter, PrecisionAtKMeter, RecallAtKMeter, register_meter


class TopKListMeter(ListMeter):
    """``num_meters`` copies of ``meter_class(topk_values)``, one per model output (e.g. one
    linear head per trunk stage). ``value`` is ``{"top_<k>": {meter_name: percent}}``.
    Subclasses set ``meter_name`` (the registered name) and ``meter_class``. ``update``'s
    target: [N] classes, or [N, num_classes] labels: 1 present, 0 absent, and -1 (VOC's
    difficult) counted as absent; soft labels (floats) are counted by their mass. With
    several present classes (ImageNet-ReaL), a sample is accurate at k when any of them is
    among its k best scores."""

    meter_class = None

    def __init__(
        self, num_meters: int, topk_values: Sequence[int], meter_names: Sequence[str] = ()
    ):
        topk_values = [int(k) for k in topk_values]
        if num_meters < 1 or not topk_values or min(topk_values) < 1:
            raise ValueError(
                f"METERS.{self.meter_name} needs num_meters >= 1 and topk_values of positive "
                f"ints, got num_meters={num_meters}, topk_values={topk_values}"
            )
        super().__init__([self.meter_class(topk_values) for _ in range(num_meters)], meter_names)
        self.topk_values = topk_values

    def update(self, model_output, target, **kwargs) -> None:
        if target.dim() == 2 and not target.is_floating_point():
            target = target.clamp(min=0)  # -1 (unknown) would subtract from the counts
        super().update(model_output, target, **kwargs)

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "TopKListMeter":
        return cls(
            num_meters=int(config.get("num_meters", 1)),
            topk_values=list(config.get("topk_values", [1])),
            meter_names=list(config.get("meter_names", None) or []),
        )

    @property
    def value(self) -> Dict[str, Dict[str, float]]:
        values = [meter.value for meter in self._meters]
        return {
            f"top_{k}": {
                name: 100.0 * value[f"top_{k}"] for name, value in zip(self.meter_names, values)
            }
            for k in self.topk_values
        }

    def __repr__(self) -> str:
        parts = [
            f"{topk}[{name}]={percent:.2f}"
            for topk, per_name in self.value.items()
            for name, percent in per_name.items()
        ]
        return f"{self.name}({', '.join(parts)})"


@register_meter("accuracy_list_meter")
class AccuracyListMeter(TopKListMeter):
    """Top-k accuracy in percent: a sample counts when its class is among the k best scores."""

    meter_name = "accuracy_list_meter"
    meter_class = AccuracyMeter


@register_meter("precision_at_k_list_meter")
class PrecisionAtKListMeter(TopKListMeter):
    """Precision@k in percent: correct labels among the k best scores, divided by k per sample."""

    meter_name = "precision_at_k_list_meter"
    meter_class = PrecisionAtKMeter


@register_meter("recall_at_k_list_meter")
class RecallAtKListMeter(TopKListMeter):
    """Recall@k in percent: correct labels among the k best scores over all correct labels."""

    meter_name = "recall_at_k_list_meter"
    meter_class = RecallAtKMeter
