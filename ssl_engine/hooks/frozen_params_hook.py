"""``MODEL.TEMP_FROZEN_PARAMS_ITER_MAP``: parameters that stay frozen for their first updates
(SwAV's prototypes for the first epoch, DINO's last layer)."""
import difflib
from typing import Dict, Sequence

from ssl_engine.hooks.base import SSLHook


def parse_frozen_params(entries: Sequence) -> Dict[str, int]:
    """``[[name, iterations], ...]`` -> {name: iterations}; names as the model's
    ``named_parameters()`` gives them (a leading ``module.``, as VISSL writes them, is dropped)."""
    frozen = {}
    for entry in entries:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ValueError("config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP entries are "
                             f"[parameter_name, iterations], got {entry!r}")
        name, iterations = str(entry[0]), int(entry[1])
        frozen[name[len("module."):] if name.startswith("module.") else name] = iterations
    return frozen


class FrozenParamsHook(SSLHook):
    """After the backward pass of update ``k``, the gradient of every parameter listed with
    ``n > k`` iterations is dropped, so the optimizer leaves it (and its momentum and weight
    decay) untouched."""

    def __init__(self, entries: Sequence):
        super().__init__()
        self.frozen = parse_frozen_params(entries)

    def on_start(self, task) -> None:
        names = [name for name, _ in task.base_model.named_parameters()]
        for name in self.frozen:
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise ValueError(f"config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP names '{name}', "
                                 f"which is not a parameter of the model{hint}")

    def on_backward(self, task) -> None:
        params = dict(task.base_model.named_parameters())
        for name, iterations in self.frozen.items():
            if task.iteration < iterations:
                params[name].grad = None
