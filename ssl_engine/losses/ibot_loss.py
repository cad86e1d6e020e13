"""iBOT (Zhou et al. 2022): DINO's self-distillation on the class token plus masked image
modelling against the teacher's patch tokens.

The student sees the global views with some patches masked (the trunk's mask token) and the
local views; the teacher, an EMA of the student (``teacher_momentum`` rising to 1 on BYOL's
cosine), sees the global views whole.  With ``ibot_head``'s outputs (class scores [crops*B, K],
patch scores [G*B, L, K2]):

- class loss (``lambda1``): DINO's, every teacher global crop against every other student
  crop, the teacher centered by ``center`` (momentum ``center_momentum``) at temperature
  ``teacher_temp``;
- patch loss (``lambda2``): for each global crop, the cross-entropy of the teacher's patch
  distribution (centered by ``center2``, momentum ``center_momentum2``, temperature
  ``teacher_patch_temp``) with the student's on the same crop, summed over the masked patches
  and divided by their number per image (at least 1), averaged over images and crops.

The teacher temperatures rise linearly from ``warmup_teacher_temp`` / ``warmup_teacher_patch_temp``
over ``warmup_teacher_temp_epochs`` epochs; the patch temperature's warm-up starts at
``mim_start_epoch``.  Epochs are counted from the step context: ``num_epochs`` epochs in the
run's ``total_iterations`` updates.  The masks are the batch's target (the masking collator
with TARGET_KEY_NAMES [mask]).
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import as_output_list, global_views, total_of
from ssl_engine.losses.teacher_student import (
    TeacherCollapseMonitor,
    centered_targets,
    cross_crop_entropy,
    ema_towards_global_mean_,
    linear_warmup,
    without_stochastic_depth,
)
from ssl_engine.utils.classy import register_loss


def _crop_counts(transforms):
    """(crops of the first size, crops of the others) of ImgPilToMultiCrop, or None."""
    for spec in transforms or []:
        if isinstance(spec, dict) and spec.get("name") == "ImgPilToMultiCrop":
            counts = [int(c) for c in spec.get("num_crops", [])]
            return (counts[0], sum(counts[1:])) if counts else None
    return None


def _last_head_params(cfg, name: str):
    heads = cfg.MODEL.HEAD.PARAMS or []
    head = heads[-1] if heads else None
    if isinstance(head, (list, tuple)) and len(head) == 2 and head[0] == name:
        return head[1] or {}
    return None


def _check_class_token(cfg, head) -> None:
    """ibot_head reads the class token first in lastBLK; a ViT without one needs pool_patches."""
    vit = cfg.MODEL.TRUNK.get("VISION_TRANSFORMERS") or {}
    if cfg.MODEL.TRUNK.NAME != "vision_transformer" or vit.get("USE_CLASS_TOKEN", True):
        return
    if not head.get("pool_patches", False):
        raise ValueError("config.MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN=false gives "
                         "ibot_head patch tokens only: set the head's pool_patches: true (the "
                         "image's row is then the mean of the patch tokens) and give the local "
                         "views lastPOOL")


@register_loss("ibot_loss")
class IBOTLoss(TeacherCollapseMonitor, MomentumTargetLoss):
    """VISSL's ``ibot_loss`` keys; ``out_dim``, ``patch_out_dim``, ``num_global_crops``,
    ``num_local_crops`` and ``num_epochs`` are filled in from the head, the transforms and the
    optimizer before launch.  The centers are buffers and the teacher is the loss's, so both
    are in every checkpoint."""

    batch_coupling = "its centers move after every micro-batch, with that micro-batch's mean"

    @classmethod
    def derive_config(cls, cfg) -> None:
        """The global and local crops from ImgPilToMultiCrop's num_crops, out_dim and
        patch_out_dim from the last head (ibot_head), num_epochs from the optimizer's."""
        super().derive_config(cfg)
        loss = cfg.LOSS[cfg.LOSS.name]
        counts = None if cfg.TEST_ONLY else _crop_counts(cfg.DATA.TRAIN.TRANSFORMS)
        if counts:
            loss.num_global_crops, loss.num_local_crops = counts
        head = _last_head_params(cfg, "ibot_head")
        if head is not None:
            _check_class_token(cfg, head)
            loss.out_dim = int(head.get("out_dim", 8192))
            shared = head.get("shared_head", True)
            patch = head.get("patch_out_dim")
            loss.patch_out_dim = int(loss.out_dim if shared or patch is None else patch)
        loss.num_epochs = int(cfg.OPTIMIZER.num_epochs)

    def __init__(self, teacher_momentum: float = 0.996, warmup_teacher_temp: float = 0.04,
                 teacher_temp: float = 0.04, warmup_teacher_patch_temp: float = 0.04,
                 teacher_patch_temp: float = 0.07, warmup_teacher_temp_epochs: int = 30,
                 student_temp: float = 0.1, center_momentum: float = 0.9,
                 center_momentum2: float = 0.9, lambda1: float = 1.0, lambda2: float = 1.0,
                 mim_start_epoch: int = 0, num_global_crops: int = 2, num_local_crops: int = 8,
                 out_dim: int = 8192, patch_out_dim: int = 8192, num_epochs: int = 10):
        super().__init__(teacher_momentum, "cosine")
        temps = (warmup_teacher_temp, teacher_temp, warmup_teacher_patch_temp,
                 teacher_patch_temp, student_temp)
        if min(temps) <= 0:
            raise ValueError(f"ibot_loss: temperatures must be > 0, got {temps}")
        for name, value in (("center_momentum", center_momentum),
                            ("center_momentum2", center_momentum2)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"ibot_loss: {name} must be in [0, 1], got {value}")
        if num_global_crops < 1 or num_global_crops + num_local_crops < 2:
            raise ValueError(f"ibot_loss needs at least 1 global crop and 2 crops, got "
                             f"num_global_crops={num_global_crops}, "
                             f"num_local_crops={num_local_crops}")
        self.warmup_teacher_temp = float(warmup_teacher_temp)
        self.teacher_temp = float(teacher_temp)
        self.warmup_teacher_patch_temp = float(warmup_teacher_patch_temp)
        self.teacher_patch_temp = float(teacher_patch_temp)
        self.warmup_epochs = int(warmup_teacher_temp_epochs)
        self.mim_start_epoch = int(mim_start_epoch)
        self.student_temp = float(student_temp)
        self.center_momentum = float(center_momentum)
        self.center_momentum2 = float(center_momentum2)
        self.lambda1, self.lambda2 = float(lambda1), float(lambda2)
        self.num_global_crops = int(num_global_crops)
        self.num_crops = int(num_global_crops + num_local_crops)
        self.out_dim, self.patch_out_dim = int(out_dim), int(patch_out_dim)
        self.num_epochs = max(1, int(num_epochs))
        self.register_buffer("center", torch.zeros(1, self.out_dim))
        self.register_buffer("center2", torch.zeros(1, 1, self.patch_out_dim))
        self._last_statistics: Dict[str, torch.Tensor] = {}

    # ------------------------------------------------------------------ the teacher
    def bind_model(self, model) -> None:
        super().bind_model(model)
        without_stochastic_depth(self.target_network)

    def target_input(self, batch):
        """The global views, unmasked."""
        return {"global_views": global_views(batch["input"], "ibot_loss")}

    def run_target(self, inputs, task):
        return self.target_network(inputs)  # [class scores, patch scores]

    # ------------------------------------------------------------------ schedules
    def epoch(self) -> int:
        total = self.step_context.total_iterations
        per_epoch = max(1, total // self.num_epochs) if total else 0
        return self.step_context.iteration // per_epoch if per_epoch else 0

    def temperatures(self):
        """(class, patch) teacher temperatures of the current step."""
        epoch = self.epoch()
        return (linear_warmup(self.warmup_teacher_temp, self.teacher_temp, self.warmup_epochs,
                              epoch),
                linear_warmup(self.warmup_teacher_patch_temp, self.teacher_patch_temp,
                              self.warmup_epochs, epoch - self.mim_start_epoch))

    # ------------------------------------------------------------------ the loss
    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        outputs = as_output_list(output)
        if len(outputs) < 2 or target is None:
            raise ValueError("ibot_loss needs ibot_head's two outputs (class and patch scores) "
                             "and the patch masks as the target (TARGET_KEY_NAMES: [mask])")
        student_cls, student_patch = outputs[-2], outputs[-1]
        teacher_cls, teacher_patch = (o.detach() for o in self.get_target_output()[-2:])
        globals_ = self.num_global_crops
        mask = target.flatten(1).to(student_patch.dtype)
        batch = teacher_cls.shape[0] // globals_
        if (student_cls.shape[0] != self.num_crops * batch or student_patch.shape[:2] != mask.shape
                or teacher_patch.shape != student_patch.shape):
            raise ValueError(
                f"ibot_loss: class scores {tuple(student_cls.shape)} (teacher "
                f"{tuple(teacher_cls.shape)}), patch scores {tuple(student_patch.shape)} (teacher "
                f"{tuple(teacher_patch.shape)}) and masks {tuple(target.shape)} disagree with "
                f"num_global_crops={globals_} and {self.num_crops} crops")
        temp, patch_temp = self.temperatures()
        targets = centered_targets(teacher_cls, self.center, temp)
        log_probs = F.log_softmax(student_cls / self.student_temp, dim=-1)
        cls_loss = cross_crop_entropy(targets, log_probs, globals_, self.num_crops).sum()
        patch_targets = centered_targets(teacher_patch, self.center2, patch_temp)
        patch_log_probs = F.log_softmax(student_patch / self.student_temp, dim=-1)
        per_patch = -(patch_targets * patch_log_probs).sum(dim=-1)  # [G*B, L]
        per_image = (per_patch * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        patch_loss = per_image.mean()  # = the mean over crops of the per-crop image means
        if self.step_context.train:
            ema_towards_global_mean_(self.center, teacher_cls, self.center_momentum)
            ema_towards_global_mean_(self.center2, teacher_patch.flatten(0, 1),
                                     self.center_momentum2)
        self._statistics(targets.detach())
        return total_of(self, {"cls": self.lambda1 * cls_loss, "patch": self.lambda2 * patch_loss})
