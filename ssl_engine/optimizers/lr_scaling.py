"""Linear scaling of the learning-rate schedule with the global batch size."""
import copy
import logging
from typing import Any, MutableMapping

logger = logging.getLogger(__name__)

LR_VALUE_KEYS = ("value", "values", "start_value", "end_value")
# the lr schedules, each scaled by its own auto_lr_scaling (lr_head: the heads' schedule of
# OPTIMIZER.head_optimizer_params.use_different_lr)
SCALED_SCHEDULES = ("lr", "lr_head")


def _scale_schedule(scheduler_cfg: MutableMapping[str, Any], factor: float, path: str) -> None:
    for key in LR_VALUE_KEYS:
        old = scheduler_cfg.get(key)
        if old is None:
            continue
        new = [v * factor for v in old] if isinstance(old, (list, tuple)) else old * factor
        scheduler_cfg[key] = new
        logger.info("auto lr scaling: %s.%s %s -> %s", path, key, old, new)
    for index, sub in enumerate(scheduler_cfg.get("schedulers") or []):
        _scale_schedule(sub, factor, f"{path}.schedulers[{index}]")


def apply_auto_lr_scaling(optimizer_cfg, global_batch_size: int):
    """A copy of ``optimizer_cfg`` whose lr values are scaled by global_batch_size / base_lr_batch_size.

    Acts on ``param_schedulers.lr`` (and ``lr_head``) when its ``auto_lr_scaling.auto_scale``
    is true; every lr value
    (value, values, start_value, end_value, also inside composite schedulers) is multiplied.
    The copy has ``auto_scale`` set to false so that scaling it again changes nothing.
    """
    scaled = copy.deepcopy(optimizer_cfg)
    for key in SCALED_SCHEDULES:
        lr_cfg = scaled["param_schedulers"].get(key)
        scaling = (lr_cfg or {}).get("auto_lr_scaling") or {}
        if not scaling.get("auto_scale", False):
            continue
        base_batch_size = scaling["base_lr_batch_size"]
        if base_batch_size <= 0 or global_batch_size <= 0:
            raise ValueError(f"auto lr scaling needs positive batch sizes, got global "
                             f"{global_batch_size}, base {base_batch_size}")
        factor = global_batch_size / base_batch_size
        logger.info("auto lr scaling of %s: global batch %d / base batch %d = factor %g",
                    key, global_batch_size, base_batch_size, factor)
        _scale_schedule(lr_cfg, factor, f"OPTIMIZER.param_schedulers.{key}")
        scaling["auto_scale"] = False
    return scaled
