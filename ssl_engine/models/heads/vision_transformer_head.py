"""The classifier of a vision transformer (Dosovitskiy et al. 2021; VISSL's
``vision_transformer_head``)."""
import math
from collections import OrderedDict
from typing import Optional

import torch
from torch import nn

from ssl_engine.models.registry import register_model_head

# std of a normal truncated at +-2 std, divided by this, keeps the variance of the untruncated
# one (LeCun-normal initialisation as JAX's variance scaling writes it)
_TRUNCATED_STD = 0.87962566103423978


@register_model_head("vision_transformer_head")
class VisionTransformerHead(nn.Module):
    """``Linear(in_plane, num_classes)`` (``layers.head``), or with ``hidden_dim`` the
    pretraining head ``Linear(in_plane, hidden_dim) -> Tanh -> Linear(hidden_dim,
    num_classes)`` (``layers.pre_logits``, ``layers.act``, ``layers.head``).  ``pre_logits``
    starts LeCun-normal (truncated), ``head`` from a truncated normal of std 0.02; biases 0."""

    def __init__(self, in_plane: int, num_classes: int, hidden_dim: Optional[int] = None):
        super().__init__()
        layers = []
        width = int(in_plane)
        if hidden_dim is not None:
            layers += [("pre_logits", nn.Linear(width, int(hidden_dim))), ("act", nn.Tanh())]
            width = int(hidden_dim)
        layers.append(("head", nn.Linear(width, int(num_classes))))
        self.layers = nn.Sequential(OrderedDict(layers))
        if hidden_dim is not None:
            pre_logits = self.layers.pre_logits
            std = math.sqrt(1.0 / pre_logits.in_features) / _TRUNCATED_STD
            nn.init.trunc_normal_(pre_logits.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.zeros_(pre_logits.bias)
        nn.init.trunc_normal_(self.layers.head.weight, std=0.02)
        nn.init.zeros_(self.layers.head.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(torch.flatten(x, 1))
