"""DINOv2's KoLeo term (Oquab et al. 2023); its other addition to DINO, Sinkhorn-Knopp
centering, is ``sinkhorn_knopp_targets`` of ``losses/teacher_student.py``.

``koleo_loss``: the Kozachenko-Leonenko entropy estimator as a regulariser, spreading a batch
of features (the student's class tokens) over the sphere: minus the mean log distance of each
L2-normalised feature to its nearest neighbour in the batch (this rank's rows).
"""
import torch
import torch.nn.functional as F


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

