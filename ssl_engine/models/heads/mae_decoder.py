"""MAE's decoder (He et al. 2022): a light transformer that predicts the pixels of every patch
from the encoder's visible tokens and a mask token in place of each masked patch."""
from typing import Optional

import torch
from torch import nn

from ssl_engine.models.registry import register_model_head
from ssl_engine.models.trunks.token_gather import assert_on_device, visible_positions
from ssl_engine.models.trunks.transformer_parts import use_shared_attention
from ssl_engine.utils.device import from_host


def sincos_position_embedding(height: int, width: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embeddings [height * width, dim] (row-major grid): half
    the channels encode the row, half the column, each as sines and cosines of the position at
    frequencies 1 / 10000^(k / (dim / 4))."""
    if dim % 4:
        raise ValueError(f"sine-cosine position embeddings need a width divisible by 4, got {dim}")
    quarter = dim // 4
    frequencies = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    rows, cols = torch.meshgrid(torch.arange(height, dtype=torch.float64),
                                torch.arange(width, dtype=torch.float64), indexing="ij")
    parts = []
    for position in (rows.flatten(), cols.flatten()):
        angles = position[:, None] * frequencies[None, :]
        parts += [angles.sin(), angles.cos()]
    return torch.cat(parts, dim=1).float()


@register_model_head("mae_decoder")
class MAEDecoder(nn.Module):
    """Input: the encoder's ``lastBLK`` tokens of the visible patches [N, 1 + V, in_dim] (class
    token first) and ``mask`` [N, h, w] (True: masked; MULTI_INPUT_HEAD_MAPPING's
    ``additional_keys``).  The tokens are projected to ``decoder_dim``, a learned mask token
    fills every masked position, fixed sine-cosine position embeddings are added, ``depth``
    timm ``Block``s and a LayerNorm run, and a linear layer predicts the ``patch_size^2 *
    in_chans`` pixel values of each patch.  Output: [N, h * w, patch_size^2 * in_chans], in
    grid order (the class token's prediction dropped)."""

    MIXED_PRECISION = True  # under the trunk's autocast (models/head_precision.py)

    def __init__(self, in_dim: int, patch_size: int = 16, in_chans: int = 3,
                 decoder_dim: int = 512, depth: int = 8, num_heads: int = 16,
                 mlp_ratio: float = 4.0):
        super().__init__()
        from timm.models.vision_transformer import Block  # timm only where a ViT is used

        self.embed = nn.Linear(int(in_dim), int(decoder_dim))
        self.mask_token = nn.Parameter(torch.zeros(1, 1, int(decoder_dim)))
        self.blocks = nn.ModuleList(Block(int(decoder_dim), int(num_heads), mlp_ratio=mlp_ratio,
                                          qkv_bias=True) for _ in range(int(depth)))
        use_shared_attention(self.blocks)  # fused attention, timm's parameter names
        self.norm = nn.LayerNorm(int(decoder_dim))
        self.predict = nn.Linear(int(decoder_dim), int(patch_size) ** 2 * int(in_chans))
        self.decoder_dim = int(decoder_dim)
        self._positions = {}  # (height, width, device) -> the embeddings there, made once
        nn.init.normal_(self.mask_token, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def position_embedding(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        """The grid's embeddings on ``device``, copied there once, asynchronously (a plain
        copy from the host makes the host wait for the device's queue)."""
        key = (height, width, device)
        if key not in self._positions:
            self._positions[key] = from_host(
                sincos_position_embedding(height, width, self.decoder_dim), device)
        return self._positions[key]

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if mask is None:
            raise ValueError("mae_decoder needs the patch mask: list it in "
                             "MULTI_INPUT_HEAD_MAPPING's additional_keys")
        rows, height, width = mask.shape
        masked = mask.flatten(1)
        tokens = self.embed(x)
        visible = tokens.shape[1] - 1  # known from the shape: no wait for the device
        assert_on_device((~masked).sum(dim=1) == visible,
                         f"mae_decoder got {visible} visible tokens for a mask leaving another "
                         "number of patches visible")
        index = visible_positions(masked, masked.shape[1] - visible)
        patches = self.mask_token.to(tokens.dtype).expand(rows, height * width, -1)
        patches = patches.scatter(1, index.unsqueeze(-1).expand(-1, -1, self.decoder_dim),
                                  tokens[:, 1:])
        position = self.position_embedding(height, width, tokens.device).to(tokens.dtype)
        sequence = torch.cat([tokens[:, :1], patches + position], dim=1)
        for block in self.blocks:
            sequence = block(sequence)
        return self.predict(self.norm(sequence)[:, 1:])
