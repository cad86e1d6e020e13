"""DCL and DCLW (Yeh et al. 2021, decoupled contrastive learning): InfoNCE without the positive
in the denominator, and its form whose positive term is weighted by a von Mises-Fisher
weighting that stresses the hard positives."""
import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import embedding_output, total_of, two_views
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all, get_rank


def decoupled_direction(anchor: torch.Tensor, positive: torch.Tensor,
                        anchors_all: torch.Tensor, positives_all: torch.Tensor,
                        temperature: float, weights) -> torch.Tensor:
    """Mean over this rank's anchors of ``-w s(a, a+)/t + log sum_neg exp(s(a, n)/t)``: the
    negatives are every other sample's two views on every rank (the anchor's own views
    excluded, the decoupling).  Rows are l2-normalised; ``*_all`` are every rank's rows in
    rank order, this rank's at ``rank * B``."""
    batch = anchor.shape[0]
    own = get_rank() * batch + torch.arange(batch, device=anchor.device)
    # a comparison, not an indexed write of True (that copies the value from the host)
    mask = own[:, None] == torch.arange(anchors_all.shape[0], device=anchor.device)[None, :]
    same_view = (anchor @ anchors_all.t() / temperature).masked_fill(mask, float("-inf"))
    other_view = (anchor @ positives_all.t() / temperature).masked_fill(mask, float("-inf"))
    positive_term = -(anchor * positive).sum(dim=1) / temperature
    if weights is not None:
        positive_term = positive_term * weights
    negative_term = torch.logsumexp(torch.cat([same_view, other_view], dim=1), dim=1)
    return (positive_term + negative_term).mean()


def von_mises_fisher_weights(first: torch.Tensor, second: torch.Tensor,
                             sigma: float) -> torch.Tensor:
    """DCLW's weights of this rank's positive pairs: ``2 - N softmax(s(a_i, a_i+)/sigma)`` with
    the softmax over the N pairs of the global batch, without gradient."""
    similarity = (first.detach() * second.detach()).sum(dim=1) / sigma
    everything = gather_from_all(similarity)
    batch = similarity.shape[0]
    start = get_rank() * batch
    return 2 - everything.shape[0] * F.softmax(everything, dim=0)[start:start + batch]


@register_loss("dcl_loss")
class DCLLoss(SSLLoss):
    """The symmetric decoupled loss of two views (view-major rows of ``output[0]``), each
    direction averaged over the anchors, the two averaged; negatives from every rank."""

    batch_coupling = ("its negatives are the other samples of the batch, and accumulation does "
                      "not add negatives")
    loss_name = "dcl_loss"

    def __init__(self, embedding_dim: int = 128, temperature: float = 0.1):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"{self.loss_name}: temperature must be > 0, got {temperature}")
        self.embedding_dim = int(embedding_dim)
        self.temperature = float(temperature)

    def positive_weights(self, first: torch.Tensor, second: torch.Tensor):
        """The weight of each positive pair's term; None: unweighted (DCL)."""
        return None

    def forward(self, output, target=None) -> torch.Tensor:
        embedding = embedding_output(output, self.loss_name, self.embedding_dim)
        first, second = two_views(F.normalize(embedding, dim=1), self.loss_name)
        first_all, second_all = gather_from_all(first), gather_from_all(second)
        weights = self.positive_weights(first, second)
        return total_of(self, {
            "view0_to_view1": 0.5 * decoupled_direction(first, second, first_all, second_all,
                                                        self.temperature, weights),
            "view1_to_view0": 0.5 * decoupled_direction(second, first, second_all, first_all,
                                                        self.temperature, weights)})


@register_loss("dclw_loss")
class DCLWLoss(DCLLoss):
    """DCL whose positive terms are weighted by ``von_mises_fisher_weights`` (``sigma``)."""

    loss_name = "dclw_loss"

    def __init__(self, embedding_dim: int = 128, temperature: float = 0.1, sigma: float = 0.5):
        super().__init__(embedding_dim, temperature)
        if sigma <= 0:
            raise ValueError(f"dclw_loss: sigma must be > 0, got {sigma}")
        self.sigma = float(sigma)

    def positive_weights(self, first: torch.Tensor, second: torch.Tensor):
        return von_mises_fisher_weights(first, second, self.sigma)
