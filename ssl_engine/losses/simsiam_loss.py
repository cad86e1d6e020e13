"""SimSiam (Chen, He 2021): negative cosine similarity between the prediction of one view and
the (stop-gradient) projection of the other; no momentum encoder, no negatives."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import cross_view_terms, embedding_output, total_of
from ssl_engine.utils.classy import register_loss


def half_negative_cosine(prediction: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    """``-cos(p, stopgrad(z)) / 2``, averaged over the rows."""
    return -0.5 * F.cosine_similarity(prediction, projection.detach(), dim=1).mean()


@register_loss("simsiam_loss")
class SimSiamLoss(SSLLoss):
    """``D(p1, z2)/2 + D(p2, z1)/2`` with ``D = -cos`` and no gradient through ``z``.  The
    model returns the projection and the prediction (MODEL.HEAD.OUTPUT_HEADS: [0, 1] with the
    projector then the predictor in MODEL.HEAD.PARAMS)."""

    def __init__(self, embedding_dim: int = 2048):
        super().__init__()
        self.embedding_dim = int(embedding_dim)

    def forward(self, output, target=None) -> torch.Tensor:
        projection = embedding_output(output, "simsiam_loss", self.embedding_dim, index=0)
        prediction = embedding_output(output, "simsiam_loss", self.embedding_dim, index=1)
        return total_of(self, cross_view_terms(half_negative_cosine, prediction, projection,
                                               "simsiam_loss"))
