"""data2vec 2.0's decoder (Baevski et al. 2022): a light convolutional network that predicts
the teacher's representation of every patch from the student encoder's visible tokens.

The encoder (the ViT with MASKED_IMAGE_MODELING.NAME=mae) encodes only the visible patches;
the decoder puts them back on the patch grid, fills every masked position with Gaussian noise
of std ``mask_noise_std`` (the paper's released setting 0.01, no learned mask token), and runs
``depth`` blocks of [grouped ``kernel_size`` x ``kernel_size`` convolution -> layer norm over
the channels (no affine parameters) -> GELU] on the grid, each block's input added to its
output where the widths agree (every block but a first one that changes the width); a linear
layer then maps each position to ``out_dim`` (the teacher's width).  The sizes of the paper's
ViT-B: 6 blocks, width 768, kernel 3, 16 groups.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ssl_engine.models.registry import register_model_head
from ssl_engine.models.trunks.token_gather import assert_on_device, visible_positions


class _ConvBlock(nn.Module):
    """conv (grouped, same padding) -> LayerNorm over channels -> GELU, on [N, C, h, w]."""

    def __init__(self, in_dim: int, out_dim: int, kernel_size: int, groups: int):
        super().__init__()
        if in_dim % groups or out_dim % groups:
            raise ValueError(f"data2vec_decoder: groups={groups} must divide the widths "
                             f"{in_dim} and {out_dim}")
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size, padding=kernel_size // 2,
                              groups=groups)
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x = F.layer_norm(x.permute(0, 2, 3, 1), (self.out_dim,)).permute(0, 3, 1, 2)
        return F.gelu(x)


@register_model_head("data2vec_decoder")
class Data2VecDecoder(nn.Module):
    """Input: the encoder's ``lastBLK`` tokens of the visible patches [N, prefix + V, in_dim]
    (``prefix_tokens`` leading class tokens, dropped: 1 with the ViT's class token, 0 with
    ``USE_CLASS_TOKEN: false``) and ``mask`` [N, h, w] (True: masked; MULTI_INPUT_HEAD_MAPPING's
    ``additional_keys``); every image masks as many patches.  Output: [N, h * w, out_dim]
    predictions for every patch in grid order (the loss reads the masked ones)."""

    MIXED_PRECISION = True  # under the trunk's autocast (models/head_precision.py)

    def __init__(self, in_dim: int, out_dim: Optional[int] = None, decoder_dim: int = 768,
                 depth: int = 6, kernel_size: int = 3, groups: int = 16,
                 mask_noise_std: float = 0.01, prefix_tokens: int = 1):
        super().__init__()
        if depth < 1 or kernel_size < 1 or kernel_size % 2 == 0:
            raise ValueError(f"data2vec_decoder needs depth >= 1 and an odd kernel_size, got "
                             f"depth={depth}, kernel_size={kernel_size}")
        if mask_noise_std < 0 or prefix_tokens < 0:
            raise ValueError(f"data2vec_decoder: mask_noise_std and prefix_tokens must be >= 0, "
                             f"got {mask_noise_std} and {prefix_tokens}")
        widths = [int(in_dim)] + [int(decoder_dim)] * int(depth)
        self.blocks = nn.ModuleList(_ConvBlock(widths[i], widths[i + 1], int(kernel_size),
                                               int(groups)) for i in range(int(depth)))
        self.residual = [widths[i] == widths[i + 1] for i in range(int(depth))]
        self.predict = nn.Linear(int(decoder_dim), int(out_dim or in_dim))
        self.in_dim, self.mask_noise_std = int(in_dim), float(mask_noise_std)
        self.prefix_tokens = int(prefix_tokens)

    def on_grid(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[N, in_dim, h, w]: the visible tokens at their positions, noise at the masked."""
        rows, height, width = mask.shape
        masked = mask.flatten(1)
        visible = tokens.shape[1]  # known from the shape: no wait for the device
        assert_on_device((~masked).sum(dim=1) == visible,
                         f"data2vec_decoder got {visible} visible tokens for a mask leaving "
                         "another number of patches visible (check prefix_tokens)")
        index = visible_positions(masked, masked.shape[1] - visible)
        grid = torch.randn(rows, height * width, self.in_dim, device=tokens.device,
                           dtype=tokens.dtype) * self.mask_noise_std
        grid = grid.scatter(1, index.unsqueeze(-1).expand(-1, -1, self.in_dim), tokens)
        return grid.transpose(1, 2).reshape(rows, self.in_dim, height, width)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if mask is None:
            raise ValueError("data2vec_decoder needs the patch mask: list it in "
                             "MULTI_INPUT_HEAD_MAPPING's additional_keys")
        if x.ndim != 3 or x.shape[-1] != self.in_dim:
            raise ValueError(f"data2vec_decoder takes tokens [N, prefix + V, {self.in_dim}] "
                             f"(lastBLK), got {tuple(x.shape)}")
        grid = self.on_grid(x[:, self.prefix_tokens:], mask.bool())
        for block, residual in zip(self.blocks, self.residual):
            grid = grid + block(grid) if residual else block(grid)
        return self.predict(grid.flatten(2).transpose(1, 2))
