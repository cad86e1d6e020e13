"""XCiT trunk (MODEL.TRUNK.NAME xcit, and xcit_fsdp): the Cross-Covariance Image Transformer,
configured by MODEL.TRUNK.XCIT with VISSL's keys and defaults.

The network:

- a convolutional patch embedding: 3x3 convolutions of stride 2 (no bias), each followed by a
  batch norm, with GELU between them: 4 of them (widths D/8, D/4, D/2, D) for ``PATCH_SIZE``
  16, 3 (D/4, D/2, D) for 8, the only two patch sizes;
- Fourier position encodings added to the patch tokens: for the patch at (row r, column c) of
  an H x W grid, y = 2 pi r / H and x = 2 pi c / W (r, c from 1), each divided by the 32
  frequencies 10000^(2 floor(i/2) / 32) and mapped to sin (even i) / cos (odd i); the 64 values
  (y's, then x's) go through a 1x1 convolution to D channels.  They are computed for the grid
  of each input, so any input size runs (multi-crop);
- dropout, then ``NUM_LAYERS`` XCA blocks (LayerNorm eps 1e-6), each adding three branches
  scaled per channel by learned factors starting at ``ETA`` (layer scale):
  cross-covariance attention, local patch interaction, then the MLP
  (``int(D * MLP_RATIO)`` wide, GELU).  Cross-covariance attention works across channels: per
  head, queries and keys are l2-normalised over the tokens, the d x d matrix of their inner
  products is multiplied by a learned per-head temperature and soft-maxed over its last axis,
  and mixes the value channels of every token.  Local patch interaction is a depthwise 3x3
  convolution, GELU, batch norm, a second depthwise 3x3 convolution on the token grid.  Every
  XCA block drops its branches with probability ``DROP_PATH_RATE`` (the same rate in every
  block, as in VISSL);
- a class token appended before the patches, then class-attention blocks: only the class
  token attends (to every token, with the usual scaled dot product, scale ``QK_SCALE`` or
  1/sqrt(head width)) and goes through the MLP; the patch tokens are carried over normalised
  by the block's first norm.  After the attention branch, ``TOKENS_NORM`` normalises every
  token with the block's second norm (false: the class token only) before the MLP branch;
- a final LayerNorm.

``xcit`` has 2 class-attention blocks.  ``xcit_fsdp`` (VISSL's FSDP variant, built here as an
ordinary module that self_supervision_fsdp_task shards) has ``NUM_LAYERS`` of them, because
VISSL's FSDP XCiT builds that many: its checkpoints hold them and load only into it.

Parameter names are those of VISSL's xcit trunk, at the top level of the trunk:
``cls_token``, ``patch_embed.proj.<2i>.{0,1}`` (convolution, batch norm), ``pos_embeder.
token_projection``, ``blocks.<i>.{norm1, attn.{temperature, qkv, proj}, norm3, local_mp.{conv1,
bn, conv2}, norm2, mlp.{fc1, fc2}, gamma1, gamma2, gamma3}``, ``cls_attn_blocks.<i>.{norm1,
attn.{qkv, proj}, norm2, mlp.{fc1, fc2}, gamma1, gamma2}``, ``norm``.

Outputs, named as in VISSL:

- ``lastCLS``: the class token after the final norm, [N, D] (the default);
- ``lastMAP``: the patch tokens after the final norm as a grid, [N, H/P, W/P, D] (channels
  last, as VISSL returns it).
"""
import logging
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import StochasticDepth

from ssl_engine.models.activation_checkpointing import checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk
from ssl_engine.models.trunks.transformer_parts import (Attention, Mlp, OnGrid, attend,
                                                       config_number, init_linear_and_norms,
                                                       run_blocks)
from ssl_engine.utils.key_rules import accept_number_or_false

logger = logging.getLogger(__name__)

CONFIG = "config.MODEL.TRUNK.XCIT"
NORM_EPS = 1e-6
INIT_STD = 0.02
CLASS_ATTENTION_BLOCKS = 2
FOURIER_WIDTH = 32  # frequencies per axis of the position encoding
FOURIER_TEMPERATURE = 10000.0
# PATCH_SIZE -> the widths of the patch embedding's convolutions, as fractions of D
PATCH_EMBED_WIDTHS = {16: (8, 4, 2, 1), 8: (4, 2, 1)}


def _conv_bn(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(out_channels))


class ConvPatchEmbed(nn.Module):
    """``[N, 3, H, W]`` -> patch tokens ``[N, h*w, D]`` and the grid ``(h, w)``."""

    def __init__(self, patch_size: int, dim: int):
        super().__init__()
        layers: List[nn.Module] = []
        channels = 3
        for index, divisor in enumerate(PATCH_EMBED_WIDTHS[patch_size]):
            if index:
                layers.append(nn.GELU())
            layers.append(_conv_bn(channels, dim // divisor))
            channels = dim // divisor
        self.proj = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


class FourierPositionEncoding(nn.Module):
    """``[1, h*w, D]``: sines and cosines of each patch's row and column, projected to D."""

    def __init__(self, dim: int):
        super().__init__()
        self.token_projection = nn.Conv2d(2 * FOURIER_WIDTH, dim, kernel_size=1)

    def forward(self, height: int, width: int) -> torch.Tensor:
        weight = self.token_projection.weight
        eps = 1e-6
        rows = torch.arange(1, height + 1, device=weight.device, dtype=torch.float32)
        cols = torch.arange(1, width + 1, device=weight.device, dtype=torch.float32)
        rows = rows / (height + eps) * 2 * math.pi
        cols = cols / (width + eps) * 2 * math.pi
        index = torch.arange(FOURIER_WIDTH, device=weight.device, dtype=torch.float32)
        frequencies = FOURIER_TEMPERATURE ** (2 * torch.div(index, 2, rounding_mode="floor")
                                              / FOURIER_WIDTH)

        def waves(coordinates: torch.Tensor) -> torch.Tensor:  # [L] -> [L, FOURIER_WIDTH]
            angles = coordinates[:, None] / frequencies
            return torch.stack([angles[:, 0::2].sin(), angles[:, 1::2].cos()], dim=-1).flatten(1)

        y = waves(rows)[:, None, :].expand(height, width, FOURIER_WIDTH)
        x = waves(cols)[None, :, :].expand(height, width, FOURIER_WIDTH)
        grid = torch.cat([y, x], dim=-1).permute(2, 0, 1).unsqueeze(0)  # [1, 64, h, w]
        encoding = self.token_projection(grid.to(weight.dtype))
        return encoding.flatten(2).transpose(1, 2)


class XCA(Attention):
    """Cross-covariance attention: a softmax over channel-by-channel similarities. Through
    the fused attention with the channels of a head as its sequence and the tokens as its
    width: ``q`` and ``k`` [N, heads, head width, T] L2-normalised over the tokens, the
    learned per-head temperature multiplied into ``q`` (the fused call takes one scale for
    every head) and the scale 1. The flash kernel takes widths up to 256, so up to 256 tokens
    (224-pixel images in 16-pixel patches: 196); more tokens run torch's other kernels."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, attn_drop: float,
                 proj_drop: float):
        super().__init__(dim, num_heads, qkv_bias, 1.0, attn_drop, proj_drop)
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        # [3, N, heads, head width, tokens]
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, -1).permute(2, 0, 3, 4, 1)
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        out = attend(q * self.temperature, k, v, None, 1.0, self.dropout)
        return self.proj_drop(self.proj(out.permute(0, 3, 1, 2).reshape(batch, tokens, dim)))


class LPI(nn.Module):
    """Local patch interaction: two depthwise 3x3 convolutions over the token grid."""

    def __init__(self, dim: int):
        super().__init__()
        self.conv1 = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)
        self.act = nn.GELU()
        self.bn = nn.BatchNorm2d(dim)
        self.conv2 = nn.Conv2d(dim, dim, kernel_size=3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        batch, tokens, dim = x.shape
        x = x.transpose(1, 2).reshape(batch, dim, *grid)
        x = self.conv2(self.bn(self.act(self.conv1(x))))
        return x.reshape(batch, dim, tokens).transpose(1, 2)


class XCABlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, qkv_bias: bool, drop: float,
                 attn_drop: float, drop_path: float, eta: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = XCA(dim, num_heads, qkv_bias, attn_drop, drop)
        self.norm3 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.local_mp = LPI(dim)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, mlp_hidden, drop)
        self.gamma1 = nn.Parameter(torch.full((dim,), eta))
        self.gamma2 = nn.Parameter(torch.full((dim,), eta))
        self.gamma3 = nn.Parameter(torch.full((dim,), eta))
        self.drop_path = StochasticDepth(drop_path, "row") if drop_path > 0 else nn.Identity()
        self.grid: Tuple[int, int] = (0, 0)  # set by the trunk for each input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.gamma1 * self.attn(self.norm1(x)))
        x = x + self.drop_path(self.gamma3 * self.local_mp(self.norm3(x), self.grid))
        return x + self.drop_path(self.gamma2 * self.mlp(self.norm2(x)))


class ClassAttention(Attention):
    """Attention of the class token (token 0) to every token: ``[N, 1, D]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.heads(x)
        return self.merge(attend(q[:, :, :1], k, v, None, self.scale, self.dropout))


class ClassAttentionBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, qkv_bias: bool, scale: float,
                 drop: float, attn_drop: float, eta: float, tokens_norm: bool):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = ClassAttention(dim, num_heads, qkv_bias, scale, attn_drop, drop)
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, mlp_hidden, drop)
        self.gamma1 = nn.Parameter(torch.full((dim,), eta))
        self.gamma2 = nn.Parameter(torch.full((dim,), eta))
        self.tokens_norm = tokens_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = self.norm1(x)
        x = x + self.gamma1 * torch.cat([self.attn(normed), normed[:, 1:]], dim=1)
        if self.tokens_norm:
            x = self.norm2(x)
        else:
            x = torch.cat([self.norm2(x[:, :1]), x[:, 1:]], dim=1)
        return x + torch.cat([self.gamma2 * self.mlp(x[:, :1]), x[:, 1:]], dim=1)


# ------------------------------------------------------------------ configuration
def _number(cfg, key: str, allow_false: bool = False) -> float:
    return config_number(CONFIG, cfg, key, allow_false)


def check_xcit_config(model_cfg) -> None:
    """Refuse, naming the key, a MODEL.TRUNK.XCIT setting the trunk cannot build."""
    cfg = model_cfg.TRUNK.XCIT
    if cfg.get("name"):
        raise ValueError(f"{CONFIG}.name={cfg.name!r} is not supported: VISSL's XCiT reads no "
                         "preset either; set HIDDEN_DIM, NUM_LAYERS, NUM_HEADS ... and leave "
                         "name null")
    for key in ("HIDDEN_DIM", "NUM_LAYERS", "NUM_HEADS"):
        if int(cfg[key]) < 1:
            raise ValueError(f"{CONFIG}.{key} must be at least 1, got {cfg[key]!r}")
    if int(cfg.PATCH_SIZE) not in PATCH_EMBED_WIDTHS:
        raise ValueError(f"{CONFIG}.PATCH_SIZE={cfg.PATCH_SIZE!r} must be 16 or 8 (the patch "
                         "embedding's convolutions exist for these two)")
    dim = int(cfg.HIDDEN_DIM)
    smallest = PATCH_EMBED_WIDTHS[int(cfg.PATCH_SIZE)][0]
    if dim % smallest:
        raise ValueError(f"{CONFIG}.HIDDEN_DIM={dim} must be a multiple of {smallest} with "
                         f"PATCH_SIZE={cfg.PATCH_SIZE} (the patch embedding's widths)")
    if dim % int(cfg.NUM_HEADS):
        raise ValueError(f"{CONFIG}.NUM_HEADS={cfg.NUM_HEADS} must divide HIDDEN_DIM={dim}")
    if int(dim * _number(cfg, "MLP_RATIO")) < 1:
        raise ValueError(f"{CONFIG}.MLP_RATIO={cfg.MLP_RATIO} gives an empty MLP")
    for key in ("DROPOUT_RATE", "ATTENTION_DROPOUT_RATE", "DROP_PATH_RATE"):
        if not 0 <= _number(cfg, key, allow_false=True) < 1:
            raise ValueError(f"{CONFIG}.{key}={cfg[key]!r} must be in [0, 1)")
    _number(cfg, "ETA")
    if _number(cfg, "QK_SCALE", allow_false=True) < 0:
        raise ValueError(f"{CONFIG}.QK_SCALE={cfg.QK_SCALE!r} must be false or > 0")
    checkpointing_splits(model_cfg)


accept_number_or_false("config.MODEL.TRUNK.XCIT.ETA", "config.MODEL.TRUNK.XCIT.QK_SCALE")

@register_model_trunk("xcit")
class XCiTTrunk(StagedTrunk):
    """Outputs: lastCLS (default), lastMAP; see the module docstring."""

    default_out_feat_key = "lastCLS"

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_xcit_config(model_cfg)

    def __init__(self, model_cfg, class_attention_blocks: int = CLASS_ATTENTION_BLOCKS):
        super().__init__(model_cfg)
        cfg = model_cfg.TRUNK.XCIT
        dim, heads = int(cfg.HIDDEN_DIM), int(cfg.NUM_HEADS)
        mlp_hidden = int(dim * _number(cfg, "MLP_RATIO"))
        drop = _number(cfg, "DROPOUT_RATE", allow_false=True)
        attn_drop = _number(cfg, "ATTENTION_DROPOUT_RATE", allow_false=True)
        eta = _number(cfg, "ETA")
        qkv_bias = bool(cfg.QKV_BIAS)
        self.patch_embed = ConvPatchEmbed(int(cfg.PATCH_SIZE), dim)
        self.pos_embeder = FourierPositionEncoding(dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_drop = nn.Dropout(drop)
        self.blocks = nn.ModuleList(
            XCABlock(dim, heads, mlp_hidden, qkv_bias, drop, attn_drop,
                     _number(cfg, "DROP_PATH_RATE", allow_false=True), eta)
            for _ in range(int(cfg.NUM_LAYERS)))
        scale = _number(cfg, "QK_SCALE", allow_false=True) or (dim // heads) ** -0.5
        self.cls_attn_blocks = nn.ModuleList(
            ClassAttentionBlock(dim, heads, mlp_hidden, qkv_bias, scale, drop, attn_drop, eta,
                                bool(cfg.TOKENS_NORM))
            for _ in range(class_attention_blocks))
        self.norm = nn.LayerNorm(dim, eps=NORM_EPS)
        splits = checkpointing_splits(model_cfg)
        # MODEL.ACTIVATION_CHECKPOINTING or VISSL's per-block switches: every block is recomputed
        self.checkpoint_xca = bool(splits or cfg.get("CHECKPOINT_XCA_BLOCK", False))
        self.checkpoint_class_attention = bool(splits or cfg.get("CHECKPOINT_ATTN_BLOCK", False))
        self.stage_dims = {"lastCLS": dim, "lastMAP": dim}
        self._init_weights()

    def _init_weights(self) -> None:
        """Truncated normal (std 0.02) class token and linear weights, zero linear biases, unit
        LayerNorms; convolutions keep torch's initialisation."""
        nn.init.trunc_normal_(self.cls_token, std=INIT_STD)
        init_linear_and_norms(self, INIT_STD)

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the blocks."""
        return list(self.blocks) + list(self.cls_attn_blocks)

    def stages(self):
        raise NotImplementedError("the XCiT outputs share one pass through the blocks: "
                                  "call forward(x, out_feat_keys)")

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        """The outputs named in ``out_feat_keys`` (default: lastCLS), in that order."""
        keys = self.check_out_feat_keys(out_feat_keys)
        x, grid = self.patch_embed(x)
        x = self.pos_drop(x + self.pos_embeder(*grid))
        blocks = [OnGrid(block, block, grid) for block in self.blocks]
        # checkpointed: one segment per block
        x = run_blocks(blocks, x, len(blocks) if self.checkpoint_xca else 0)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
        splits = len(self.cls_attn_blocks) if self.checkpoint_class_attention else 0
        x = self.norm(run_blocks(self.cls_attn_blocks, x, splits))
        found: Dict[str, torch.Tensor] = {
            "lastCLS": x[:, 0],
            "lastMAP": x[:, 1:].reshape(len(x), grid[0], grid[1], -1),
        }
        return [found[key] for key in keys]


@register_model_trunk("xcit_fsdp")
class XCiTFSDPTrunk(XCiTTrunk):
    """VISSL's xcit_fsdp: the xcit trunk with NUM_LAYERS class-attention blocks (VISSL's FSDP
    XCiT builds that many), as an ordinary module that self_supervision_fsdp_task shards."""

    def __init__(self, model_cfg):
        logger.info("trunk xcit_fsdp: built as the ordinary xcit with NUM_LAYERS=%s "
                    "class-attention blocks, as VISSL builds it (TRAINER.TASK_NAME="
                    "self_supervision_fsdp_task shards it)", model_cfg.TRUNK.XCIT.NUM_LAYERS)
        super().__init__(model_cfg, class_attention_blocks=int(model_cfg.TRUNK.XCIT.NUM_LAYERS))
