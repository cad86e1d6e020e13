"""Barlow Twins (Zbontar et al. 2021): the cross-correlation of the two views' standardised
embeddings is pushed to the identity."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import embedding_output, total_of, two_views
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all


def standardize(z: torch.Tensor) -> torch.Tensor:
    """Each dimension to mean 0 and variance 1 over the rows (biased variance, eps 1e-5, as
    an affine-free batch norm)."""
    return F.batch_norm(z, None, None, training=True, eps=1e-5)


def off_diagonal(matrix: torch.Tensor) -> torch.Tensor:
    """The off-diagonal elements of a square ``matrix``, in row-major order, by a view (a
    boolean mask would size its output on the device and make the host wait): without its last
    element, the flat matrix is n - 1 rows of n + 1 elements, each starting on the diagonal."""
    size = matrix.shape[0]
    return matrix.flatten()[:-1].view(size - 1, size + 1)[:, 1:].flatten()


@register_loss("barlow_twins_loss")
class BarlowTwinsLoss(SSLLoss):
    """``scale_loss * (sum_i (1 - C_ii)^2 + lambda_ * sum_{i != j} C_ij^2)`` with
    ``C = za^T zb / N`` over the *global* batch of ``N`` samples: the embeddings of every rank
    are gathered (with a gradient that reaches every rank) before they are standardised, so N
    processes compute exactly the loss of one process with the whole batch.  Named terms:
    ``on_diagonal`` and ``off_diagonal`` (each with its factors)."""

    batch_coupling = "its cross-correlation is computed over the batch"

    def __init__(self, lambda_: float = 0.0051, scale_loss: float = 0.024,
                 embedding_dim: int = 8192):
        super().__init__()
        self.lambda_ = float(lambda_)
        self.scale_loss = float(scale_loss)
        self.embedding_dim = int(embedding_dim)

    def forward(self, output, target=None) -> torch.Tensor:
        embedding = embedding_output(output, "barlow_twins_loss", self.embedding_dim)
        first, second = (gather_from_all(view) for view in two_views(embedding,
                                                                     "barlow_twins_loss"))
        correlation = standardize(first).t() @ standardize(second) / first.shape[0]
        on_diagonal = (torch.diagonal(correlation) - 1).pow(2).sum()
        return total_of(self, {
            "on_diagonal": self.scale_loss * on_diagonal,
            "off_diagonal": self.scale_loss * self.lambda_ * off_diagonal(correlation).pow(2).sum(),
        })
