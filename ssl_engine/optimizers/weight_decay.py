"""``OPTIMIZER.param_schedulers.weight_decay``: a schedule of the weight decay (VISSL's key;
DINO's cosine from 0.04 to 0.4), for any optimizer and method.

It takes the scheduler names and ``update_interval`` of ``param_schedulers.lr`` and is applied
the same way: the regularised param group holds the schedule, which the optimizer evaluates at
``where`` (the fraction of training done) before every step, so a resumed run continues at the
exact position.  Unregularised groups (norm layers, biases: ``regularize_bn``,
``regularize_bias``) keep weight decay 0.  Without a ``name`` (the default) the weight decay is
the constant ``OPTIMIZER.weight_decay``.
"""
from typing import Any, Mapping, Optional

from ssl_engine.optimizers.param_schedulers import ClassyParamScheduler, build_scheduled_param

KEY = "config.OPTIMIZER.param_schedulers.weight_decay"
# settings that only a named scheduler reads
VALUE_KEYS = ("value", "values", "milestones", "num_epochs", "start_value", "end_value",
              "schedulers", "lengths", "interval_scaling", "restart_interval_length",
              "wave_type", "lr_multiplier")


def build_weight_decay_scheduler(
        optimizer_cfg: Mapping[str, Any]) -> Optional[ClassyParamScheduler]:
    """The schedule ``where -> weight decay``, or None when ``weight_decay`` has no ``name``
    (the constant ``OPTIMIZER.weight_decay`` then applies).  Settings given without a name are
    refused rather than ignored."""
    wd_cfg = (optimizer_cfg.get("param_schedulers") or {}).get("weight_decay") or {}
    if not wd_cfg.get("name"):
        given = [key for key in VALUE_KEYS if wd_cfg.get(key) not in (None, [], ())]
        if given:
            raise ValueError(f"{KEY} sets {', '.join(given)} but no name: give "
                             f"{KEY}.name (e.g. cosine), or remove the settings to keep the "
                             "constant config.OPTIMIZER.weight_decay")
        return None
    try:
        return build_scheduled_param(optimizer_cfg, "weight_decay")
    except (ValueError, KeyError, TypeError, AssertionError) as error:
        raise ValueError(f"{KEY}: {error}") from None
