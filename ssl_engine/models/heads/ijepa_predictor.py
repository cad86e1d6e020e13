"""I-JEPA's predictor (Assran et al. 2023): a narrow transformer that predicts the target
encoder's representation of each target block from the context encoder's tokens."""
import math
from functools import partial
from typing import Optional

import torch
from torch import nn

from ssl_engine.models.heads.mae_decoder import sincos_position_embedding
from ssl_engine.models.registry import register_model_head
from ssl_engine.models.trunks.base import drop_path_rates
from ssl_engine.models.trunks.transformer_parts import init_linear_and_norms, use_shared_attention


def _gather(tokens: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``tokens`` [B, L, D] at ``index`` [B, K] -> [B, K, D]."""
    return tokens.gather(1, index.long().unsqueeze(-1).expand(-1, -1, tokens.shape[-1]))


@register_model_head("ijepa_predictor")
class IJEPAPredictor(nn.Module):
    """Input: the context encoder's ``lastBLK`` [B, prefix + Kc, in_dim] (tokens before the
    patches dropped), ``context_index`` [B, Kc] and ``target_index`` [B, M, Kt] (grid
    positions, the ijepa_collator's; named in MULTI_INPUT_HEAD_MAPPING's additional_keys).
    The context tokens are projected to ``predictor_dim`` and given the fixed sine-cosine
    embedding of their position on the ``num_patches`` grid (square); for each of the M target
    blocks, a learned mask token plus the position embedding of each target patch is appended
    to them, and the sequence (one per image and block) goes through ``depth`` timm blocks
    (LayerNorm eps 1e-6) and a LayerNorm; the mask tokens' outputs are projected back to
    ``in_dim``. Output: [B, M, Kt, in_dim]. Initialised as I-JEPA's: linear weights truncated
    normal (std 0.02), the mask token too, each block's output projections divided by
    sqrt(2 * layer number)."""

    MIXED_PRECISION = True  # under the trunk's autocast (models/head_precision.py)

    def __init__(self, in_dim: int, num_patches: int, predictor_dim: int = 384,
                 depth: int = 12, num_heads: int = 12, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, drop_path_rate: float = 0.0):
        super().__init__()
        from timm.models.vision_transformer import Block  # timm only where a ViT is used

        side = math.isqrt(int(num_patches))
        if side * side != int(num_patches):
            raise ValueError(f"ijepa_predictor: num_patches={num_patches} is not a square grid")
        dim = int(predictor_dim)
        self.embed = nn.Linear(int(in_dim), dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, 1, dim))
        rates = drop_path_rates(float(drop_path_rate), int(depth))
        self.blocks = nn.ModuleList(
            Block(dim, int(num_heads), mlp_ratio=mlp_ratio, qkv_bias=bool(qkv_bias),
                  drop_path=rate, norm_layer=partial(nn.LayerNorm, eps=1e-6)) for rate in rates)
        use_shared_attention(self.blocks)  # fused attention, timm's parameter names
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.proj = nn.Linear(dim, int(in_dim))
        self.register_buffer("position", sincos_position_embedding(side, side, dim),
                             persistent=False)
        init_linear_and_norms(self, std=0.02)
        nn.init.trunc_normal_(self.mask_token, std=0.02)
        with torch.no_grad():
            for layer, block in enumerate(self.blocks, start=1):
                block.attn.proj.weight.div_(math.sqrt(2.0 * layer))
                block.mlp.fc2.weight.div_(math.sqrt(2.0 * layer))

    def forward(self, x: torch.Tensor, context_index: Optional[torch.Tensor] = None,
                target_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        if context_index is None or target_index is None:
            raise ValueError("ijepa_predictor needs context_index and target_index: list them in "
                             "MULTI_INPUT_HEAD_MAPPING's additional_keys (ijepa_collator)")
        rows, blocks, target = target_index.shape
        context = context_index.shape[1]
        position = self.position.to(x.dtype).unsqueeze(0).expand(rows, -1, -1)
        tokens = self.embed(x[:, x.shape[1] - context:]) + _gather(position, context_index)
        queries = self.mask_token.to(tokens.dtype) + _gather(
            position, target_index.flatten(1)).view(rows, blocks, target, -1)
        sequence = torch.cat([tokens.unsqueeze(1).expand(-1, blocks, -1, -1), queries], dim=2)
        sequence = sequence.flatten(0, 1)  # one sequence per (image, block)
        for block in self.blocks:
            sequence = block(sequence)
        predicted = self.proj(self.norm(sequence)[:, context:])
        return predicted.view(rows, blocks, target, -1)
