"""VISSL's ``identity`` head: passes the trunk's features on unchanged.  Listed first with
MODEL.HEAD.OUTPUT_HEADS [0, ...], it makes the trunk's features one of the model's outputs
(e.g. for DINOv2's KoLeo term on the class tokens, LOSS.dino_loss.koleo_loss_weight); alone,
the model's output is the trunk's (e.g. to distil a trunk's features with distillation_loss's
mse)."""
import torch
from torch import nn

from ssl_engine.models.registry import register_model_head


@register_model_head("identity")
class IdentityHead(nn.Module):
    """``x -> x``: no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
