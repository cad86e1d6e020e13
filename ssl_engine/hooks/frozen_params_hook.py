"""``MODEL.TEMP_FROZEN_PARAMS_ITER_MAP``: parameters that stay frozen for their first updates
(SwAV's prototypes for the first epoch, DINO's last layer)."""
import difflib
from typing import Dict, Sequence

from torch import nn

from ssl_engine.hooks.base import SSLHook


KEY = "config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP"
# the modules fairscale's FSDP wrappers insert into parameter names (VISSL's FSDP models)
FSDP_WRAPPER_PARTS = ("_fsdp_wrapped_module", "_fpw_module")


def plain_parameter_name(name: str) -> str:
    """``name`` as the model's ``named_parameters()`` gives it: without a leading ``module.``
    (DDP's, as VISSL writes names) and without fairscale's FSDP wrapper parts
    (``_fsdp_wrapped_module.``, ``_fpw_module.``), which the engine's models do not have."""
    parts = [part for part in name.split(".") if part not in FSDP_WRAPPER_PARTS]
    if parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


def parse_frozen_params(entries: Sequence) -> Dict[str, int]:
    """``[[name, iterations], ...]`` -> {name: iterations}; names as the model's
    ``named_parameters()`` gives them (``plain_parameter_name``)."""
    frozen = {}
    for entry in entries:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise ValueError(f"{KEY} entries are [parameter_name, iterations], got {entry!r}")
        frozen[plain_parameter_name(str(entry[0]))] = int(entry[1])
    return frozen


def check_frozen_params(entries: Sequence, model: nn.Module) -> Dict[str, int]:
    """The parsed map; ValueError naming the first entry that is no parameter of ``model``
    (with the closest name).  Called before launch (engines/train.py, on the model built on
    the meta device) and by the hook when the run starts."""
    frozen = parse_frozen_params(entries)
    # every name, also the second name of a shared module (ibot_head's shared prototypes)
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    for name in frozen:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(f"{KEY} names '{name}', which is not a parameter of the "
                             f"model{hint}")
    return frozen


class FrozenParamsHook(SSLHook):
    """After the backward pass of update ``k``, the gradient of every parameter listed with
    ``n > k`` iterations is dropped, so the optimizer leaves it (and its momentum and weight
    decay) untouched."""

    def __init__(self, entries: Sequence):
        super().__init__()
        self.entries = list(entries)
        self.frozen = parse_frozen_params(entries)

    def on_start(self, task) -> None:
        check_frozen_params(self.entries, task.base_model)

    def on_backward(self, task) -> None:
        params = dict(task.base_model.named_parameters(remove_duplicate=False))
        for name, iterations in self.frozen.items():
            if task.iteration < iterations:
                params[name].grad = None
