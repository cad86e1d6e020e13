"""Top-k accuracy, in percent, of each of several model outputs against one target."""
import warnings
from typing import Any, Dict, List, Sequence, Union

import torch

with warnings.catch_warnings():  # classy_vision imports deprecated torchvision modules
    warnings.simplefilter("ignore")
    from classy_vision.meters import AccuracyMeter, ClassyMeter, register_meter


@register_meter("accuracy_list_meter")
class AccuracyListMeter(ClassyMeter):
    """One classy AccuracyMeter per model output (e.g. one linear head per trunk stage).

    ``value`` is ``{"top_<k>": {meter_name: accuracy in percent}}``.
    """

    def __init__(
        self, num_meters: int, topk_values: Sequence[int], meter_names: Sequence[str] = ()
    ):
        super().__init__()
        topk_values = [int(k) for k in topk_values]
        if num_meters < 1 or not topk_values or min(topk_values) < 1:
            raise ValueError(
                "METERS.accuracy_list_meter needs num_meters >= 1 and topk_values of positive "
                f"ints, got num_meters={num_meters}, topk_values={topk_values}"
            )
        meter_names = [str(name) for name in meter_names] or [str(i) for i in range(num_meters)]
        if len(meter_names) != num_meters:
            raise ValueError(
                f"METERS.accuracy_list_meter.meter_names has {len(meter_names)} names "
                f"for num_meters={num_meters}"
            )
        self.num_meters = num_meters
        self.topk_values = topk_values
        self.meter_names = meter_names
        self._meters = [AccuracyMeter(topk_values) for _ in range(num_meters)]

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "AccuracyListMeter":
        return cls(
            num_meters=int(config.get("num_meters", 1)),
            topk_values=list(config.get("topk_values", [1])),
            meter_names=list(config.get("meter_names", None) or []),
        )

    @property
    def name(self) -> str:
        return "accuracy_list_meter"

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
        """``model_output``: one [N, num_classes] tensor per meter; ``target``: [N] classes."""
        outputs = [model_output] if isinstance(model_output, torch.Tensor) else list(model_output)
        if len(outputs) != self.num_meters:
            raise ValueError(
                f"accuracy_list_meter has num_meters={self.num_meters} but the model gave "
                f"{len(outputs)} output(s); set METERS.accuracy_list_meter.num_meters"
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
            f"{topk}[{name}]={accuracy:.2f}"
            for topk, per_name in self.value.items()
            for name, accuracy in per_name.items()
        ]
        return f"{self.name}({', '.join(parts)})"
