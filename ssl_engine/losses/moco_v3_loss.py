"""MoCo v3 (Chen, Xie, He 2021): symmetric InfoNCE between the predictor's output on one view
and the momentum encoder's keys of the other view; negatives are the global batch, no queue."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import cross_view_terms, embedding_output, total_of
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all, get_rank


@register_loss("moco_v3_loss")
class MoCoV3Loss(MomentumTargetLoss):
    """``ctr(q1, k2) + ctr(q2, k1)``, ``ctr(q, k) = 2 t * CE(q k_all^T / t, own index)``: each
    query's positive is its sample's key of the other view among the keys of every rank.
    The model's heads are a projector then a predictor; the momentum encoder has the trunk and
    projector, and its momentum follows the cosine schedule from ``momentum`` to 1."""

    batch_coupling = (
        "its negatives are the other samples of the batch, and accumulation does not add negatives"
    )

    online_only_heads = 1

    def __init__(self, embedding_dim: int = 256, temperature: float = 0.2,
                 momentum: float = 0.99, momentum_schedule: str = "cosine"):
        super().__init__(momentum, momentum_schedule)
        if temperature <= 0:
            raise ValueError(f"moco_v3_loss: temperature must be > 0, got {temperature}")
        self.embedding_dim = int(embedding_dim)
        self.temperature = float(temperature)

    def _contrast(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        query, key = F.normalize(query, dim=1), F.normalize(key, dim=1)
        keys = gather_from_all(key)
        logits = query @ keys.t() / self.temperature
        labels = get_rank() * query.shape[0] + torch.arange(query.shape[0], device=query.device)
        return 2 * self.temperature * F.cross_entropy(logits, labels)

    def forward(self, output, target=None) -> torch.Tensor:
        query = embedding_output(output, "moco_v3_loss", self.embedding_dim)
        key = self.get_target_output().detach()
        return total_of(self, cross_view_terms(self._contrast, query, key, "moco_v3_loss"))
