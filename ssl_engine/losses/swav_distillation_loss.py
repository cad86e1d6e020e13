"""SwAV-style distillation from a frozen teacher (VISSL's ``swav_distillation_loss``).

The teacher sees the first crop, or the first two (``use_two_crops_for_teacher``); its
prototype scores become assignments, by Sinkhorn-Knopp over the global batch (``num_iters`` > 0,
``epsilon`` its regularisation, past teacher scores of a queue joining the problem) or as
``softmax(scores / epsilon)`` (``num_iters: 0``).  The student's scores are its own output, or
its features scored by the teacher's prototypes (``use_teacher_prototypes``); each student crop
predicts the assignments, ``-sum q log softmax(s / temperature)``, averaged over the samples and
the predicting crops, then over the assigned teacher crops.  Which student crops predict which
teacher crop: with one teacher crop, all of them (from crop 1 on with ``swapped_assignment``);
with two, all but the same crop (``swapped_assignment``) or the same crop and the local crops.
"""
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F

from ssl_engine.losses.distillation import TeacherLoss
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.losses.sinkhorn import distributed_sinkhorn
from ssl_engine.losses.teacher_student import Inputs, first_crops
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all, get_rank, get_world_size


@register_loss("swav_distillation_loss")
class SwAVDistillationLoss(TeacherLoss):
    batch_coupling = "its Sinkhorn-Knopp assignments are balanced over the batch"
    monitor_embedding = False
    crops_key = "num_crops"

    def __init__(self, temperature: float = 0.1, use_double_precision: bool = False,
                 num_iters: int = 3, epsilon: float = 0.03, num_crops: int = 6,
                 num_prototypes: Sequence[int] = (3000,), temp_hard_assignment_iters: int = 0,
                 local_queue_length: int = 0, queue_start_iter: int = 0,
                 normalize_student_feats: bool = False, use_student_prototypes: bool = True,
                 use_teacher_prototypes: bool = False, use_two_crops_for_teacher: bool = True,
                 swapped_assignment: bool = False, output_dir: str = "."):
        super().__init__()
        if temperature <= 0 or epsilon <= 0 or num_iters < 0 or local_queue_length < 0:
            raise ValueError("swav_distillation_loss: temperature and epsilon must be > 0, "
                             "num_iters and local_queue_length >= 0")
        self.teacher_crops = 2 if use_two_crops_for_teacher else 1
        if num_crops < self.teacher_crops:
            raise ValueError(f"swav_distillation_loss: num_crops={num_crops} is fewer than the "
                             f"{self.teacher_crops} crop(s) the teacher sees")
        self.temperature, self.epsilon = float(temperature), float(epsilon)
        self.use_double_precision = bool(use_double_precision)
        self.num_iters, self.num_crops = int(num_iters), int(num_crops)
        self.num_prototypes = [int(k) for k in num_prototypes]
        self.temp_hard_assignment_iters = int(temp_hard_assignment_iters)
        self.queue_start_iter = int(queue_start_iter)
        self.normalize_student_feats = bool(normalize_student_feats)
        self.use_student_prototypes = bool(use_student_prototypes)
        self.use_teacher_prototypes = bool(use_teacher_prototypes)
        self.swapped_assignment = bool(swapped_assignment)
        self._teacher_prototypes: Optional[torch.Tensor] = None
        # this rank's past teacher scores, newest first; rows filled so far on this rank
        self.register_buffer("queue", torch.zeros(int(local_queue_length), self.num_prototypes[0]))
        self.register_buffer("queue_filled", torch.zeros((), dtype=torch.long))

    # ------------------------------------------------------------------ the teacher
    def teacher_input(self, inputs: Inputs) -> Inputs:
        return first_crops(inputs, self.num_crops, self.teacher_crops,
                           "LOSS.swav_distillation_loss.num_crops")

    def set_teacher_output(self, outputs, teacher) -> None:
        outputs = as_output_list(outputs)
        # a swav_head gives [embedding, scores], a dino_head [scores]
        super().set_teacher_output([outputs[1] if len(outputs) == 2 else outputs[0]], teacher)
        if self.use_teacher_prototypes:
            self._teacher_prototypes = teacher.heads[0].prototypes0.weight.detach()

    # ------------------------------------------------------------------ checkpoints
    @torch.no_grad()
    def get_classy_state(self) -> dict:
        """Every rank's queue, rank after rank, and fill counts."""
        return {"queue": gather_from_all(self.queue), "queue_filled": gather_from_all(
            self.queue_filled.reshape(1))}

    def set_classy_state(self, state: dict) -> None:
        local = self.queue.shape[0]
        if state["queue"].shape[0] != local * get_world_size():
            raise ValueError(f"swav_distillation_loss: the checkpoint's queue holds "
                             f"{state['queue'].shape[0]} rows, this run's "
                             f"{local * get_world_size()} (local_queue_length x processes)")
        rank = get_rank()
        self.queue.copy_(state["queue"][rank * local:(rank + 1) * local])
        self.queue_filled.copy_(state["queue_filled"][rank])

    # ------------------------------------------------------------------ the loss
    def _queue_in_use(self) -> bool:
        return self.queue.shape[0] > 0 and self.step_context.iteration >= self.queue_start_iter

    @torch.no_grad()
    def assignments(self, teacher_scores: torch.Tensor) -> torch.Tensor:
        if self.num_iters == 0:
            return F.softmax(teacher_scores / self.epsilon, dim=-1)
        batch = teacher_scores.shape[0]
        if self._queue_in_use():
            teacher_scores = torch.cat([teacher_scores, self.queue[:int(self.queue_filled)]])
        q = distributed_sinkhorn(teacher_scores, self.epsilon, self.num_iters,
                                 self.use_double_precision)[:batch]
        if self.step_context.iteration < self.temp_hard_assignment_iters:
            q = F.one_hot(q.argmax(dim=1), q.shape[1]).to(q.dtype)
        return q

    def student_crops(self, teacher_crop: int, teacher_crops: int) -> List[int]:
        if teacher_crops == 1:
            return list(range(1 if self.swapped_assignment else 0, self.num_crops))
        if self.swapped_assignment:
            return [p for p in range(self.num_crops) if p != teacher_crop]
        return [teacher_crop] + list(range(2, self.num_crops))

    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        outputs = as_output_list(output)
        student = outputs[1] if self.use_student_prototypes and len(outputs) > 1 else outputs[0]
        if self.normalize_student_feats:
            student = F.normalize(student, dim=-1, p=2)
        teacher = self.take_teacher_output()[0].detach().float()
        if student.shape[0] % self.num_crops:
            raise ValueError(f"swav_distillation_loss: {student.shape[0]} student rows are not "
                             f"a multiple of num_crops={self.num_crops}")
        batch = student.shape[0] // self.num_crops
        teacher_crops = teacher.shape[0] // batch
        if self.use_teacher_prototypes:
            scores = F.linear(student, self._teacher_prototypes)
        elif student.shape[1] != teacher.shape[1]:
            raise ValueError(f"swav_distillation_loss: the student gives {student.shape[1]} "
                             f"scores and the teacher {teacher.shape[1]}; set "
                             "use_teacher_prototypes to score the student's features with the "
                             "teacher's prototypes")
        else:
            scores = student
        dtype = torch.float64 if self.use_double_precision else scores.dtype
        total = scores.new_zeros((), dtype=dtype)
        for crop in range(teacher_crops):
            q = self.assignments(teacher[crop * batch:(crop + 1) * batch])
            predicting = self.student_crops(crop, teacher_crops)
            crop_loss = total.new_zeros(())
            for p in predicting:
                logits = scores[p * batch:(p + 1) * batch].to(dtype) / self.temperature
                crop_loss = crop_loss - (q.to(dtype) * F.log_softmax(logits, dim=1)).sum(1).mean()
            total = total + crop_loss / len(predicting)
        if self.step_context.train and self._queue_in_use():
            self._enqueue(teacher)
        return total_of(self, {"distillation": (total / teacher_crops).to(scores.dtype)})

    @torch.no_grad()
    def _enqueue(self, teacher_scores: torch.Tensor) -> None:
        rows = teacher_scores[:self.queue.shape[0]].to(self.queue.dtype)
        self.queue.copy_(torch.cat([rows, self.queue])[:self.queue.shape[0]])
        self.queue_filled.add_(rows.shape[0]).clamp_(max=self.queue.shape[0])
