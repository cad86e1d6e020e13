"""The frozen teacher of the distillation losses (``losses/distillation.py``)."""
import logging
from typing import Optional

import torch
from torch import nn

from ssl_engine.checkpoint.weights_init import check_weights_file, load_weights_init
from ssl_engine.config.teacher import teacher_model_config, teacher_weights_file
from ssl_engine.hooks.base import SSLHook
from ssl_engine.models.base_ssl_model import build_model, check_model_config, freeze
from ssl_engine.utils.device import float32_outputs

logger = logging.getLogger(__name__)


def _weights_config(cfg, model_cfg) -> dict:
    weights = dict(model_cfg.WEIGHTS_INIT)
    weights["PARAMS_FILE"] = teacher_weights_file(cfg)
    return weights


def check_teacher(cfg) -> None:
    """Before launch: the teacher's model builds (on the meta device) and its weights file
    exists and loads."""
    model_cfg = teacher_model_config(cfg)
    try:
        check_model_config(model_cfg)
    except ValueError as error:
        raise ValueError(f"config.DISTILLATION.TEACHER_MODEL: {error}") from None
    check_weights_file(_weights_config(cfg, model_cfg))


def build_teacher(cfg, device) -> nn.Module:
    """The teacher of ``cfg.DISTILLATION.TEACHER_MODEL``: built, loaded from its
    WEIGHTS_INIT.PARAMS_FILE, frozen, in eval mode, on ``device``."""
    model_cfg = teacher_model_config(cfg)
    weights = _weights_config(cfg, model_cfg)
    teacher = build_model(model_cfg)
    report = load_weights_init(teacher, weights)
    if report.missing:
        raise ValueError(f"config.DISTILLATION.TEACHER_MODEL: {weights['PARAMS_FILE']} does not "
                         f"hold every weight of the teacher; missing: {report.missing[:5]}")
    freeze(teacher)
    return teacher.eval().to(device)


class DistillationHook(SSLHook):
    """Holds the teacher (not checkpointed: it is rebuilt from its weights file).  It is built
    in ``on_start`` with DISTILLATION.eager_teacher_init, else before the first phase; after
    every forward pass the teacher runs on the crops the loss asks for
    (``loss.teacher_input``) and the loss receives its outputs (``loss.set_teacher_output``)."""

    def __init__(self):
        super().__init__()
        self.teacher: Optional[nn.Module] = None

    def _build(self, task) -> None:
        logger.info("building the distillation teacher from %s",
                    task.config.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.PARAMS_FILE)
        self.teacher = build_teacher(task.config, task.device)

    def on_start(self, task) -> None:
        if task.config.DISTILLATION.eager_teacher_init:
            self._build(task)

    def on_phase_start(self, task) -> None:
        if self.teacher is None:
            self._build(task)

    @torch.no_grad()
    def on_forward(self, task) -> None:
        inputs = task.loss.teacher_input(task.last_batch["input"])
        outputs = float32_outputs(self.teacher(inputs))
        task.loss.set_teacher_output(outputs, self.teacher)
