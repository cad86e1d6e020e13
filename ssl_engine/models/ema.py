"""Exponential moving averages of weights: the one update rule the engine uses
(``ema_update_``), and ``ModelEMA``, an averaged copy of a whole model (HOOKS.EMA_MODEL).

The momentum target networks of MoCo, BYOL and DINO (``losses/momentum_target.py``) move with
the same ``ema_update_``.
"""
import copy
from typing import Dict, List, Sequence

import torch

from ssl_engine.models.base_ssl_model import freeze


@torch.no_grad()
def ema_update_(averages: List[torch.Tensor], values: Sequence[torch.Tensor],
                decay: float) -> None:
    """In place, for each pair: ``average = decay * average + (1 - decay) * value``."""
    if not averages:
        return
    torch._foreach_mul_(averages, decay)
    torch._foreach_add_(averages, list(values), alpha=1.0 - decay)


class ModelEMA:
    """A frozen copy of a model (``module``, on ``device``) whose floating-point parameters and
    buffers (batch-norm statistics) follow the model as an exponential moving average; integer
    buffers (batch-norm's counters) are copied.  Its state is the model's classy state."""

    def __init__(self, model: torch.nn.Module, decay: float, device: torch.device):
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"the EMA decay must be in [0, 1], got {decay}")
        self.decay = float(decay)
        self.device = torch.device(device)
        self.module = copy.deepcopy(model).to(self.device)
        freeze(self.module)
        self.module.eval()

    def _pairs(self, model: torch.nn.Module):
        """(average, value on the average's device) for every entry of the state dict."""
        values: Dict[str, torch.Tensor] = model.state_dict()
        for name, average in self.module.state_dict().items():
            yield average, values[name].detach().to(self.device)

    @torch.no_grad()
    def set(self, model: torch.nn.Module) -> None:
        """The average becomes a copy of ``model``'s weights."""
        for average, value in self._pairs(model):
            average.copy_(value)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """One step of the average towards ``model``'s weights."""
        averages, values = [], []
        for average, value in self._pairs(model):
            if average.is_floating_point():
                averages.append(average)
                values.append(value)
            else:
                average.copy_(value)
        ema_update_(averages, values, self.decay)

    def get_classy_state(self) -> dict:
        return self.module.get_classy_state()

    def set_classy_state(self, state: dict) -> None:
        self.module.set_classy_state(state)


def ema_model_enabled(cfg) -> bool:
    """Whether a training run keeps HOOKS.EMA_MODEL's average (SAVE_EMA_MODEL or
    ENABLE_EMA_METERS on)."""
    ema_cfg = cfg.HOOKS.EMA_MODEL
    return bool(ema_cfg.SAVE_EMA_MODEL or ema_cfg.ENABLE_EMA_METERS) and not cfg.TEST_ONLY
