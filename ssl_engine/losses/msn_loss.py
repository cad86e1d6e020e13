"""MSN (Assran et al. 2022): masked siamese networks.

The student (trunk with MSN's patch drop, MASKED_IMAGE_MODELING {NAME: msn}, and ``msn_head``)
sees every crop with a share of its patches dropped; the target network, an EMA of the student
whose momentum rises from ``momentum`` to 1 on BYOL's cosine (``MomentumTargetLoss``), sees
the first crop whole, without patch drop or stochastic depth.  Both are scored against the
student's prototypes (cosines of the L2-normalised projection with the normalised prototypes,
``s``).  The anchors are the student's crops 1 .. num_crops-1 (the first crop is the
target's view), each predicting its sample's target:

    p = softmax(s_anchor / temperature)
    q = softmax(s_target / (temperature * target_sharpen_temperature))  (sharpened)
    q = Sinkhorn-Knopp(q) over the global batch, when sinkhorn_iterations > 0
    cross_entropy = mean over anchors of -sum_k q_k log p_k
    me_max = me_max_weight * (log K - H(mean of p over the global batch's anchors))

The mean-entropy maximisation term keeps the anchors spread over the prototypes.
"""
import math
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.losses.sinkhorn import distributed_sinkhorn
from ssl_engine.losses.teacher_student import (
    TeacherCollapseMonitor,
    first_crops,
    without_stochastic_depth,
)
from ssl_engine.models.trunks.msn_patch_drop import disable_patch_drop
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import all_reduce_sum, all_reduce_sum_with_grad


def sharpened_targets(target_scores: torch.Tensor, temperature: float, sharpen: float,
                      sinkhorn_iterations: int) -> torch.Tensor:
    """MSN's targets from the target view's prototype scores: the softmax at ``temperature``
    raised to ``1 / sharpen`` and renormalised (a softmax at ``temperature * sharpen``), then
    balanced over the global batch by Sinkhorn-Knopp when ``sinkhorn_iterations`` > 0."""
    logits = target_scores.detach().float() / (temperature * sharpen)
    if sinkhorn_iterations > 0:  # balances the sharpened probabilities themselves
        return distributed_sinkhorn(F.log_softmax(logits, dim=1), epsilon=1.0,
                                    num_iters=sinkhorn_iterations)
    return F.softmax(logits, dim=1)


def mean_entropy_penalty(probabilities: torch.Tensor) -> torch.Tensor:
    """``log K - H(mean of the rows over every rank)``: 0 when the global batch's mean
    distribution is uniform.  The mean is differentiable across ranks, so data-parallel
    averaging gives the gradient one process would get for the whole batch."""
    mean = global_mean(probabilities)
    return (mean * mean.clamp_min(1e-12).log()).sum() + math.log(probabilities.shape[1])


def global_mean(probabilities: torch.Tensor) -> torch.Tensor:
    """The mean of the rows of every rank, differentiable across ranks."""
    sums = all_reduce_sum_with_grad(probabilities.sum(dim=0))
    count = all_reduce_sum(probabilities.new_full((), probabilities.shape[0]))
    return sums / count


@register_loss("msn_loss")
class MSNLoss(TeacherCollapseMonitor, MomentumTargetLoss):
    """The model gives ``msn_head``'s cosines for all ``num_crops * B`` rows, crop-major (rows
    ``c*B .. c*B+B-1`` are crop ``c``; ``multicrop_collator`` puts the large crops first).  The
    target network gets crop 0's rows of the input and runs without patch drop and stochastic
    depth; its head gives the normalised projection, scored against the student's current
    prototypes (MSN shares one set of prototypes).  The target network is the loss's state,
    hence in every checkpoint."""

    batch_coupling = ("its mean-entropy term (and Sinkhorn-Knopp) use the batch's mean "
                      "prediction")

    crops_key = "num_crops"
    output_dim_head_key = "num_prototypes"
    regularizer_name = "me_max"  # the loss term of ``regularizer``, weighted by me_max_weight

    def __init__(self, momentum: float = 0.996, temperature: float = 0.1,
                 output_dim: int = 1024, num_crops: int = 2,
                 target_sharpen_temperature: float = 0.25, me_max_weight: float = 1.0,
                 sinkhorn_iterations: int = 3):
        super().__init__(momentum, "cosine")
        if temperature <= 0 or not 0 < target_sharpen_temperature <= 1:
            raise ValueError(f"msn_loss: temperature must be > 0 and target_sharpen_temperature "
                             f"in (0, 1], got {temperature} and {target_sharpen_temperature}")
        if num_crops < 2:
            raise ValueError(f"msn_loss needs num_crops >= 2 (the target's view and at least "
                             f"one anchor), got {num_crops}")
        if me_max_weight < 0 or sinkhorn_iterations < 0:
            raise ValueError(f"msn_loss: me_max_weight and sinkhorn_iterations must be >= 0, "
                             f"got {me_max_weight} and {sinkhorn_iterations}")
        self.temperature = float(temperature)
        self.output_dim = int(output_dim)
        self.num_crops = int(num_crops)
        self.target_sharpen_temperature = float(target_sharpen_temperature)
        self.me_max_weight = float(me_max_weight)
        self.sinkhorn_iterations = int(sinkhorn_iterations)
        self._last_statistics: Dict[str, torch.Tensor] = {}

    @classmethod
    def check_model_config(cls, model_cfg) -> None:
        heads = model_cfg.HEAD.PARAMS
        last = heads[-1] if heads else None
        if not (isinstance(last, (list, tuple)) and last and last[0] == "msn_head"):
            raise ValueError("msn_loss needs msn_head as the last head of "
                             f"config.MODEL.HEAD.PARAMS, got {[h[0] for h in heads or []]}")
        if len(last) > 1 and (last[1] or {}).get("temperature") is not None:
            raise ValueError("msn_loss: the softmax temperature is LOSS.msn_loss.temperature; "
                             "leave msn_head's temperature out (it is for a frozen MSN teacher)")

    # ------------------------------------------------------------------ the target
    def bind_model(self, model) -> None:
        head = model.heads[-1] if len(model.heads) else None
        if getattr(head, "num_prototypes", None) != self.output_dim:
            raise ValueError(f"msn_loss: LOSS.msn_loss.output_dim={self.output_dim} but the "
                             f"model's last head has num_prototypes="
                             f"{getattr(head, 'num_prototypes', None)} (msn_head)")
        if getattr(head, "temperature", None) is not None:
            raise ValueError("msn_loss: the softmax temperature is LOSS.msn_loss.temperature; "
                             "leave msn_head's temperature out (it is for a frozen MSN teacher)")
        super().bind_model(model)
        without_stochastic_depth(self.target_network)
        disable_patch_drop(self.target_network)
        self.target_network.heads[-1].return_query = True

    def target_input(self, batch):
        return first_crops(batch["input"], self.num_crops, 1, "LOSS.msn_loss.num_crops",
                           single=True)

    def run_target(self, inputs, task) -> torch.Tensor:
        """The target view's cosines with the student's prototypes."""
        query = self.target_network(inputs)[0]
        return task.base_model.heads[-1].scores(query)

    # ------------------------------------------------------------------ the loss
    def regularizer(self, probabilities: torch.Tensor) -> torch.Tensor:
        """The term on the anchors' predictions: MSN's mean-entropy maximisation."""
        return mean_entropy_penalty(probabilities)

    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        student = as_output_list(output)[-1]
        if student.ndim != 2 or student.shape[1] != self.output_dim:
            raise ValueError(f"msn_loss expects scores of shape [N, {self.output_dim}] "
                             f"(LOSS.msn_loss.output_dim), got {tuple(student.shape)}")
        teacher = self.get_target_output().detach()
        batch = teacher.shape[0]
        if student.shape[0] != self.num_crops * batch:
            raise ValueError(f"msn_loss: the target gave {batch} rows and the student "
                             f"{student.shape[0]}, not num_crops={self.num_crops} times as many:"
                             " check LOSS.msn_loss.num_crops against the transforms")
        anchors = student[batch:]
        log_probs = F.log_softmax(anchors / self.temperature, dim=1)
        targets = sharpened_targets(teacher, self.temperature, self.target_sharpen_temperature,
                                    self.sinkhorn_iterations)
        views = self.num_crops - 1
        cross_entropy = -(targets.repeat(views, 1) * log_probs).sum(dim=1).mean()
        terms = {"cross_entropy": cross_entropy}
        if self.me_max_weight > 0:
            terms[self.regularizer_name] = self.me_max_weight * self.regularizer(log_probs.exp())
        self._statistics(targets)
        return total_of(self, terms)
