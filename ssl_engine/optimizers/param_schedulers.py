"""Translate ``OPTIMIZER.param_schedulers.lr`` (and ``.weight_decay``) into classy_vision param
schedulers.

A scheduler maps ``where`` (fraction of training done, in [0, 1)) to a value. Names:
``constant`` (value), ``linear`` / ``cosine`` (start_value, end_value), ``multistep`` (values,
milestones in epochs, num_epochs), ``step`` (values, num_epochs), ``composite`` (schedulers,
lengths, interval_scaling), ``cosine_warm_restart`` (start_value, end_value,
restart_interval_length, wave_type, lr_multiplier, is_adaptive: cosine waves restarted at
fixed fractions of training). ``update_interval: epoch`` holds the value for a whole epoch.
"""
import bisect
import math
from typing import Any, Callable, Dict, Mapping

from ssl_engine.utils.classy import (
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
from ssl_engine.utils.registry import lookup

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


class CosineWarmRestartParamScheduler(ParamScheduler):
    """Cosine waves from a peak down to ``end_value``, restarted every ``restart_interval_length``
    (a fraction of the schedule), as VISSL's ``cosine_warm_restart``.

    ``wave_type: half``: each interval ``[k L, (k + 1) L)`` is one half cosine from the peak of
    restart k down to ``end_value``.  ``wave_type: full``: ``cos(pi * where / L)`` runs on without
    resetting ``where`` (down over ``[0, L)``, up and down again over ``[L, 3 L)``, ...); the
    peak changes at the troughs ``L, 3 L, 5 L, ...``, where the value is ``end_value`` whatever
    the peak.  The peak of restart k is ``start_value * lr_multiplier ** k``; with
    ``is_adaptive`` it is instead the value that a single cosine from ``start_value`` to
    ``end_value`` over the whole schedule takes at the restart (half: at ``k L``; full: at
    ``L + t_k`` where ``t_k`` is the restart's start, so already restart 0 peaks below
    ``start_value``, as in VISSL).
    """

    WAVE_TYPES = ("half", "full")

    def __init__(self, start_value: float, end_value: float, restart_interval_length: float,
                 wave_type: str = "half", lr_multiplier: float = 1.0, is_adaptive: bool = False):
        if wave_type not in self.WAVE_TYPES:
            raise ValueError(f"param scheduler 'cosine_warm_restart': wave_type must be half or "
                             f"full, got '{wave_type}'")
        if not 0 < restart_interval_length <= 1:
            raise ValueError("param scheduler 'cosine_warm_restart': restart_interval_length is "
                             "the fraction of the schedule between restarts and must be in "
                             f"(0, 1], got {restart_interval_length}")
        self.start_value = float(start_value)
        self.end_value = float(end_value)
        self.interval = float(restart_interval_length)
        self.wave_type = wave_type
        # where each restart begins: every L (half waves), or at the troughs L, 3L, 5L (full)
        first, spacing = (self.interval, self.interval) if wave_type == "half" else (
            self.interval, 2 * self.interval)
        self.restarts = [0.0]
        while first + (len(self.restarts) - 1) * spacing < 1.0:
            self.restarts.append(first + (len(self.restarts) - 1) * spacing)
        if is_adaptive:
            shift = 0.0 if wave_type == "half" else self.interval
            self.peaks = [self._single_cosine(start + shift) for start in self.restarts]
        else:
            self.peaks = [self.start_value * float(lr_multiplier) ** k
                          for k in range(len(self.restarts))]

    def _single_cosine(self, where: float) -> float:
        return self.end_value + 0.5 * (self.start_value - self.end_value) * (
            1 + math.cos(math.pi * where))

    def __call__(self, where: float) -> float:
        peak = self.peaks[max(bisect.bisect(self.restarts, where) - 1, 0)]
        if self.wave_type == "half":
            phase = (where % self.interval) / self.interval
        else:
            phase = where / self.interval
        return self.end_value + 0.5 * (peak - self.end_value) * (1 + math.cos(math.pi * phase))


def _cosine_warm_restart(cfg: Mapping[str, Any], num_epochs: int) -> ParamScheduler:
    is_adaptive = bool(cfg.get("is_adaptive") or False)
    lr_multiplier = cfg.get("lr_multiplier")
    if is_adaptive and lr_multiplier not in (None, 1, 1.0):
        raise ValueError(
            "param scheduler 'cosine_warm_restart': is_adaptive computes the peak of every "
            f"restart itself, so lr_multiplier={lr_multiplier} would be ignored; remove "
            "lr_multiplier or set is_adaptive: false")
    return CosineWarmRestartParamScheduler(
        _require(cfg, "start_value"), _require(cfg, "end_value"),
        _require(cfg, "restart_interval_length"), _require(cfg, "wave_type"),
        1.0 if lr_multiplier is None else lr_multiplier, is_adaptive)


_BUILDERS: Dict[str, Callable[[Mapping[str, Any], int], ParamScheduler]] = {
    "constant": lambda cfg, n: ConstantParamScheduler(_require(cfg, "value")),
    "linear": lambda cfg, n: LinearParamScheduler(_require(cfg, "start_value"), _require(cfg, "end_value")),
    "cosine": lambda cfg, n: CosineParamScheduler(_require(cfg, "start_value"), _require(cfg, "end_value")),
    "multistep": lambda cfg, n: MultiStepParamScheduler(
        list(_require(cfg, "values")), _epochs(cfg, n), list(_require(cfg, "milestones"))
    ),
    "step": lambda cfg, n: StepParamScheduler(_epochs(cfg, n), list(_require(cfg, "values"))),
    "composite": _composite,
    "cosine_warm_restart": _cosine_warm_restart,
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


# the settings that hold a schedule's values, per scheduler name (composite: its schedulers')
_VALUE_KEYS = {"constant": ("value",), "linear": ("start_value", "end_value"),
               "cosine": ("start_value", "end_value"), "multistep": ("values",),
               "step": ("values",),
               "cosine_warm_restart": ("start_value", "end_value", "lr_multiplier")}
_SAMPLES = 10000  # points of the schedule looked at, besides its settings


def _negative_settings(scheduler_cfg: Mapping[str, Any], path: str) -> list:
    """``<path>.<key>=<value>`` of each negative value setting the schedule uses."""
    found = []
    base = (scheduler_cfg.get("auto_lr_scaling") or {}).get("base_value")
    if base is not None and base < 0:
        found.append(f"{path}.auto_lr_scaling.base_value={base}")
    for key in _VALUE_KEYS.get(scheduler_cfg.get("name"), ()):
        value = scheduler_cfg.get(key)
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(v is not None and v < 0 for v in values):
            found.append(f"{path}.{key}={value}")
    for index, sub in enumerate(scheduler_cfg.get("schedulers") or []):
        found += _negative_settings(sub, f"{path}.schedulers[{index}]")
    return found


def check_lr_not_negative(optimizer_cfg: Mapping[str, Any]) -> None:
    """Before launch: the lr schedules (``lr``, and ``lr_head`` when the heads use it) never
    give a negative learning rate, which would step up the gradient (ValueError naming the
    setting)."""
    keys = ["lr"]
    if (optimizer_cfg.get("head_optimizer_params") or {}).get("use_different_lr", False):
        keys.append("lr_head")
    for key in keys:
        path = f"config.OPTIMIZER.param_schedulers.{key}"
        settings = _negative_settings(optimizer_cfg["param_schedulers"][key], path)
        schedule = build_scheduled_param(optimizer_cfg, key)
        where, lowest = min(((i / _SAMPLES, schedule(i / _SAMPLES)) for i in range(_SAMPLES)),
                            key=lambda point: point[1])
        if settings or lowest < 0:
            name = optimizer_cfg["param_schedulers"][key].get("name")
            what = "; ".join(settings) or f"{path} ({name})"
            gives = (f" (the schedule gives {lowest:.3g} at {where:.0%} of training)"
                     if lowest < 0 else "")
            raise ValueError(f"{what}: a negative learning rate{gives} steps up the gradient, so "
                             "the loss climbs; give learning rates of 0 or more")
