"""Distillation from a frozen iBOT or MSN teacher (VISSL's ``ibot_distillation_loss`` and
``msn_distillation_loss``), built on ``TeacherLoss``: the teacher of DISTILLATION.TEACHER_MODEL,
loaded from its weights file and frozen, runs after each student forward pass
(``DistillationHook``); its outputs are the targets, never trained, never centred.

``ibot_distillation_loss``: the teacher (an ``ibot_head`` model) sees the global views whole,
the student (``ibot_head`` or ``ibot_distillation_head``) the global views with patches masked
and the local views.  With ``p_t = softmax(t / teacher_temp)`` and ``log p_s =
log_softmax(s / student_temp)``:

- class term (``lambda1``): ``-sum p_t log p_s`` of the teacher's class scores of global crop q
  with the student's of crop v, averaged over the samples and over the crop pairs (q, v) of
  ``crop_pairs`` (``swapped_assignment``: every v != q; else v == q and the local crops);
- patch term (``lambda2``): per global crop, the same cross-entropy of the teacher's patch
  distributions (``teacher_patch_temp``) with the student's on the same patches, summed over the
  masked patches and divided by their number per image (at least 1), averaged over the images
  and crops (iBOT's patch loss).

With ``use_teacher_prototypes`` the student's outputs are features that the teacher's
prototype layers (``prototypes0`` for the class tokens, ``prototypes1`` for the patches) score.

``msn_distillation_loss``: the teacher (an ``msn_head`` model with VISSL's head
``temperature``, giving cosines / temperature) sees the first ``teacher_num_crops`` crops
whole; ``p_t = softmax(teacher scores)`` (the head's temperature sets its sharpness) and every
student crop's ``log_softmax(s / student_temperature)`` predicts it over the same crop pairs.
"""
from typing import Optional

import torch
import torch.nn.functional as F

from ssl_engine.losses.distillation import DINODistillationLoss, TeacherLoss
from ssl_engine.losses.outputs import as_output_list, global_views, total_of
from ssl_engine.losses.teacher_student import Inputs, crop_pairs
from ssl_engine.utils.classy import register_loss


def patch_cross_entropy(teacher_probs: torch.Tensor, student_log: torch.Tensor,
                        mask: torch.Tensor) -> torch.Tensor:
    """iBOT's patch term: ``-sum p_t log p_s`` per patch [G*B, L], summed over the masked
    patches of each image, divided by their number (at least 1), averaged over the images."""
    per_patch = -(teacher_probs * student_log).sum(dim=-1)
    mask = mask.flatten(1).to(per_patch.dtype)
    return ((per_patch * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).mean()


@register_loss("ibot_distillation_loss")
class IBOTDistillationLoss(TeacherLoss):
    """VISSL's ``ibot_distillation_loss`` keys; the masks are the batch's target (the masking
    collator with TARGET_KEY_NAMES [mask])."""

    monitor_embedding = False  # the outputs are prototype scores

    def __init__(self, swapped_assignment: bool = False, use_teacher_prototypes: bool = False,
                 num_global_crops: int = 2, student_num_crops: int = 12,
                 student_temp: float = 0.1, teacher_temp: float = 0.07,
                 teacher_patch_temp: float = 0.07, lambda1: float = 1.0, lambda2: float = 1.0):
        super().__init__()
        if not 1 <= num_global_crops <= student_num_crops:
            raise ValueError(f"ibot_distillation_loss: num_global_crops={num_global_crops} must "
                             f"be in [1, student_num_crops={student_num_crops}]")
        if min(student_temp, teacher_temp, teacher_patch_temp) <= 0:
            raise ValueError("ibot_distillation_loss: temperatures must be > 0")
        self.swapped_assignment = bool(swapped_assignment)
        self.use_teacher_prototypes = bool(use_teacher_prototypes)
        self.num_global_crops, self.student_num_crops = int(num_global_crops), int(student_num_crops)
        self.student_temp, self.teacher_temp = float(student_temp), float(teacher_temp)
        self.teacher_patch_temp = float(teacher_patch_temp)
        self.lambda1, self.lambda2 = float(lambda1), float(lambda2)
        self._prototypes = None  # the teacher's (class, patch) prototype layers

    def teacher_input(self, inputs: Inputs) -> Inputs:
        """The global views, unmasked."""
        return {"global_views": global_views(inputs, "ibot_distillation_loss")}

    def set_teacher_output(self, outputs, teacher) -> None:
        outputs = as_output_list(outputs)
        if len(outputs) < 2:
            raise ValueError("ibot_distillation_loss: the teacher must give ibot_head's class and "
                             "patch scores (DISTILLATION.TEACHER_MODEL.HEAD.PARAMS: ibot_head)")
        super().set_teacher_output(outputs[-2:], teacher)
        if self.use_teacher_prototypes:
            head = teacher.heads[-1]
            self._prototypes = (head.prototypes0, head.prototypes1)

    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        outputs = as_output_list(output)
        if len(outputs) < 2 or target is None:
            raise ValueError("ibot_distillation_loss needs the student's class and patch outputs "
                             "(ibot_head or ibot_distillation_head) and the patch masks as the "
                             "target (TARGET_KEY_NAMES: [mask])")
        student_cls, student_patch = outputs[-2], outputs[-1]
        if self.use_teacher_prototypes:
            student_cls = self._prototypes[0](student_cls)
            student_patch = self._prototypes[1](student_patch)
        teacher_cls, teacher_patch = (o.detach() for o in self.take_teacher_output())
        globals_, crops = self.num_global_crops, self.student_num_crops
        batch = teacher_cls.shape[0] // globals_
        if (teacher_cls.shape[0] != globals_ * batch or student_cls.shape[0] != crops * batch
                or student_cls.shape[1:] != teacher_cls.shape[1:]
                or student_patch.shape != teacher_patch.shape
                or student_patch.shape[:2] != target.flatten(1).shape):
            raise ValueError(
                f"ibot_distillation_loss: class scores {tuple(student_cls.shape)} (teacher "
                f"{tuple(teacher_cls.shape)}), patch scores {tuple(student_patch.shape)} (teacher "
                f"{tuple(teacher_patch.shape)}) and masks {tuple(target.shape)} disagree with "
                f"num_global_crops={globals_} and student_num_crops={crops}")
        teacher_probs = F.softmax(teacher_cls / self.teacher_temp, dim=-1).chunk(globals_)
        student_log = F.log_softmax(student_cls / self.student_temp, dim=-1).chunk(crops)
        pairs = list(crop_pairs(globals_, crops, self.swapped_assignment))
        cls_loss = sum(-(teacher_probs[q] * student_log[v]).sum(dim=-1).mean()
                       for q, v in pairs) / len(pairs)
        patch_loss = patch_cross_entropy(
            F.softmax(teacher_patch / self.teacher_patch_temp, dim=-1),
            F.log_softmax(student_patch / self.student_temp, dim=-1), target)
        return total_of(self, {"cls": self.lambda1 * cls_loss, "patch": self.lambda2 * patch_loss})


@register_loss("msn_distillation_loss")
class MSNDistillationLoss(DINODistillationLoss):
    """VISSL's ``msn_distillation_loss`` keys: ``dino_distillation_loss`` with the teacher's
    scores taken as they are (its msn_head's temperature is the teacher's)."""

    def __init__(self, swapped_assignment: bool = False, student_temperature: float = 0.1,
                 teacher_num_crops: int = 2, student_num_crops: int = 12):
        super().__init__(teacher_num_crops=teacher_num_crops, student_num_crops=student_num_crops,
                         teacher_temperature=1.0, student_temperature=student_temperature,
                         swapped_assignment=swapped_assignment)

    def set_teacher_output(self, outputs, teacher) -> None:
        super().set_teacher_output(as_output_list(outputs)[-1:], teacher)
