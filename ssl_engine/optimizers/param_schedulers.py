"""Translate ``OPTIMIZER.param_schedulers.lr`` (and ``.weight_decay``) into classy_vision param
schedulers.

A scheduler maps ``where`` (fraction of training done, in [0, 1)) to a value. Names:
``constant`` (value), ``linear`` / ``cosine`` (start_value, end_value), ``multistep`` (values,
milestones in epochs, num_epochs), ``step`` (values, num_epochs), ``composite`` (schedulers,
lengths, interval_scaling). ``update_interval: epoch`` holds the value for a whole epoch.
"""
import math
import warnings
from typing import Any, Callable, Dict, Mapping

from ssl_engine.utils.registry import lookup

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from classy_vision.optim.param_scheduler import (
        ClassyParamScheduler,
        CompositeParamScheduler,
        ConstantParamScheduler,
        CosineParamScheduler,
        LinearParamScheduler,
        MultiStepParamScheduler,
        ParamScheduler,
        StepParamScheduler,
        UpdateInterval,
    )

_EPOCH_EPSILON = 1e-9  # keeps where = k / num_epochs computed in floating point inside epoch k


def _require(cfg: Mapping[str, Any], key: str):
    if cfg.get(key) is None:
        raise ValueError(f"param scheduler '{cfg['name']}' needs the key '{key}'")
    return cfg[key]


def _epochs(cfg: Mapping[str, Any], num_epochs: int) -> int:
    return cfg.get("num_epochs") or num_epochs


def _composite(cfg: Mapping[str, Any], num_epochs: int) -> ParamScheduler:
    schedulers = [build_param_scheduler(sub, num_epochs) for sub in _require(cfg, "schedulers")]
    lengths = [float(length) for length in _require(cfg, "lengths")]
    scaling = list(cfg.get("interval_scaling") or ["rescaled"] * len(schedulers))
    if not len(schedulers) == len(lengths) == len(scaling):
        raise ValueError(
            f"composite param scheduler: schedulers ({len(schedulers)}), lengths ({len(lengths)}) "
            f"and interval_scaling ({len(scaling)}) must have the same length"
        )
    return CompositeParamScheduler(schedulers, lengths, scaling)


_BUILDERS: Dict[str, Callable[[Mapping[str, Any], int], ParamScheduler]] = {
    "constant": lambda cfg, n: ConstantParamScheduler(_require(cfg, "value")),
    "linear": lambda cfg, n: LinearParamScheduler(_require(cfg, "start_value"), _require(cfg, "end_value")),
    "cosine": lambda cfg, n: CosineParamScheduler(_require(cfg, "start_value"), _require(cfg, "end_value")),
    "multistep": lambda cfg, n: MultiStepParamScheduler(
        list(_require(cfg, "values")), _epochs(cfg, n), list(_require(cfg, "milestones"))
    ),
    "step": lambda cfg, n: StepParamScheduler(_epochs(cfg, n), list(_require(cfg, "values"))),
    "composite": _composite,
}


def param_scheduler_names():
    """The names a param scheduler's ``name`` may take."""
    return sorted(_BUILDERS)


def build_param_scheduler(scheduler_cfg: Mapping[str, Any], num_epochs: int) -> ParamScheduler:
    """The scheduler described by ``scheduler_cfg`` (``num_epochs``: default for multistep/step)."""
    builder = lookup(_BUILDERS, scheduler_cfg.get("name"), "param scheduler")
    return builder(scheduler_cfg, num_epochs)


class EpochQuantizedScheduler(ClassyParamScheduler):
    """``inner`` evaluated at the start of the current epoch: ``floor(where * E) / E``.

    Its classy update interval is STEP so that the optimizer asks for the value before every
    step; the value itself only changes at epoch boundaries.
    """

    def __init__(self, inner: ParamScheduler, num_epochs: int):
        super().__init__(UpdateInterval.STEP)
        if num_epochs <= 0:
            raise ValueError(f"num_epochs must be > 0, got {num_epochs}")
        self.inner = inner
        self.num_epochs = int(num_epochs)

    def __call__(self, where: float) -> float:
        epoch = math.floor(where * self.num_epochs + _EPOCH_EPSILON)
        return self.inner(epoch / self.num_epochs)


def build_scheduled_param(optimizer_cfg: Mapping[str, Any], key: str) -> ClassyParamScheduler:
    """The schedule ``cfg.OPTIMIZER.param_schedulers.<key>`` (lr, weight_decay): a callable
    ``where -> value`` that the optimizer evaluates before every step."""
    param_cfg = optimizer_cfg["param_schedulers"][key]
    num_epochs = optimizer_cfg["num_epochs"]
    scheduler = build_param_scheduler(param_cfg, num_epochs)
    interval = param_cfg.get("update_interval", "step")
    if interval == "epoch":
        return EpochQuantizedScheduler(scheduler, num_epochs)
    if interval != "step":
        raise ValueError(f"OPTIMIZER.param_schedulers.{key}.update_interval must be step or "
                         f"epoch, got '{interval}'")
    scheduler.update_interval = UpdateInterval.STEP
    return scheduler


def build_lr_scheduler(optimizer_cfg: Mapping[str, Any]) -> ClassyParamScheduler:
    """The learning-rate schedule of ``cfg.OPTIMIZER``: a callable ``where -> lr``."""
    return build_scheduled_param(optimizer_cfg, "lr")
