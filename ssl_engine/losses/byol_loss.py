"""BYOL (Grill et al. 2020): the online network's prediction regresses the target network's
projection of the other view; the target is an EMA of the online network."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.outputs import cross_view_terms, embedding_output, total_of
from ssl_engine.utils.classy import register_loss


def normalized_mse(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``|p/|p| - z/|z||^2 = 2 - 2 cos(p, z)``, averaged over the rows."""
    cosine = (F.normalize(prediction, dim=1) * F.normalize(target, dim=1)).sum(dim=1)
    return (2 - 2 * cosine).mean()


@register_loss("byol_loss")
class BYOLLoss(MomentumTargetLoss):
    """``L(p1, z2') + L(p2, z1')`` with ``L`` the normalised MSE, ``p`` the online prediction,
    ``z'`` the target projection (no gradient).  The model's heads are a projector then a
    predictor; the target has the trunk and projector, and its momentum follows the cosine
    schedule from ``momentum`` (0.996 in the paper) to 1."""

    online_only_heads = 1

    def __init__(self, embedding_dim: int = 256, momentum: float = 0.996,
                 momentum_schedule: str = "cosine"):
        super().__init__(momentum, momentum_schedule)
        self.embedding_dim = int(embedding_dim)

    def forward(self, output, target=None) -> torch.Tensor:
        prediction = embedding_output(output, "byol_loss", self.embedding_dim)
        projection = self.get_target_output().detach()
        return total_of(self, cross_view_terms(normalized_mse, prediction, projection,
                                               "byol_loss"))
