"""AIM's prediction head (El-Nouby et al. 2024): an MLP applied to every patch token on its own,
predicting the pixels of the next patch."""
from typing import Optional

import torch
from torch import nn

from ssl_engine.models.registry import register_model_head


class ResidualMLPBlock(nn.Module):
    """``x + fc2(GELU(fc1(LayerNorm(x))))``, without biases (AIM's head block)."""

    def __init__(self, dim: int, mlp_ratio: float):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, int(dim * mlp_ratio), bias=False)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(int(dim * mlp_ratio), dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


@register_model_head("aim_prediction_head")
class AIMPredictionHead(nn.Module):
    """Input: the prefix-causal trunk's ``lastBLK`` [N, prefix + L, in_dim] and ``mask`` [N, h,
    w] (RandomPrefixMasking's, MULTI_INPUT_HEAD_MAPPING's additional_keys; it gives L, the
    tokens before the patches being dropped). A linear map to ``hidden_dim``, ``num_blocks``
    residual MLP blocks, a LayerNorm and a linear map to ``output_dim`` (patch_size^2 * 3: the
    next patch's pixels), all without biases. Output: [N, L, output_dim]; row ``k`` predicts
    patch ``k + 1`` (aim_loss)."""

    MIXED_PRECISION = True  # under the trunk's autocast (models/head_precision.py)

    def __init__(self, in_dim: int, output_dim: int, hidden_dim: int = 2048,
                 num_blocks: int = 12, mlp_ratio: float = 4.0):
        super().__init__()
        hidden = int(hidden_dim)
        self.blocks = nn.Sequential(
            nn.Linear(int(in_dim), hidden, bias=False),
            *[ResidualMLPBlock(hidden, float(mlp_ratio)) for _ in range(int(num_blocks))],
            nn.LayerNorm(hidden),
            nn.Linear(hidden, int(output_dim), bias=False),
        )

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        patches = x.shape[1] if mask is None else mask[0].numel()
        return self.blocks(x[:, x.shape[1] - patches:])
