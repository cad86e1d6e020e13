"""CAPI (Darcet et al. 2025, "Cluster and Predict Latent Patches for Improved Masked Image
Modeling"): the student predicts, for each masked patch, the cluster its teacher's patch token
falls in; the clusters are learnt online from the teacher's tokens.

The teacher is an EMA of the student's encoder (``MomentumTargetLoss``, the momentum rising
from ``momentum`` to 1 on BYOL's cosine) fed the whole image (``global_views`` without the
mask), without stochastic depth.  With ``t`` its patch tokens [N, L, D], the clustering layer
of ``capi_head`` gives ``logits = W normalize(t) + b`` [N, L, K], and per patch position ``l``

    Q[:, l] = Sinkhorn-Knopp(logits[:, l] / teacher_temperature)   (over the global batch)

(each position balanced on its own over the global batch's images: CAPI's positionwise
Sinkhorn-Knopp, which avoids a positional collapse; ``sinkhorn_iterations`` rounds; no gradient).
The two terms, each a mean over its tokens:

    prediction = CE(Q at the masked positions, softmax(student scores / student_temperature))
    clustering = CE(Q, softmax(logits / clustering_temperature))

The clustering term trains the clustering layer alone (the teacher's tokens carry no
gradient); the prediction term trains the student's encoder, predictor and prototypes.
CAPI steps the clustering layer with an optimizer of its own; here it is a parameter of the
model like any other (give it its own rate with OPTIMIZER.lr_multipliers on
``heads.0.clustering``).
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F

from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import as_output_list, global_views, total_of
from ssl_engine.losses.sinkhorn import distributed_sinkhorn
from ssl_engine.losses.teacher_student import TeacherCollapseMonitor, without_stochastic_depth
from ssl_engine.models.heads.capi_head import CAPIHead, masked_positions
from ssl_engine.utils.classy import register_loss


def positionwise_assignments(logits: torch.Tensor, temperature: float,
                             iterations: int) -> torch.Tensor:
    """Sinkhorn-Knopp assignments [N, L, K] of ``logits`` [N, L, K] / ``temperature``, each of
    the L positions balanced over the global batch's images on its own; rows sum to 1."""
    return distributed_sinkhorn(logits.detach().transpose(0, 1), epsilon=temperature,
                                num_iters=iterations).transpose(0, 1)


def soft_cross_entropy(targets: torch.Tensor, logits: torch.Tensor,
                       temperature: float) -> torch.Tensor:
    """Mean over the rows of ``-sum_k targets_k log softmax(logits / temperature)_k``."""
    log_probs = F.log_softmax(logits.float() / temperature, dim=-1)
    return -(targets * log_probs).sum(dim=-1).mean()


@register_loss("capi_loss")
class CAPILoss(TeacherCollapseMonitor, MomentumTargetLoss):
    """The model outputs ``capi_head``'s scores of the masked patches [N, M, K] (grid order);
    the target is the patch mask [N, h, w] (TARGET_KEY_NAMES: [mask]).  The target network
    (the trunk alone: the head is the student's) gets ``global_views`` without the mask and
    gives ``lastBLK``; its last h * w tokens are the patches.  ``output_dim`` (K) is filled in
    from the head's ``num_clusters`` before launch.  The target network is the loss's state and
    the clustering layer the model's: both are in every checkpoint."""

    batch_coupling = "its Sinkhorn-Knopp balances the clusters over the batch"
    output_dim_head_key = "num_clusters"

    def __init__(self, momentum: float = 0.999, teacher_temperature: float = 0.06,
                 student_temperature: float = 0.12, clustering_temperature: float = 0.12,
                 sinkhorn_iterations: int = 3, output_dim: int = 16384):
        super().__init__(momentum, "cosine")
        temperatures = (teacher_temperature, student_temperature, clustering_temperature)
        if min(temperatures) <= 0:
            raise ValueError(f"capi_loss: temperatures must be > 0, got {temperatures}")
        if sinkhorn_iterations < 1:
            raise ValueError(f"capi_loss: sinkhorn_iterations must be >= 1, got "
                             f"{sinkhorn_iterations}")
        self.teacher_temperature = float(teacher_temperature)
        self.student_temperature = float(student_temperature)
        self.clustering_temperature = float(clustering_temperature)
        self.sinkhorn_iterations = int(sinkhorn_iterations)
        self.output_dim = int(output_dim)
        self._head = []  # the model's capi_head, not a submodule of the loss (nor its state)
        self._last_statistics: Dict[str, torch.Tensor] = {}

    @classmethod
    def check_model_config(cls, model_cfg) -> None:
        heads = model_cfg.HEAD.PARAMS
        last = heads[-1] if heads else None
        if not (isinstance(last, (list, tuple)) and last and last[0] == "capi_head"):
            raise ValueError("capi_loss needs capi_head as the last head of "
                             f"config.MODEL.HEAD.PARAMS, got {[h[0] for h in heads or []]}")

    # ------------------------------------------------------------------ the teacher
    def bind_model(self, model) -> None:
        head = model.heads[-1] if len(model.heads) else None
        if not isinstance(head, CAPIHead):
            raise ValueError("capi_loss needs capi_head as the model's last head")
        if head.num_clusters != self.output_dim:
            raise ValueError(f"capi_loss: LOSS.capi_loss.output_dim={self.output_dim} but "
                             f"capi_head has num_clusters={head.num_clusters}")
        self._head = [head]
        self.target_network = model.target_copy(len(model.heads) - 1)  # the trunk
        without_stochastic_depth(self.target_network)

    def target_input(self, batch):
        return {"global_views": global_views(
            batch["input"], "capi_loss", "the ibot_multicrop_masking_collator with "
            "DATA.TRAIN.INPUT_KEY_NAMES: [global_views, mask]")}

    # ------------------------------------------------------------------ the loss
    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        student = as_output_list(output)[-1]
        mask = target.get("mask") if isinstance(target, dict) else target
        if not isinstance(mask, torch.Tensor) or mask.ndim != 3:
            raise ValueError("capi_loss needs the patch masks [N, h, w] as the target: "
                             "DATA.TRAIN.TARGET_KEY_NAMES: [mask]")
        patches = mask.shape[1] * mask.shape[2]
        if student.ndim != 3 or student.shape[0] != mask.shape[0] \
                or student.shape[2] != self.output_dim or not 0 < student.shape[1] < patches:
            raise ValueError(f"capi_loss expects scores [N, masked patches, {self.output_dim}] "
                             f"(LOSS.capi_loss.output_dim) for masks {tuple(mask.shape)}, got "
                             f"{tuple(student.shape)}")
        teacher = self.get_target_output().detach()[:, -patches:]  # [N, L, D]
        if not self._head:
            raise RuntimeError("capi_loss is not bound to a model with capi_head")
        logits = self._head[0].cluster_logits(teacher.float())  # [N, L, K], trains the layer
        assignments = positionwise_assignments(logits, self.teacher_temperature,
                                               self.sinkhorn_iterations)
        index = masked_positions(mask, student.shape[1])
        targets = assignments.gather(1, index.unsqueeze(-1).expand(-1, -1, self.output_dim))
        terms = {
            "prediction": soft_cross_entropy(targets, student, self.student_temperature),
            "clustering": soft_cross_entropy(assignments, logits, self.clustering_temperature),
        }
        self._statistics(assignments.flatten(0, 1))
        return total_of(self, terms)
