"""DINO (Caron et al. 2021): self-distillation with no labels.

The teacher is an EMA of the student (trunk and ``dino_head``) whose momentum rises from
``momentum`` to 1 on BYOL's cosine (``MomentumTargetLoss``); it sees only the crops in
``crops_for_teacher`` (the global crops) and runs without stochastic depth.  For every teacher
crop ``t`` and every student crop ``s != t``:

    -sum_k softmax((teacher_t - center) / teacher_temp)_k * log_softmax(student_s / student_temp)_k

averaged over the samples and the pairs.  ``teacher_temp`` rises linearly from
``teacher_temp_min`` (iteration 0) to ``teacher_temp_max`` (iteration
``teacher_temp_warmup_iters - 1``), then stays there.  After every training loss the center
moves towards the mean teacher output of the global batch:
``center = ema_center * center + (1 - ema_center) * mean``.

DINOv2's options (``losses/teacher_student.py``, ``losses/dinov2_terms.py``):
``centering: sinkhorn_knopp`` replaces the center by ``sinkhorn_iterations`` Sinkhorn-Knopp
iterations over the global batch of teacher rows (at the teacher temperature; the center then
stays unused); ``koleo_loss_weight > 0`` adds ``koleo_loss_weight * sum over the teacher's
crops of KoLeo(the student's trunk features of that crop)``, which needs the trunk's features
as the first model output (heads ``[[identity, {}], [dino_head, {...}]]`` with
MODEL.HEAD.OUTPUT_HEADS ``[0, 1]``).  KoLeo reads this rank's rows only, as DINOv2 does: 2
processes with B rows each differ from one with 2B.
"""
from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from ssl_engine.losses.dinov2_terms import koleo_loss
from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.losses.teacher_student import (
    CENTERINGS,
    TeacherCollapseMonitor,
    centered_targets,
    cross_crop_entropy,
    ema_towards_global_mean_,
    first_crops,
    linear_warmup,
    sinkhorn_knopp_targets,
    without_stochastic_depth,
)
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.key_rules import NEVER_READ, ignore_published_key


ignore_published_key("config.LOSS.dino_loss.normalize_last_layer",
                     f"{NEVER_READ}: dino_loss has no such setting (DINO's last layer is "
                     "weight-normalised by dino_head)")

@register_loss("dino_loss")
class DINOLoss(TeacherCollapseMonitor, MomentumTargetLoss):
    """The model gives the ``dino_head``'s scores for all ``num_crops * B`` rows, crop-major
    (rows ``c*B .. c*B+B-1`` are crop ``c``; ``multicrop_collator`` puts the global crops
    first, as the first tensor of the input list).  ``crops_for_teacher`` are crop indices
    ``0 .. T-1``: the teacher gets those rows of the input, so with 2 global crops and
    ``[0, 1]`` it runs on the first input tensor alone.

    The center (a buffer) and the teacher are the loss's state, hence in every checkpoint.
    The step context (``begin_step``) gives the iteration (for the temperature) and whether
    the step trains (only training steps move the center)."""

    batch_coupling = "its center moves after every micro-batch, with that micro-batch's mean"

    crops_key = "num_crops"
    output_dim_head_key = "num_clusters"

    def __init__(self, momentum: float = 0.996, student_temp: float = 0.1,
                 teacher_temp_min: float = 0.04, teacher_temp_max: float = 0.07,
                 teacher_temp_warmup_iters: int = 37500,
                 crops_for_teacher: Sequence[int] = (0, 1), ema_center: float = 0.9,
                 output_dim: int = 65536, num_crops: int = 2, centering: str = "centering",
                 sinkhorn_iterations: int = 3, koleo_loss_weight: float = 0.0):
        super().__init__(momentum, "cosine")
        if centering not in CENTERINGS:
            raise ValueError(f"dino_loss: centering must be one of {', '.join(CENTERINGS)}, "
                             f"got {centering!r}")
        if sinkhorn_iterations < 1 or koleo_loss_weight < 0:
            raise ValueError(f"dino_loss: sinkhorn_iterations must be >= 1 and "
                             f"koleo_loss_weight >= 0, got {sinkhorn_iterations} and "
                             f"{koleo_loss_weight}")
        crops_for_teacher = [int(c) for c in crops_for_teacher]
        if min(student_temp, teacher_temp_min, teacher_temp_max) <= 0:
            raise ValueError(f"dino_loss: temperatures must be > 0, got student_temp="
                             f"{student_temp}, teacher_temp_min={teacher_temp_min}, "
                             f"teacher_temp_max={teacher_temp_max}")
        if teacher_temp_warmup_iters < 0:
            raise ValueError(f"dino_loss: teacher_temp_warmup_iters must be >= 0, got "
                             f"{teacher_temp_warmup_iters}")
        if not 0.0 <= ema_center <= 1.0:
            raise ValueError(f"dino_loss: ema_center must be in [0, 1], got {ema_center}")
        if num_crops < 2:
            raise ValueError(f"dino_loss needs num_crops >= 2, got {num_crops}")
        if not crops_for_teacher or crops_for_teacher != list(range(len(crops_for_teacher))):
            raise ValueError(f"dino_loss: crops_for_teacher must be the first crops "
                             f"[0, 1, ..., T-1] (the global crops), got {crops_for_teacher}")
        if len(crops_for_teacher) > num_crops:
            raise ValueError(f"dino_loss: crops_for_teacher {crops_for_teacher} names more "
                             f"crops than num_crops={num_crops}")
        self.student_temp = float(student_temp)
        self.teacher_temp_min = float(teacher_temp_min)
        self.teacher_temp_max = float(teacher_temp_max)
        self.teacher_temp_warmup_iters = int(teacher_temp_warmup_iters)
        self.crops_for_teacher = crops_for_teacher
        self.ema_center = float(ema_center)
        self.output_dim = int(output_dim)
        self.num_crops = int(num_crops)
        self.centering = centering
        self.sinkhorn_iterations = int(sinkhorn_iterations)
        self.koleo_loss_weight = float(koleo_loss_weight)
        self.register_buffer("center", torch.zeros(1, self.output_dim))
        self._last_statistics: Dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ the teacher
    def bind_model(self, model) -> None:
        """The teacher: a copy of the student without stochastic depth (as DINO builds it);
        the student's last head must give ``output_dim`` scores."""
        clusters = getattr(model.heads[-1], "num_clusters", None) if len(model.heads) else None
        if clusters is not None and int(clusters[0]) != self.output_dim:
            raise ValueError(f"dino_loss: LOSS.dino_loss.output_dim={self.output_dim} but the "
                             f"model's head has num_clusters={list(clusters)}")
        super().bind_model(model)
        without_stochastic_depth(self.target_network)

    def target_input(self, batch):
        """The rows of the teacher's crops (``first_crops``): one tensor where they lie in one
        input tensor."""
        return first_crops(batch["input"], self.num_crops, len(self.crops_for_teacher),
                           "LOSS.dino_loss.num_crops", single=True)

    # ------------------------------------------------------------------ the loss
    def teacher_temp_at(self, iteration: int) -> float:
        """The teacher temperature of ``iteration``: linear warm-up, then constant."""
        return linear_warmup(self.teacher_temp_min, self.teacher_temp_max,
                             self.teacher_temp_warmup_iters, iteration, slope_first=True)

    def _student_scores(self, output) -> torch.Tensor:
        outputs = as_output_list(output)
        scores = outputs[-1]
        if scores.ndim != 2 or scores.shape[1] != self.output_dim:
            raise ValueError(f"dino_loss expects scores of shape [N, {self.output_dim}] "
                             f"(LOSS.dino_loss.output_dim), got {tuple(scores.shape)}")
        return scores

    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        student = self._student_scores(output)
        teacher = self.get_target_output().detach()
        teachers = len(self.crops_for_teacher)
        batch = teacher.shape[0] // teachers
        if teacher.shape[0] != teachers * batch or student.shape[0] != self.num_crops * batch:
            raise ValueError(
                f"dino_loss: the teacher gave {teacher.shape[0]} rows for {teachers} crop(s) "
                f"and the student {student.shape[0]} rows for num_crops={self.num_crops}: "
                "check LOSS.dino_loss.crops_for_teacher and num_crops against the transforms")
        temperature = self.teacher_temp_at(self.step_context.iteration)
        if self.centering == "sinkhorn_knopp":
            targets = sinkhorn_knopp_targets(teacher, temperature, self.sinkhorn_iterations)
        else:
            targets = centered_targets(teacher, self.center, temperature)
        log_probs = F.log_softmax(student / self.student_temp, dim=1)
        per_teacher_crop = cross_crop_entropy(targets, log_probs, teachers, self.num_crops)
        terms = {f"teacher_crop{crop}": per_teacher_crop[index]
                 for index, crop in enumerate(self.crops_for_teacher)}
        if self.koleo_loss_weight > 0:
            terms["koleo"] = self.koleo_loss_weight * self._koleo(output, teachers, batch)
        if self.step_context.train and self.centering == "centering":
            self.update_center(teacher)
        self._statistics(targets.detach())
        return total_of(self, terms)

    def _koleo(self, output, teachers: int, batch: int) -> torch.Tensor:
        """KoLeo of the student's trunk features (the first model output), summed over the
        teacher's crops."""
        outputs = as_output_list(output)
        if len(outputs) < 2 or outputs[0].shape[0] != self.num_crops * batch:
            raise ValueError("dino_loss: koleo_loss_weight > 0 needs the trunk's features as the "
                             "first model output: config.MODEL.HEAD.PARAMS [[identity, {}], "
                             "[dino_head, {...}]] and config.MODEL.HEAD.OUTPUT_HEADS [0, 1]")
        features = outputs[0][:teachers * batch]
        return sum(koleo_loss(crop) for crop in features.chunk(teachers))

    @torch.no_grad()
    def update_center(self, teacher: torch.Tensor) -> None:
        """EMA of the center towards the mean teacher output over every rank's rows."""
        ema_towards_global_mean_(self.center, teacher, self.ema_center)
