"""Swin Transformer trunk (MODEL.TRUNK.NAME swin_transformer), configured by
MODEL.TRUNK.SWIN_TRANSFORMER with VISSL's keys and defaults (Swin-T: EMBED_DIM 96, DEPTHS
[2, 2, 6, 2], NUM_HEADS [3, 6, 12, 24], WINDOW_SIZE 7, PATCH_SIZE 4).

The network, as VISSL's swin_transformer trunk computes it (any input size, for multi-crop):

- patch embedding: the image padded on the right and bottom to a multiple of ``PATCH_SIZE``,
  a ``PATCH_SIZE`` x ``PATCH_SIZE`` convolution of that stride to ``EMBED_DIM`` channels, a
  LayerNorm; then dropout;
- ``len(DEPTHS)`` stages, stage i of width ``EMBED_DIM * 2**i`` with ``DEPTHS[i]`` blocks of
  ``NUM_HEADS[i]`` heads, each stage but the last ending in a patch merging: the grid padded
  to even sides, the 2x2 neighbours concatenated (in the order (0, 0), (1, 0), (0, 1), (1, 1)
  of (row, column)), a LayerNorm over the 4C channels and a linear map (no bias) to 2C;
- a block: ``x + attention(norm1(x))`` then ``x + mlp(norm2(x))`` (MLP ``int(C * MLP_RATIO)``
  wide, GELU), each branch dropped with the block's stochastic-depth rate (rising linearly
  from 0 to ``DROP_PATH_RATE`` over all blocks).  The attention is self-attention inside
  non-overlapping w x w windows of the normed grid (zero-padded on the right and bottom to a
  multiple of w), with scale ``QK_SCALE`` or 1/sqrt(head width) and a learned bias per head
  for each relative offset of two tokens in a window (a table of (2w-1)^2 rows per head).
  Every second block of a stage shifts the windows by w // 2: the grid is rolled up and left
  by that much before the partition and back after it, and tokens brought together in a
  window from opposite edges of the grid do not attend to each other (a score of -100 is
  added for them);
- a final LayerNorm of the last stage's tokens, averaged over the tokens.

The window side w and the bias tables are set at construction from ``IMAGE_SIZE``: at stage
i the grid has ``IMAGE_SIZE // PATCH_SIZE // 2**i`` tokens a side; where that is at most
``WINDOW_SIZE``, the window is the whole grid and no block of the stage shifts.  For another
input, a stage whose grid (H x W) is not larger than w on both sides attends within
min(H, W, w) windows without shifting, and reads the first (w')^2 rows and columns of the
w x w window's offset index for its smaller w' windows, as VISSL's trunk does.

Parameter names are those of VISSL's swin_transformer trunk, at the top level of the trunk:
``patch_embed.{proj, norm}``, ``layers.<i>.blocks.<j>.{norm1, attn.{relative_position_bias_table,
relative_position_index, qkv, proj}, norm2, mlp.{fc1, fc2}}``, ``layers.<i>.downsample.{norm,
reduction}``, ``norm``.  The offset index is saved with the weights, as in VISSL.

Output: ``lastCLS`` ([N, EMBED_DIM * 2**(len(DEPTHS) - 1)], the default and only one): the
normed last-stage tokens averaged.  VISSL's trunk returns this one output whatever name is
asked for; its configs call it lastCLS.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import StochasticDepth

from ssl_engine.models.activation_checkpointing import checkpointed_segments, checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk, drop_path_rates
from ssl_engine.models.trunks.transformer_parts import (Attention, Mlp, attend, config_number,
                                                       init_linear_and_norms)
from ssl_engine.utils.key_rules import accept_number_or_false

CONFIG = "config.MODEL.TRUNK.SWIN_TRANSFORMER"
INIT_STD = 0.02
MASKED_SCORE = -100.0  # added to the score of two tokens that may not attend to each other


# ------------------------------------------------------------------ windows
def window_relative_position_index(window: int) -> torch.Tensor:
    """``[w*w, w*w]``: the bias-table row of each (query, key) pair of a w x w window.

    Tokens are numbered row-major; tokens at (r, c) and (r', c') read row
    ``(r - r' + w - 1) * (2w - 1) + (c - c' + w - 1)``.
    """
    rows = torch.arange(window).repeat_interleave(window)
    cols = torch.arange(window).repeat(window)
    row_offset = rows[:, None] - rows[None, :] + window - 1
    col_offset = cols[:, None] - cols[None, :] + window - 1
    return row_offset * (2 * window - 1) + col_offset


def to_windows(x: torch.Tensor, window: int) -> torch.Tensor:
    """``[N, H, W, C]`` -> ``[N * (H/w) * (W/w), w*w, C]``, windows in row-major order."""
    n, height, width, channels = x.shape
    x = x.reshape(n, height // window, window, width // window, window, channels)
    return x.transpose(2, 3).reshape(-1, window * window, channels)


def from_windows(windows: torch.Tensor, window: int, height: int, width: int) -> torch.Tensor:
    """The inverse of ``to_windows``: ``[N * (H/w) * (W/w), w*w, C]`` -> ``[N, H, W, C]``."""
    channels = windows.shape[-1]
    x = windows.reshape(-1, height // window, width // window, window, window, channels)
    return x.transpose(2, 3).reshape(-1, height, width, channels)


def shifted_window_mask(height: int, width: int, window: int, shift: int,
                        device: Optional[torch.device] = None) -> torch.Tensor:
    """``[windows, w*w, w*w]``: 0 where two tokens of a window of the rolled ``H x W`` grid may
    attend to each other, ``MASKED_SCORE`` where they came from different regions.

    Along each axis of length L the rolled grid has three regions: [0, L - w), [L - w, L -
    shift) and [L - shift, L) (the last one wrapped around from the start).
    """
    def regions(length: int) -> torch.Tensor:
        coords = torch.arange(length, device=device)
        return (coords >= length - window).long() + (coords >= length - shift).long()

    labels = regions(height)[:, None] * 3 + regions(width)[None, :]
    labels = to_windows(labels[None, :, :, None], window)[..., 0]  # [windows, w*w]
    different = labels[:, :, None] != labels[:, None, :]
    return torch.zeros(different.shape, device=device).masked_fill(different, MASKED_SCORE)


class WindowAttention(Attention):
    """Multi-head self-attention inside each window, with a learned relative position bias,
    added to the scores as the fused attention's mask (with the shifted windows' mask)."""

    def __init__(self, dim: int, window: int, num_heads: int, qkv_bias: bool,
                 scale: Optional[float], attn_drop: float, proj_drop: float):
        super().__init__(dim, num_heads, qkv_bias, scale or (dim // num_heads) ** -0.5,
                         attn_drop, proj_drop)
        self.relative_position_bias_table = nn.Parameter(
            torch.zeros((2 * window - 1) ** 2, num_heads))
        self.register_buffer("relative_position_index", window_relative_position_index(window))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=INIT_STD)

    def scores_bias(self, tokens: int) -> torch.Tensor:
        """The relative position bias, ``[heads, T, T]``."""
        index = self.relative_position_index[:tokens, :tokens]
        bias = self.relative_position_bias_table[index.reshape(-1)]
        return bias.reshape(tokens, tokens, -1).permute(2, 0, 1)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``x``: ``[windows * N, T, C]`` (T = w'*w'); ``mask``: ``[windows, T, T]`` or None."""
        batch, tokens, _ = x.shape
        q, k, v = self.heads(x)
        bias = self.scores_bias(tokens)[None]  # [1, heads, T, T]
        if mask is not None:  # per window, the same for every image: [windows * N, heads, T, T]
            windows = mask.shape[0]
            bias = (bias + mask[:, None]).expand(batch // windows, -1, -1, -1, -1)
            bias = bias.reshape(batch, self.num_heads, tokens, tokens)
        return self.merge(attend(q, k, v, bias, self.scale, self.dropout))


class SwinBlock(nn.Module):
    """(Shifted-)window attention and an MLP on an ``[N, H, W, C]`` grid."""

    def __init__(self, dim: int, grid: int, num_heads: int, window: int, shift: int,
                 mlp_hidden: int, qkv_bias: bool, scale: Optional[float], drop: float,
                 attn_drop: float, drop_path: float):
        super().__init__()
        if grid <= window:  # the window covers the grid (at IMAGE_SIZE): nothing to shift
            window, shift = grid, 0
        self.window, self.shift = window, shift
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window, num_heads, qkv_bias, scale, attn_drop, drop)
        self.drop_path = StochasticDepth(drop_path, "row") if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_hidden, drop)

    def window_and_shift(self, height: int, width: int) -> Tuple[int, int]:
        """The window side and shift for an ``H x W`` grid."""
        if min(height, width) <= self.window:
            return min(height, width, self.window), 0
        return self.window, self.shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, height, width, _ = x.shape
        window, shift = self.window_and_shift(height, width)
        pad_bottom, pad_right = -height % window, -width % window
        y = F.pad(self.norm1(x), (0, 0, 0, pad_right, 0, pad_bottom))
        padded_height, padded_width = height + pad_bottom, width + pad_right
        mask = None
        if shift:
            y = torch.roll(y, shifts=(-shift, -shift), dims=(1, 2))
            mask = shifted_window_mask(padded_height, padded_width, window, shift, x.device)
        y = self.attn(to_windows(y, window), mask.to(y.dtype) if mask is not None else None)
        y = from_windows(y, window, padded_height, padded_width)
        if shift:
            y = torch.roll(y, shifts=(shift, shift), dims=(1, 2))
        x = x + self.drop_path(y[:, :height, :width])
        return x + self.drop_path(self.mlp(self.norm2(x)))


class PatchMerging(nn.Module):
    """``[N, H, W, C]`` -> ``[N, ceil(H/2), ceil(W/2), 2C]``: each 2x2 group of tokens, normed
    and mapped linearly to 2C."""

    def __init__(self, dim: int):
        super().__init__()
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, height, width, _ = x.shape
        x = F.pad(x, (0, 0, 0, width % 2, 0, height % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]],
                      dim=-1)
        return self.reduction(self.norm(x))


class SwinStage(nn.Module):
    """The blocks of one stage, then (but in the last stage) a patch merging."""

    def __init__(self, blocks: List[SwinBlock], downsample: Optional[PatchMerging]):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.downsample = downsample  # None in the last stage: no parameters, as in VISSL

    def forward(self, x: torch.Tensor, checkpoint_splits: int = 0) -> torch.Tensor:
        if checkpoint_splits and torch.is_grad_enabled():
            x = checkpointed_segments(list(self.blocks), checkpoint_splits)(x)
        else:
            for block in self.blocks:
                x = block(x)
        return self.downsample(x) if self.downsample is not None else x


class PatchEmbed(nn.Module):
    """``[N, 3, H, W]`` -> ``[N, ceil(H/P), ceil(W/P), EMBED_DIM]``, normed."""

    def __init__(self, patch_size: int, dim: int):
        super().__init__()
        self.patch_size = patch_size
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        x = F.pad(x, (0, -width % self.patch_size, 0, -height % self.patch_size))
        return self.norm(self.proj(x).permute(0, 2, 3, 1))


# ------------------------------------------------------------------ configuration
def _number(cfg, key: str, allow_false: bool = False) -> float:
    return config_number(CONFIG, cfg, key, allow_false)


def _int_list(cfg, key: str) -> List[int]:
    values = cfg.get(key)
    if (not isinstance(values, (list, tuple)) or not values
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                       for v in values)):
        raise ValueError(f"{CONFIG}.{key}={values!r} must be a list of integers >= 1 "
                         "(one per stage)")
    return [int(v) for v in values]


def _positive_int(cfg, key: str) -> int:
    value = cfg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{CONFIG}.{key}={value!r} must be an integer >= 1")
    return value


def check_swin_config(model_cfg) -> None:
    """Refuse, naming the key, a MODEL.TRUNK.SWIN_TRANSFORMER setting the trunk cannot build."""
    cfg = model_cfg.TRUNK.SWIN_TRANSFORMER
    if cfg.get("name"):
        raise ValueError(f"{CONFIG}.name={cfg.name!r} is not supported: VISSL's Swin reads no "
                         "preset either; set EMBED_DIM, DEPTHS, NUM_HEADS ... and leave name null")
    depths, heads = _int_list(cfg, "DEPTHS"), _int_list(cfg, "NUM_HEADS")
    if len(heads) != len(depths):
        raise ValueError(f"{CONFIG}.NUM_HEADS={heads} must have one entry per stage of "
                         f"DEPTHS={depths}")
    dim = _positive_int(cfg, "EMBED_DIM")
    for stage, count in enumerate(heads):
        if (dim << stage) % count:
            raise ValueError(f"{CONFIG}.NUM_HEADS[{stage}]={count} must divide the stage's "
                             f"width EMBED_DIM * 2**{stage} = {dim << stage}")
    _positive_int(cfg, "WINDOW_SIZE")
    grid = _positive_int(cfg, "IMAGE_SIZE") // _positive_int(cfg, "PATCH_SIZE")
    if grid >> (len(depths) - 1) < 1:
        raise ValueError(f"{CONFIG}.IMAGE_SIZE={cfg.IMAGE_SIZE} is too small: the last of the "
                         f"{len(depths)} stages would have no token (IMAGE_SIZE // PATCH_SIZE "
                         f"must be at least {1 << (len(depths) - 1)})")
    if int(dim * _number(cfg, "MLP_RATIO")) < 1:
        raise ValueError(f"{CONFIG}.MLP_RATIO={cfg.MLP_RATIO} gives an empty MLP")
    for key in ("DROPOUT_RATE", "ATTENTION_DROPOUT_RATE", "DROP_PATH_RATE"):
        if not 0 <= _number(cfg, key, allow_false=True) < 1:
            raise ValueError(f"{CONFIG}.{key}={cfg[key]!r} must be in [0, 1)")
    if _number(cfg, "QK_SCALE", allow_false=True) < 0:
        raise ValueError(f"{CONFIG}.QK_SCALE={cfg.QK_SCALE!r} must be false or > 0")
    checkpointing_splits(model_cfg)


accept_number_or_false("config.MODEL.TRUNK.SWIN_TRANSFORMER.QK_SCALE")

@register_model_trunk("swin_transformer")
class SwinTransformerTrunk(StagedTrunk):
    """Output: lastCLS (the normed last-stage tokens averaged); see the module docstring."""

    default_out_feat_key = "lastCLS"

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_swin_config(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        cfg = model_cfg.TRUNK.SWIN_TRANSFORMER
        depths, heads = [int(d) for d in cfg.DEPTHS], [int(h) for h in cfg.NUM_HEADS]
        dim, window = int(cfg.EMBED_DIM), int(cfg.WINDOW_SIZE)
        drop = _number(cfg, "DROPOUT_RATE", allow_false=True)
        attn_drop = _number(cfg, "ATTENTION_DROPOUT_RATE", allow_false=True)
        scale = _number(cfg, "QK_SCALE", allow_false=True) or None
        mlp_ratio = _number(cfg, "MLP_RATIO")
        rates = drop_path_rates(_number(cfg, "DROP_PATH_RATE", allow_false=True), sum(depths))
        grid = int(cfg.IMAGE_SIZE) // int(cfg.PATCH_SIZE)
        self.patch_embed = PatchEmbed(int(cfg.PATCH_SIZE), dim)
        self.pos_drop = nn.Dropout(drop)
        self.layers = nn.ModuleList()
        for stage, (depth, num_heads) in enumerate(zip(depths, heads)):
            width, first = dim << stage, sum(depths[:stage])
            blocks = [SwinBlock(width, grid >> stage, num_heads, window,
                                window // 2 if j % 2 else 0, int(width * mlp_ratio),
                                bool(cfg.QKV_BIAS), scale, drop, attn_drop, rates[first + j])
                      for j in range(depth)]
            last = stage == len(depths) - 1
            self.layers.append(SwinStage(blocks, None if last else PatchMerging(width)))
        out_dim = dim << (len(depths) - 1)
        self.norm = nn.LayerNorm(out_dim)
        self.checkpoint_splits = checkpointing_splits(model_cfg)
        self.stage_dims = {"lastCLS": out_dim}
        init_linear_and_norms(self, INIT_STD)

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the stages."""
        return list(self.layers)

    def stages(self):
        raise NotImplementedError("the Swin trunk has one output: call forward(x, out_feat_keys)")

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        keys = self.check_out_feat_keys(out_feat_keys)
        x = self.pos_drop(self.patch_embed(x))
        for stage in self.layers:
            x = stage(x, self.checkpoint_splits)
        output = self.norm(x.flatten(1, 2)).mean(dim=1)
        return [output for _ in keys]
