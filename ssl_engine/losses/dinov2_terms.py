"""DINOv2's additions to DINO (Oquab et al. 2023), as functions the DINO and iBOT losses share.

- ``koleo_loss``: the Kozachenko-Leonenko entropy estimator as a regulariser, spreading a
  batch of features (the student's class tokens) over the sphere: minus the mean log distance
  of each L2-normalised feature to its nearest neighbour in the batch (this rank's rows).
- ``sinkhorn_knopp_targets``: the teacher's targets balanced over the prototypes by three
  Sinkhorn-Knopp iterations over the global batch, in place of the running center.
"""
import torch
import torch.nn.functional as F

from ssl_engine.losses.sinkhorn import distributed_sinkhorn

CENTERINGS = ("centering", "sinkhorn_knopp")


def koleo_loss(features: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``-mean_i log(|x_i - x_nn(i)| + eps)`` for the L2-normalised rows ``x`` of
    ``features`` [N, D], ``nn(i)`` the row of highest cosine with row ``i`` (itself excluded)."""
    if features.shape[0] < 2:
        raise ValueError(f"the KoLeo term needs at least 2 rows per crop, got {features.shape[0]}")
    x = F.normalize(features.float(), dim=1, eps=eps)
    with torch.no_grad():
        cosines = x @ x.t()
        cosines.fill_diagonal_(-2.0)
        nearest = cosines.argmax(dim=1)
    distances = F.pairwise_distance(x, x[nearest], p=2, eps=eps)
    return -(distances + eps).log().mean()


@torch.no_grad()
def sinkhorn_knopp_targets(teacher_scores: torch.Tensor, temperature: float,
                           iterations: int) -> torch.Tensor:
    """The teacher's [rows, K] scores as targets: ``exp(scores / temperature)`` rescaled so that
    every prototype gets the same mass over the global batch and every row sums to 1."""
    return distributed_sinkhorn(teacher_scores, epsilon=temperature, num_iters=iterations)


def centered_targets(teacher_scores: torch.Tensor, center: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """DINO's targets: the softmax of the centred teacher scores at ``temperature``."""
    return F.softmax((teacher_scores - center) / temperature, dim=1)
