"""``build_optimizer``: a classy_vision optimizer with param groups, lr schedule, LARC and
ZeRO (OPTIMIZER.use_zero: fairscale's OSS shards the optimizer state over the ranks)."""
import logging
from typing import Any, Callable, Dict, Mapping, Optional

import torch
import torch.nn as nn

from ssl_engine.models.fsdp_names import FSDP_OPTIMIZERS
from ssl_engine.optimizers import lars  # noqa: F401  (registers the lars optimizer)
from ssl_engine.optimizers.larc import LARC
from ssl_engine.optimizers.param_groups import get_optimizer_param_groups
from ssl_engine.optimizers.param_schedulers import (ClassyParamScheduler, build_lr_scheduler,
                                                    build_scheduled_param)
from ssl_engine.optimizers.weight_decay import build_weight_decay_scheduler
from ssl_engine.utils.classy import OPTIMIZER_REGISTRY, ClassyOptimizer
from ssl_engine.utils.distributed import is_distributed
from ssl_engine.utils.registry import lookup

logger = logging.getLogger(__name__)


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
    "lars": lambda cfg: {"momentum": float(cfg["momentum"]), "weight_decay": float(cfg["weight_decay"]),
                         "eta": float(cfg["eta"]),
                         "exclude_bias_and_norm": bool(cfg["exclude_bias_and_norm"])},
}


def optimizer_names():
    """The names OPTIMIZER.name may take (VISSL's sgd_fsdp among them: see ordinary_optimizer)."""
    return sorted([*_CLASSY_SETTINGS, *FSDP_OPTIMIZERS])


def ordinary_optimizer(name: str) -> str:
    """The optimizer an OPTIMIZER.name builds: VISSL's sgd_fsdp is SGD (its FSDP-aware LARC is
    the engine's LARC, which takes the norms of sharded parameters whole), others are
    themselves."""
    if name in FSDP_OPTIMIZERS:
        logger.info("optimizer %s: built as the ordinary %s", name, FSDP_OPTIMIZERS[name])
        return FSDP_OPTIMIZERS[name]
    return name


class SSLOptimizer:
    """A classy_vision optimizer stepped with ``where``, the fraction of training done.

    ``step(where)`` first sets the lr of every param group (and, with
    ``param_schedulers.weight_decay``, the weight decay of the regularised one) from the
    schedule at ``where``.
    """

    def __init__(self, classy_optimizer: ClassyOptimizer):
        self.classy_optimizer = classy_optimizer
        # zero_grad sets gradients to None (torch's default) unless this is set: under
        # ShardedDataParallel they are views into its reduce buckets and must be kept
        self.zero_grads_in_place = False

    @property
    def param_groups(self):
        return self.classy_optimizer.param_groups

    def zero_grad(self) -> None:
        self.classy_optimizer.optimizer.zero_grad(set_to_none=not self.zero_grads_in_place)

    def step(self, where: float) -> None:
        self.classy_optimizer.step(where=where)

    def get_lr(self) -> float:
        return self.param_groups[0]["lr"]

    @property
    def sharded(self):
        """The fairscale OSS optimizer when OPTIMIZER.use_zero shards the state, else None."""
        return sharded_optimizer(self.classy_optimizer.optimizer)

    def get_classy_state(self) -> Dict[str, Any]:
        """Optimizer state (momentum buffers, Adam moments, step counts, group settings).

        With OPTIMIZER.use_zero every rank holds a shard: all ranks must call this (as the
        checkpoint hook does); the whole state, in torch's layout (loadable with or without
        ZeRO, on any number of processes), is assembled on rank 0, the one that saves it.
        The other ranks get None."""
        oss = self.sharded
        if oss is not None:
            oss.consolidate_state_dict(recipient_rank=0)
            if oss.rank != 0:
                return None
        return self.classy_optimizer.get_classy_state()

    def set_classy_state(self, state: Dict[str, Any]) -> None:
        self.classy_optimizer.set_classy_state(state)


class ScaledParamScheduler(ClassyParamScheduler):
    """``multiplier`` times ``inner``'s value, evaluated as often as ``inner``."""

    def __init__(self, inner: ClassyParamScheduler, multiplier: float):
        super().__init__(inner.update_interval)
        self.inner, self.multiplier = inner, float(multiplier)

    def __call__(self, where: float) -> float:
        return self.multiplier * self.inner(where)


def check_lr_multipliers(pairs, model: nn.Module) -> list:
    """OPTIMIZER.lr_multipliers as ``[prefix, multiplier]`` pairs, each prefix naming at least
    one trainable parameter of ``model``."""
    names = [name for name, param in model.named_parameters() if param.requires_grad]
    checked = []
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2 or \
                not isinstance(pair[1], (int, float)) or isinstance(pair[1], bool) or pair[1] < 0:
            raise ValueError("OPTIMIZER.lr_multipliers entries are [parameter name prefix, "
                             f"multiplier >= 0], e.g. [heads.1, 10.0]; got {pair!r}")
        prefix = str(pair[0]).removeprefix("module.")
        if not any(name == prefix or name.startswith(prefix + ".") for name in names):
            tops = sorted({".".join(name.split(".")[:2]) for name in names})
            raise ValueError(f"OPTIMIZER.lr_multipliers: no trainable parameter is named "
                             f"'{prefix}' or under it; the model's start with {tops}")
        checked.append([prefix, float(pair[1])])
    return checked


def sharded_optimizer(optimizer) -> Optional[Any]:
    """The OSS instance in ``optimizer`` (itself or the one LARC wraps), else None."""
    from fairscale.optim.oss import OSS

    inner = getattr(optimizer, "optim", None) if isinstance(optimizer, LARC) else optimizer
    return inner if isinstance(inner, OSS) else None


def shard_state(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """ZeRO stage 1: ``optimizer`` re-created as fairscale's OSS, which keeps on each rank the
    state of its share of the parameters and broadcasts the updated ones after each step; the
    same param groups and settings.  Unchanged with one process."""
    if not is_distributed():
        logger.info("OPTIMIZER.use_zero: one process, nothing to shard")
        return optimizer
    from fairscale.optim.oss import OSS

    groups = [dict(group) for group in optimizer.param_groups]
    oss = OSS(groups, optim=type(optimizer), **optimizer.defaults)
    mine = [p for group in oss.partition_parameters()[oss.rank] for p in group["params"]]
    every = [p for group in oss.param_groups for p in group["params"]]
    logger.info("OPTIMIZER.use_zero: rank %d keeps the optimizer state of %d of %d parameter "
                "tensors (%d of %d values)", oss.rank, len(mine), len(every),
                sum(p.numel() for p in mine), sum(p.numel() for p in every))
    return oss


def build_optimizer(optimizer_cfg: Mapping[str, Any], model: nn.Module) -> SSLOptimizer:
    """The optimizer ``cfg.OPTIMIZER`` describes, over ``model``'s trainable parameters."""
    name = ordinary_optimizer(optimizer_cfg["name"])
    settings = lookup(_CLASSY_SETTINGS, name, "optimizer")(optimizer_cfg)
    classy_optimizer = OPTIMIZER_REGISTRY[name].from_config(settings)
    weight_decay = build_weight_decay_scheduler(optimizer_cfg)
    heads = optimizer_cfg.get("head_optimizer_params") or {}
    param_groups = get_optimizer_param_groups(
        model,
        weight_decay=optimizer_cfg["weight_decay"] if weight_decay is None else weight_decay,
        regularize_bn=optimizer_cfg["regularize_bn"],
        regularize_bias=optimizer_cfg["regularize_bias"],
        lr_multipliers=check_lr_multipliers(optimizer_cfg.get("lr_multipliers") or [], model),
        single_group=bool(optimizer_cfg.get("construct_single_param_group_only", False)),
        constructor=optimizer_cfg.get("param_group_constructor", "default"),
        linear_eval_heads=list(optimizer_cfg.get("linear_eval_heads") or []),
        non_regularized=list(optimizer_cfg.get("non_regularized_parameters") or []),
        lr_decay=float((optimizer_cfg.get("layer_wise_lr_decay") or {}).get("decay", 0.9)),
        separate_heads=bool(heads.get("use_different_lr", False)),
        head_weight_decay=heads["weight_decay"] if heads.get("use_different_wd", False) else None,
    )
    lr = build_lr_scheduler(optimizer_cfg)
    # OPTIMIZER.head_optimizer_params.use_different_lr: the heads follow param_schedulers.lr_head
    lr_head = build_scheduled_param(optimizer_cfg, "lr_head") if heads.get(
        "use_different_lr", False) else lr
    for group in param_groups:  # each group's own lr schedule (classy evaluates it per step)
        multiplier, schedule = group.pop("lr_multiplier"), lr_head if group.pop("head", False) else lr
        group["lr"] = schedule if multiplier == 1.0 else ScaledParamScheduler(schedule, multiplier)
    classy_optimizer.set_param_groups(param_groups)
    if optimizer_cfg.get("use_zero", False):
        classy_optimizer.optimizer = shard_state(classy_optimizer.optimizer)
    if optimizer_cfg.get("use_larc", False):
        larc_cfg = optimizer_cfg["larc_config"]
        classy_optimizer.optimizer = LARC(
            classy_optimizer.optimizer,
            trust_coefficient=larc_cfg["trust_coefficient"],
            clip=larc_cfg["clip"],
            eps=larc_cfg["eps"],
        )
    return SSLOptimizer(classy_optimizer)
