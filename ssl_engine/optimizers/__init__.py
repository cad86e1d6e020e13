"""Optimizers (classy_vision's sgd / adam / adamw), param groups, LARC and lr schedules."""
from ssl_engine.optimizers.larc import LARC
from ssl_engine.optimizers.lr_scaling import apply_auto_lr_scaling
from ssl_engine.optimizers.param_groups import get_optimizer_param_groups
from ssl_engine.optimizers.param_schedulers import (
    EpochQuantizedScheduler,
    build_lr_scheduler,
    build_param_scheduler,
)
from ssl_engine.optimizers.ssl_optimizer import SSLOptimizer, build_optimizer

__all__ = [
    "LARC",
    "SSLOptimizer",
    "EpochQuantizedScheduler",
    "apply_auto_lr_scaling",
    "build_lr_scheduler",
    "build_optimizer",
    "build_param_scheduler",
    "get_optimizer_param_groups",
]
