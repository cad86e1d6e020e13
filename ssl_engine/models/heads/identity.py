"""VISSL's ``identity`` head: the trunk's output unchanged (features taken as they are, e.g. by
the low-shot and clustering benchmarks)."""
import torch
from torch import nn

from ssl_engine.models.registry import register_model_head


@register_model_head("identity")
class IdentityHead(nn.Module):
    """Returns its input; takes no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
