"""The list-meter shape VISSL's meters share: one inner meter per model output (e.g. one linear
head per trunk stage), each named, updated, synced, reset and checkpointed together."""
from typing import Any, Dict, List, Sequence, Union

import torch

from ssl_engine.utils.classy import ClassyMeter


class ListMeter(ClassyMeter):
    """Base of the ``*_list_meter`` meters. Subclasses set ``meter_name`` (the registered name),
    build their inner meters (each with ``update``, ``sync_state``, ``reset``,
    ``get_classy_state`` and ``set_classy_state``) and give ``value``."""

    meter_name = ""

    def __init__(self, meters: List[Any], meter_names: Sequence[str] = ()):
        super().__init__()
        num_meters = len(meters)
        meter_names = [str(name) for name in meter_names] or [str(i) for i in range(num_meters)]
        if len(meter_names) != num_meters:
            raise ValueError(
                f"METERS.{self.meter_name}.meter_names has {len(meter_names)} names "
                f"for num_meters={num_meters}"
            )
        self.num_meters = num_meters
        self.meter_names = meter_names
        self._meters = meters

    @property
    def name(self) -> str:
        return self.meter_name

    def update(
        self,
        model_output: Union[torch.Tensor, List[torch.Tensor]],
        target: torch.Tensor,
        **kwargs,
    ) -> None:
        """``model_output``: one tensor per inner meter (a single tensor for one meter)."""
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
