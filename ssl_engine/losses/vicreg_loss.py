"""VICReg (Bardes, Ponce, LeCun 2022): invariance between the views' embeddings, a hinge on
each dimension's standard deviation, and a penalty on the off-diagonal covariances."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.barlow_twins_loss import off_diagonal
from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import embedding_output, total_of, two_views
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all


def variance_hinge(z: torch.Tensor, eps: float) -> torch.Tensor:
    """``mean_j relu(1 - sqrt(Var(z_j) + eps))`` (unbiased variance)."""
    return F.relu(1 - torch.sqrt(z.var(dim=0) + eps)).mean()


def covariance_penalty(z: torch.Tensor) -> torch.Tensor:
    """``sum_{i != j} Cov(z)_ij^2 / d`` (unbiased covariance)."""
    centered = z - z.mean(dim=0)
    covariance = centered.t() @ centered / (z.shape[0] - 1)
    return off_diagonal(covariance).pow(2).sum() / z.shape[1]


@register_loss("vicreg_loss")
class VICRegLoss(SSLLoss):
    """``sim_coeff * MSE(za, zb) + std_coeff * (v(za) + v(zb)) / 2 + cov_coeff * (c(za) + c(zb))``
    over the *global* batch (every rank's embeddings gathered with a gradient that reaches every
    rank).  The paper's coefficients are 25, 25 and 1.  Named terms: ``invariance``,
    ``variance``, ``covariance`` (each with its coefficient; they add up to the loss)."""

    batch_coupling = "its variance and covariance terms are computed over the batch"

    def __init__(self, sim_coeff: float = 25.0, std_coeff: float = 25.0, cov_coeff: float = 1.0,
                 eps: float = 1e-4, embedding_dim: int = 8192):
        super().__init__()
        self.sim_coeff, self.std_coeff, self.cov_coeff = float(sim_coeff), float(std_coeff), \
            float(cov_coeff)
        self.eps = float(eps)
        self.embedding_dim = int(embedding_dim)

    def forward(self, output, target=None) -> torch.Tensor:
        embedding = embedding_output(output, "vicreg_loss", self.embedding_dim)
        first, second = (gather_from_all(view) for view in two_views(embedding, "vicreg_loss"))
        return total_of(self, {
            "invariance": self.sim_coeff * F.mse_loss(first, second),
            "variance": self.std_coeff * (variance_hinge(first, self.eps)
                                          + variance_hinge(second, self.eps)) / 2,
            "covariance": self.cov_coeff * (covariance_penalty(first)
                                            + covariance_penalty(second)),
        })
