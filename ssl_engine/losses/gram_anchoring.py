"""DINOv3's Gram anchoring (Siméoni et al. 2025, "DINOv3", section 4): the Gram matrix of the
student's patch features held near that of an earlier teacher (the "Gram teacher"), added to
DINOv2's terms (``dino_loss`` with Sinkhorn-Knopp centering and KoLeo).

For each global crop of each image, with ``X`` the [P, d] patch features of the trunk (after
its final norm), each row L2-normalised, and ``G(X) = X X^T`` [P, P] (cosine similarities of
the patches):

    L_Gram = || G(X_student) - G(X_gram_teacher) ||_F^2

The paper writes the squared Frobenius norm; the authors' released loss takes it as the mean
over the P^2 entries (a mean squared error), over the global crops of the batch, so its size
does not grow with the number of patches; so does this one.  The term enters the loss as
``gram_loss_weight * L_Gram`` from iteration ``gram_start_iteration`` on (0 before: the term
is logged as 0).  The Gram teacher is the EMA teacher's trunk copied at iteration
``gram_start_iteration`` and again every ``gram_update_frequency`` iterations (the copy
happens before that iteration's loss).  The released ViT-7B settings: the Gram teacher loaded
at iteration 1,010,000, refreshed every 10k (at most 3 times), the weight rising to 2; the
paper's high-resolution variant (the Gram teacher fed images at twice the size, its features
downsampled) and its limit on the number of refreshes are not built.  The Gram teacher's
weights are a submodule of the loss, hence in every checkpoint; whether it is refreshed at
an iteration depends on the iteration alone, so a resumed run continues exactly.
"""
from typing import Optional

import torch
import torch.nn.functional as F

from ssl_engine.losses.dino_loss import DINOLoss
from ssl_engine.losses.outputs import as_output_list, global_views, total_of
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.device import float32_outputs


def gram_matrices(patches: torch.Tensor) -> torch.Tensor:
    """[N, P, P]: ``X X^T`` of each image's L2-normalised patch features ``patches`` [N, P, d]."""
    normalised = F.normalize(patches.float(), dim=-1)
    return normalised @ normalised.transpose(1, 2)


def gram_loss(student: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """The mean over images and over the P^2 entries of ``(G(student) - G(anchor))^2``."""
    if student.shape != anchor.shape:
        raise ValueError(f"the Gram term compares patch features of one shape, got "
                         f"{tuple(student.shape)} (student) and {tuple(anchor.shape)} (anchor)")
    return (gram_matrices(student) - gram_matrices(anchor).detach()).pow(2).mean()


@register_loss("dinov3_loss")
class DINOv3Loss(DINOLoss):
    """``dino_loss`` (every key of it) plus the Gram term.  The model: the ViT on named inputs
    (``ibot_multicrop_masking_collator``: ``global_views``, ``local_views``), the global views
    giving ``lastBLK``, and ``dinov3_head`` (image features, patch tokens, scores)."""

    def __init__(self, momentum: float = 0.996, student_temp: float = 0.1,
                 teacher_temp_min: float = 0.04, teacher_temp_max: float = 0.07,
                 teacher_temp_warmup_iters: int = 37500, crops_for_teacher=(0, 1),
                 ema_center: float = 0.9, output_dim: int = 65536, num_crops: int = 2,
                 centering: str = "sinkhorn_knopp", sinkhorn_iterations: int = 3,
                 koleo_loss_weight: float = 0.1, gram_loss_weight: float = 2.0,
                 gram_start_iteration: int = 0, gram_update_frequency: int = 10000):
        super().__init__(momentum, student_temp, teacher_temp_min, teacher_temp_max,
                         teacher_temp_warmup_iters, crops_for_teacher, ema_center, output_dim,
                         num_crops, centering, sinkhorn_iterations, koleo_loss_weight)
        if gram_loss_weight < 0 or gram_start_iteration < 0 or gram_update_frequency < 1:
            raise ValueError(f"dinov3_loss: gram_loss_weight and gram_start_iteration must be "
                             f">= 0 and gram_update_frequency >= 1, got {gram_loss_weight}, "
                             f"{gram_start_iteration}, {gram_update_frequency}")
        self.gram_loss_weight = float(gram_loss_weight)
        self.gram_start_iteration = int(gram_start_iteration)
        self.gram_update_frequency = int(gram_update_frequency)
        self.gram_teacher: Optional[torch.nn.Module] = None
        self.gram_output: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ the schedule
    def gram_active(self, iteration: int) -> bool:
        return self.gram_loss_weight > 0 and iteration >= self.gram_start_iteration

    def gram_refresh_due(self, iteration: int) -> bool:
        """Whether the Gram teacher takes the EMA teacher's weights before ``iteration``."""
        return (self.gram_active(iteration)
                and (iteration - self.gram_start_iteration) % self.gram_update_frequency == 0)

    # ------------------------------------------------------------------ the Gram teacher
    def bind_model(self, model) -> None:
        super().bind_model(model)
        self.make_gram_teacher()

    def make_gram_teacher(self) -> None:
        """The Gram teacher: a frozen copy of the EMA teacher's trunk (its weights are state
        from the start, so every checkpoint has the same keys)."""
        self.gram_teacher = self.target_network.target_copy(0)

    @torch.no_grad()
    def refresh_gram_teacher(self) -> None:
        """Copy the EMA teacher's trunk weights (parameters and buffers) into the Gram teacher."""
        source = self.target_network.state_dict()
        for name, value in self.gram_teacher.state_dict().items():
            value.copy_(source[name])

    def target_input(self, batch):
        """The global views (named inputs)."""
        return {"global_views": global_views(batch["input"], "dinov3_loss")}

    def run_target(self, inputs, task) -> torch.Tensor:
        return self.target_network(inputs)[-1]  # the teacher's scores

    @torch.no_grad()
    def compute_target(self, task) -> None:
        iteration = task.schedule_iteration
        if task.train and self.gram_refresh_due(iteration):
            self.refresh_gram_teacher()
        super().compute_target(task)
        self.gram_output = None
        if self.gram_active(iteration):
            self.gram_teacher.train(self.target_train_mode(task))
            tokens = self.gram_teacher(self.target_input(task.last_batch))[0]
            prefix = self.gram_teacher.trunk.vit.num_prefix_tokens
            self.gram_output = float32_outputs(tokens[:, prefix:])

    # ------------------------------------------------------------------ the loss
    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        outputs = as_output_list(output)
        if len(outputs) != 3 or outputs[1].ndim != 3:
            raise ValueError("dinov3_loss needs dinov3_head's three outputs (image features, "
                             "patch tokens of the global views, scores): the global views "
                             "giving lastBLK in MODEL.MULTI_INPUT_HEAD_MAPPING")
        super().forward(outputs, target)
        terms = dict(self.loss_terms)
        if self.gram_active(self.step_context.iteration):
            if self.gram_output is None:
                raise RuntimeError("dinov3_loss: the Gram teacher's features are missing (the "
                                   "momentum target hook runs it after each forward pass)")
            anchor, self.gram_output = self.gram_output, None
            terms["gram"] = self.gram_loss_weight * gram_loss(outputs[1], anchor)
        else:
            terms["gram"] = outputs[1].new_zeros(())
        return total_of(self, terms)
