"""MMCR (Yerxa et al. 2023, maximum manifold capacity representations): the views of each
image are a small manifold on the sphere; the loss spreads the manifolds' centroids (a large
nuclear norm of the matrix of centroids) and may shrink each manifold (a small nuclear norm of
its views)."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import embedding_output, total_of
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all


@register_loss("mmcr_loss")
class MMCRLoss(SSLLoss):
    """``output[0]`` holds ``num_views * B`` embeddings, view-major; each is l2-normalised.
    With ``Z_i`` the [num_views, D] views of sample i and ``C`` the [N, D] matrix of their
    means over the global batch of N samples:

        loss = -||C||_* + lmda * mean_i ||Z_i||_*

    (``||.||_*``: the nuclear norm, the sum of singular values).  Every rank computes
    ``||C||_*`` of the gathered centroids; the gather's backward sums each rank's gradient
    into the rows it owns, so data-parallel averaging gives one process's gradient."""

    batch_coupling = "its centroid term is the nuclear norm of the whole batch's centroids"
    crops_key = "num_views"

    def __init__(self, embedding_dim: int = 512, num_views: int = 2, lmda: float = 0.005):
        super().__init__()
        if num_views < 2 or lmda < 0:
            raise ValueError(f"mmcr_loss needs num_views >= 2 and lmda >= 0, got {num_views} "
                             f"and {lmda}")
        self.embedding_dim = int(embedding_dim)
        self.num_views = int(num_views)
        self.lmda = float(lmda)

    def forward(self, output, target=None) -> torch.Tensor:
        embedding = embedding_output(output, "mmcr_loss", self.embedding_dim)
        rows = embedding.shape[0]
        if rows % self.num_views:
            raise ValueError(f"mmcr_loss expects num_views * B rows (LOSS.mmcr_loss.num_views="
                             f"{self.num_views}), got {rows}")
        views = F.normalize(embedding.float(), dim=1)
        views = views.view(self.num_views, rows // self.num_views, -1).transpose(0, 1)
        centroids = gather_from_all(views.mean(dim=1))
        terms = {"centroids": -torch.linalg.svdvals(centroids).sum()}
        if self.lmda > 0:
            terms["views"] = self.lmda * torch.linalg.svdvals(views).sum(dim=1).mean()
        return total_of(self, terms)
