"""LARS (You et al. 2017) as Barlow Twins and VISSL's ``lars`` optimizer step it."""
from typing import Any, Dict

import torch

from ssl_engine.utils.classy import ClassyOptimizer, register_optimizer


class LARS(torch.optim.Optimizer):
    """SGD with momentum on layer-wise rescaled updates: for a parameter ``p`` with gradient
    ``g``, ``d = g + weight_decay * p``, then (unless ``exclude_bias_and_norm`` and ``p`` is
    one-dimensional: a bias or a norm's scale or shift) ``d *= eta * ||p|| / ||d||`` when both
    norms are positive; ``mu = momentum * mu + d``; ``p -= lr * mu``."""

    def __init__(self, params, lr: float = 0.1, momentum: float = 0.9,
                 weight_decay: float = 0.0, eta: float = 0.001,
                 exclude_bias_and_norm: bool = False):
        if eta < 0 or not 0.0 <= momentum < 1.0:
            raise ValueError(f"lars: eta must be >= 0 and momentum in [0, 1), got {eta} and "
                             f"{momentum}")
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                                  "eta": eta, "exclude_bias_and_norm": exclude_bias_and_norm})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                update = param.grad.add(param, alpha=group["weight_decay"])
                if not (group["exclude_bias_and_norm"] and param.ndim == 1):
                    param_norm, update_norm = torch.norm(param), torch.norm(update)
                    ratio = torch.where((param_norm > 0) & (update_norm > 0),
                                        group["eta"] * param_norm / update_norm,
                                        torch.ones_like(param_norm))
                    update = update.mul(ratio)
                state = self.state[param]
                if "mu" not in state:
                    state["mu"] = torch.zeros_like(param)
                state["mu"].mul_(group["momentum"]).add_(update)
                param.add_(state["mu"], alpha=-group["lr"])
        return loss


@register_optimizer("lars")
class ClassyLARS(ClassyOptimizer):
    """``OPTIMIZER.name: lars``: ``LARS`` with OPTIMIZER's momentum, weight_decay, eta and
    exclude_bias_and_norm."""

    def __init__(self, lr: float = 0.1, momentum: float = 0.9, weight_decay: float = 0.0,
                 eta: float = 0.001, exclude_bias_and_norm: bool = False):
        super().__init__()
        self._settings = {"lr": lr, "momentum": momentum, "weight_decay": weight_decay,
                          "eta": eta, "exclude_bias_and_norm": exclude_bias_and_norm}

    def prepare(self, param_groups) -> None:
        self.optimizer = LARS(param_groups, **self._settings)

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "ClassyLARS":
        return cls(**config)
