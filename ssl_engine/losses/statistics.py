"""Statistics losses report to the collapse monitor (hooks/collapse_monitor_hook.py)."""
import math

import torch

# an entropy, as a fraction of its maximum log K, above which a distribution over K
# prototypes is uniform: the embeddings no longer tell the samples apart
COLLAPSED_ENTROPY = 0.99


def entropy(probabilities: torch.Tensor) -> torch.Tensor:
    """Mean over the rows of -sum p log p."""
    return -(probabilities * probabilities.clamp_min(1e-12).log()).sum(dim=1).mean()


def entropy_fraction(probabilities: torch.Tensor) -> torch.Tensor:
    """``entropy`` as a fraction of its maximum, log K for K columns: 1 when uniform."""
    return entropy(probabilities) / math.log(probabilities.shape[1])
