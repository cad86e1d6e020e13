"""One classy_vision top-k meter per model output, under VISSL's list-meter names.

``accuracy_list_meter``, ``precision_at_k_list_meter`` and ``recall_at_k_list_meter`` differ only
in the classy meter each output gets; their config keys are the same
(``METERS.<name>.{num_meters, topk_values, meter_names}``).
"""
import warnings
from typing import Any, Dict, List, Sequence, Union

import torch

with warnings.catch_warnings():  # classy_vision imports deprecated torchvision modules
    warnings.simplefilter("ignore")
    from classy_vision.meters import (
        AccuracyMeter,
        ClassyMeter,
        PrecisionAtKMeter,
        RecallAtKMeter,
        register_meter,
    )


class TopKListMeter(ClassyMeter):
    """``num_meters`` copies of ``meter_class(topk_values)``, one per model output (e.g. one
    linear head per trunk stage). ``value`` is ``{"top_<k>": {meter_name: percent}}``.
    Subclasses set ``meter_name`` (the registered name) and ``meter_class``."""

    meter_name = ""
    meter_class = None

    def __init__(
        self, num_meters: int, topk_values: Sequence[int], meter_names: Sequence[str] = ()
    ):
        super().__init__()
        topk_values = [int(k) for k in topk_values]
        if num_meters < 1 or not topk_values or min(topk_values) < 1:
            raise ValueError(
                f"METERS.{self.meter_name} needs num_meters >= 1 and topk_values of positive "
                f"ints, got num_meters={num_meters}, topk_values={topk_values}"
            )
        meter_names = [str(name) for name in meter_names] or [str(i) for i in range(num_meters)]
        if len(meter_names) != num_meters:
            raise ValueError(
                f"METERS.{self.meter_name}.meter_names has {len(meter_names)} names "
                f"for num_meters={num_meters}"
            )
        self.num_meters = num_meters
        self.topk_values = topk_values
        self.meter_names = meter_names
        self._meters = [self.meter_class(topk_values) for _ in range(num_meters)]

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "TopKListMeter":
        return cls(
            num_meters=int(config.get("num_meters", 1)),
            topk_values=list(config.get("topk_values", [1])),
            meter_names=list(config.get("meter_names", None) or []),
        )

    @property
    def name(self) -> str:
        return self.meter_name

    @property
    def value(self) -> Dict[str, Dict[str, float]]:
        values = [meter.value for meter in self._meters]
        return {
            f"top_{k}": {
                name: 100.0 * value[f"top_{k}"] for name, value in zip(self.meter_names, values)
            }
            for k in self.topk_values
        }

    def update(
        self,
        model_output: Union[torch.Tensor, List[torch.Tensor]],
        target: torch.Tensor,
        **kwargs,
    ) -> None:
        """``model_output``: one [N, num_classes] tensor per meter; ``target``: [N] classes
        (or [N, num_classes] 0/1 labels for the precision and recall meters)."""
        outputs = [model_output] if isinstance(model_output, torch.Tensor) else list(model_output)
        if len(outputs) != self.num_meters:
            raise ValueError(
                f"{self.name} has num_meters={self.num_meters} but the model gave "
                f"{len(outputs)} output(s); set METERS.{self.name}.num_meters"
            )
        target = target.detach()
        for meter, output in zip(self._meters, outputs):
            meter.update(output.detach(), target)

    def sync_state(self) -> None:
        """Sum the counts since the last sync over all ranks (no-op without a process group)."""
        for meter in self._meters:
            meter.sync_state()

    def reset(self) -> None:
        for meter in self._meters:
            meter.reset()

    def validate(self, model_output_shape, target_shape) -> None:
        pass

    def get_classy_state(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "meter_names": list(self.meter_names),
            "meters": [meter.get_classy_state() for meter in self._meters],
        }

    def set_classy_state(self, state: Dict[str, Any]) -> None:
        if state.get("name") != self.name or list(state.get("meter_names", [])) != self.meter_names:
            raise ValueError(
                f"meter state of '{state.get('name')}' with names {state.get('meter_names')} "
                f"does not fit {self.name} with names {self.meter_names}"
            )
        for meter, meter_state in zip(self._meters, state["meters"]):
            meter.set_classy_state(meter_state)

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
