"""PMSN (Assran et al. 2022, prior matching for siamese networks): MSN whose regulariser pulls
the anchors' mean prediction toward a power-law distribution over the prototypes instead of
the uniform one, the prior that suits class frequencies of real data sets."""
import torch

from ssl_engine.losses.msn_loss import MSNLoss, global_mean
from ssl_engine.utils.classy import register_loss


def power_law(size: int, exponent: float, device=None) -> torch.Tensor:
    """``p_k`` proportional to ``k ** -exponent`` for prototype k = 1 .. size, summing to 1."""
    ranks = torch.arange(1, size + 1, dtype=torch.float64, device=device)
    prior = ranks.pow(-float(exponent))
    return (prior / prior.sum()).float()


@register_loss("pmsn_loss")
class PMSNLoss(MSNLoss):
    """MSN (``msn_loss``: the same heads, target network, crops and settings) with the term
    ``prior_weight * KL(prior || mean of p over the global batch's anchors)``, the prior a power
    law with ``power_law_exponent`` over the prototypes in their index order."""

    regularizer_name = "power_law_prior"

    def __init__(self, momentum: float = 0.996, temperature: float = 0.1,
                 output_dim: int = 1024, num_crops: int = 2,
                 target_sharpen_temperature: float = 0.25, prior_weight: float = 1.0,
                 sinkhorn_iterations: int = 3, power_law_exponent: float = 0.25):
        super().__init__(momentum, temperature, output_dim, num_crops,
                         target_sharpen_temperature, prior_weight, sinkhorn_iterations)
        if power_law_exponent < 0:
            raise ValueError(f"pmsn_loss: power_law_exponent must be >= 0, got "
                             f"{power_law_exponent}")
        self.power_law_exponent = float(power_law_exponent)
        self.register_buffer("prior", power_law(self.output_dim, self.power_law_exponent),
                             persistent=False)

    def regularizer(self, probabilities: torch.Tensor) -> torch.Tensor:
        mean = global_mean(probabilities)
        prior = self.prior.to(mean)
        return (prior * (prior.log() - mean.clamp_min(1e-12).log())).sum()
