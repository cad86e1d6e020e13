"""``build_optimizer``: a classy_vision optimizer with param groups, lr schedule and LARC."""
import warnings
from typing import Any, Callable, Dict, Mapping

import torch.nn as nn

from ssl_engine.optimizers.larc import LARC
from ssl_engine.optimizers.param_groups import get_optimizer_param_groups
from ssl_engine.optimizers.param_schedulers import build_lr_scheduler
from ssl_engine.optimizers.weight_decay import build_weight_decay_scheduler
from ssl_engine.utils.registry import lookup

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from classy_vision.optim import OPTIMIZER_REGISTRY, ClassyOptimizer


def _betas(cfg: Mapping[str, Any]):
    return tuple(float(beta) for beta in cfg["betas"])


# cfg.OPTIMIZER -> the settings of classy_vision's optimizer of the same name. LARC is applied
# by this module (classy's own LARC path needs apex), so classy's use_larc stays off.
_CLASSY_SETTINGS: Dict[str, Callable[[Mapping[str, Any]], Dict[str, Any]]] = {
    "sgd": lambda cfg: {
        "momentum": float(cfg["momentum"]),
        "nesterov": bool(cfg["nesterov"]),
        "weight_decay": float(cfg["weight_decay"]),
        "use_larc": False,
    },
    "adam": lambda cfg: {"betas": _betas(cfg), "eps": float(cfg["eps"]), "weight_decay": float(cfg["weight_decay"])},
    "adamw": lambda cfg: {"betas": _betas(cfg), "eps": float(cfg["eps"]), "weight_decay": float(cfg["weight_decay"])},
}


class SSLOptimizer:
    """A classy_vision optimizer stepped with ``where``, the fraction of training done.

    ``step(where)`` first sets the lr of every param group (and, with
    ``param_schedulers.weight_decay``, the weight decay of the regularised one) from the
    schedule at ``where``.
    """

    def __init__(self, classy_optimizer: ClassyOptimizer):
        self.classy_optimizer = classy_optimizer

    @property
    def param_groups(self):
        return self.classy_optimizer.param_groups

    def zero_grad(self) -> None:
        self.classy_optimizer.zero_grad()

    def step(self, where: float) -> None:
        self.classy_optimizer.step(where=where)

    def get_lr(self) -> float:
        return self.param_groups[0]["lr"]

    def get_classy_state(self) -> Dict[str, Any]:
        """Optimizer state (momentum buffers, Adam moments, step counts, group settings)."""
        return self.classy_optimizer.get_classy_state()

    def set_classy_state(self, state: Dict[str, Any]) -> None:
        self.classy_optimizer.set_classy_state(state)


def build_optimizer(optimizer_cfg: Mapping[str, Any], model: nn.Module) -> SSLOptimizer:
    """The optimizer ``cfg.OPTIMIZER`` describes, over ``model``'s trainable parameters."""
    name = optimizer_cfg["name"]
    settings = lookup(_CLASSY_SETTINGS, name, "optimizer")(optimizer_cfg)
    classy_optimizer = OPTIMIZER_REGISTRY[name].from_config(settings)
    weight_decay = build_weight_decay_scheduler(optimizer_cfg)
    param_groups = get_optimizer_param_groups(
        model,
        weight_decay=optimizer_cfg["weight_decay"] if weight_decay is None else weight_decay,
        regularize_bn=optimizer_cfg["regularize_bn"],
        regularize_bias=optimizer_cfg["regularize_bias"],
    )
    classy_optimizer.set_param_groups(param_groups, lr=build_lr_scheduler(optimizer_cfg))
    if optimizer_cfg.get("use_larc", False):
        larc_cfg = optimizer_cfg["larc_config"]
        classy_optimizer.optimizer = LARC(
            classy_optimizer.optimizer,
            trust_coefficient=larc_cfg["trust_coefficient"],
            clip=larc_cfg["clip"],
            eps=larc_cfg["eps"],
        )
    return SSLOptimizer(classy_optimizer)
