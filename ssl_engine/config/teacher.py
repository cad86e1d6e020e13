"""The frozen teacher of the distillation losses: its model settings.

``DISTILLATION.TEACHER_MODEL`` holds MODEL's keys (VISSL's layout): the teacher's model config is
MODEL's defaults from defaults.yaml (not the student's values) with TEACHER_MODEL's keys merged
in, so a teacher naming only ``TRUNK.NAME`` and ``RESNETS.DEPTH`` gets every other trunk
setting at its default."""
import copy
from typing import Any, Mapping

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.compose import load_defaults

NOT_SET = "please specify teacher model weights"  # VISSL's default PARAMS_FILE


def _merged(base: dict, extra: Mapping[str, Any]) -> dict:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = _merged(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def teacher_model_config(cfg) -> AttrDict:
    """The teacher's MODEL settings: MODEL's defaults updated with DISTILLATION.TEACHER_MODEL."""
    model = load_defaults()["config"]["MODEL"]
    return AttrDict(_merged(model, dict(cfg.DISTILLATION.TEACHER_MODEL)))


def teacher_weights_file(cfg) -> str:
    """DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE, or a ValueError when it is not set
    to a file (a distillation needs the teacher's trained weights)."""
    path = str(cfg.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.get("PARAMS_FILE") or "")
    if not path or path == NOT_SET or path.startswith("please "):
        raise ValueError(
            f"config.LOSS.name={cfg.LOSS.name} distils a frozen teacher: set "
            "config.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE to the teacher's "
            f"checkpoint (got '{path}')")
    return path
