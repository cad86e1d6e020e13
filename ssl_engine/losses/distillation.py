"""Distillation from a frozen teacher: the base of the ``*_distillation_loss`` losses, VISSL's
``distillation_loss`` (soft targets of a classifier) and ``dino_distillation_loss``.

The teacher is the model of ``DISTILLATION.TEACHER_MODEL`` with the weights of its
``WEIGHTS_INIT.PARAMS_FILE``; ``DistillationHook`` holds it and, after every forward pass of the
student, runs it on the crops ``teacher_input`` picks and hands its outputs to
``set_teacher_output``.  The teacher is not trained and not checkpointed.
"""
import logging
from typing import List, Optional

import torch
import torch.nn.functional as F

from ssl_engine.config.derive import crops_per_sample
from ssl_engine.hooks.distillation_hook import DistillationHook
from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.losses.teacher_student import Inputs, crop_pairs, first_crops
from ssl_engine.utils.classy import register_loss

logger = logging.getLogger(__name__)


class TeacherLoss(SSLLoss):
    """A loss computed against a frozen teacher's outputs on the same batch."""

    def __init__(self):
        super().__init__()
        self._teacher_output: Optional[List[torch.Tensor]] = None

    @classmethod
    def derive_config(cls, cfg) -> None:
        """The student's crops (``crops_key``) from the training transforms, said once when the
        config gives others: VISSL's configs set them by hand, and a crops fragment over
        another base can leave them behind (the batch would be split into the wrong crops)."""
        crops = 0 if cfg.TEST_ONLY or not cls.crops_key \
            else crops_per_sample(cfg.DATA.TRAIN.TRANSFORMS)
        given = cfg.LOSS[cfg.LOSS.name].get(cls.crops_key, crops) if crops else crops
        if given != crops:
            logger.warning("config.LOSS.%s.%s=%s: the training transforms make %d crops per "
                           "sample; %d is used", cfg.LOSS.name, cls.crops_key, given, crops,
                           crops)
        super().derive_config(cfg)

    @classmethod
    def build_hooks(cls) -> List:
        return [DistillationHook()]

    def teacher_input(self, inputs: Inputs) -> Inputs:
        """What the teacher sees of the batch's input.  Default: all of it."""
        return inputs

    def set_teacher_output(self, outputs, teacher) -> None:
        """The teacher's outputs (a list, as the model gives them) on ``teacher_input``."""
        self._teacher_output = as_output_list(outputs)

    def take_teacher_output(self) -> List[torch.Tensor]:
        if self._teacher_output is None:
            raise RuntimeError(f"{type(self).__name__} needs the distillation hook: it runs the "
                               "teacher after each forward pass")
        output, self._teacher_output = self._teacher_output, None
        return output


LOSS_TYPES = ("mse", "kl_divergence", "cross_entropy")


@register_loss("distillation_loss")
class DistillationLoss(TeacherLoss):
    """Soft targets (Hinton et al. 2015): the student's logits (first output) against the
    teacher's (its last output), all crops of the batch.  ``loss_type`` ``kl_divergence``:
    ``T^2 KL(softmax(t/T) || softmax(s/T))`` (batch mean); ``cross_entropy``:
    ``-T^2 sum softmax(t/T) log softmax(s/T)`` (batch mean); ``mse``: the mean squared error of
    the logits.  With ``soft_target_alpha`` a < 1 the loss is ``a * soft + (1 - a) * CE(s,
    labels)``."""

    def __init__(self, soft_target_alpha: float = 1.0, temperature: float = 1.0,
                 loss_type: str = "kl_divergence"):
        super().__init__()
        loss_type = str(loss_type).lower()
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"distillation_loss: loss_type must be one of {LOSS_TYPES}, got "
                             f"'{loss_type}'")
        if not 0.0 <= soft_target_alpha <= 1.0 or temperature <= 0:
            raise ValueError("distillation_loss: soft_target_alpha must be in [0, 1] and "
                             f"temperature > 0, got {soft_target_alpha} and {temperature}")
        self.soft_target_alpha = float(soft_target_alpha)
        self.temperature = float(temperature)
        self.loss_type = loss_type

    def soft_loss(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        if self.loss_type == "mse":
            return F.mse_loss(student, teacher)
        log_student = F.log_softmax(student / self.temperature, dim=-1)
        teacher_probs = F.softmax(teacher / self.temperature, dim=-1)
        if self.loss_type == "kl_divergence":
            penalty = F.kl_div(log_student, teacher_probs, reduction="batchmean")
        else:
            penalty = -(teacher_probs * log_student).sum(dim=-1).mean()
        return penalty * self.temperature ** 2

    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        student = as_output_list(output)[0]
        teacher = self.take_teacher_output()[-1].detach()
        if student.shape != teacher.shape:
            raise ValueError(f"distillation_loss: the student's logits {tuple(student.shape)} "
                             f"and the teacher's {tuple(teacher.shape)} differ in shape")
        terms = {"soft": self.soft_target_alpha * self.soft_loss(student, teacher)}
        if self.soft_target_alpha < 1.0:
            if target is None:
                raise ValueError("distillation_loss with soft_target_alpha < 1 needs labels")
            if target.ndim == 2 and target.shape[1] == 1:
                target = target[:, 0]
            hard = F.cross_entropy(student, target.to(student.device))
            terms["hard"] = (1.0 - self.soft_target_alpha) * hard
        return total_of(self, terms)


@register_loss("dino_distillation_loss")
class DINODistillationLoss(TeacherLoss):
    """DINO's cross-entropy with a frozen teacher: the teacher sees the first
    ``teacher_num_crops`` crops, its scores / ``teacher_temperature`` softmaxed (no centering);
    every student crop v predicts teacher crop q, ``-sum softmax(t_q) log softmax(s_v /
    student_temperature)``, averaged over the samples and the pairs (q, v).  Pairs skipped:
    with ``swapped_assignment``, v == q; otherwise the teacher-seen crops v != q (each global
    crop is matched with its own teacher view and every local crop with all of them)."""

    monitor_embedding = False  # the output is prototype scores
    crops_key = "student_num_crops"

    def __init__(self, teacher_num_crops: int = 2, student_num_crops: int = 10,
                 teacher_temperature: float = 0.07, student_temperature: float = 0.1,
                 swapped_assignment: bool = False):
        super().__init__()
        if not 1 <= teacher_num_crops <= student_num_crops:
            raise ValueError(f"dino_distillation_loss: teacher_num_crops={teacher_num_crops} "
                             f"must be in [1, student_num_crops={student_num_crops}]")
        if teacher_temperature <= 0 or student_temperature <= 0:
            raise ValueError("dino_distillation_loss: temperatures must be > 0")
        self.teacher_num_crops = int(teacher_num_crops)
        self.student_num_crops = int(student_num_crops)
        self.teacher_temperature = float(teacher_temperature)
        self.student_temperature = float(student_temperature)
        self.swapped_assignment = bool(swapped_assignment)

    def teacher_input(self, inputs: Inputs) -> Inputs:
        return first_crops(inputs, self.student_num_crops, self.teacher_num_crops,
                           "LOSS.dino_distillation_loss.student_num_crops")

    def pairs(self):
        return crop_pairs(self.teacher_num_crops, self.student_num_crops,
                          self.swapped_assignment)

    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        student = as_output_list(output)[0]
        teacher = self.take_teacher_output()[0].detach()
        if student.shape[0] % self.student_num_crops or teacher.shape[0] % self.teacher_num_crops:
            raise ValueError(f"dino_distillation_loss: {student.shape[0]} student rows and "
                             f"{teacher.shape[0]} teacher rows do not split into "
                             f"{self.student_num_crops} and {self.teacher_num_crops} crops")
        student_log = F.log_softmax(student / self.student_temperature, dim=-1)
        student_log = student_log.chunk(self.student_num_crops)
        teacher_probs = F.softmax(teacher / self.teacher_temperature, dim=-1)
        teacher_probs = teacher_probs.chunk(self.teacher_num_crops)
        pairs = list(self.pairs())
        loss = sum(-(teacher_probs[q] * student_log[v]).sum(dim=-1).mean() for q, v in pairs)
        return total_of(self, {"distillation": loss / len(pairs)})
