"""BEiT trunk (MODEL.TRUNK.NAME beit): a Vision Transformer with relative position biases and
layer scale, configured by MODEL.TRUNK.BEIT with VISSL's keys and defaults.

The network:

- a patch embedding (a ``PATCH_SIZE`` convolution with the same stride), a class token and,
  with ``USE_ABS_POS_EMB``, learned absolute position embeddings, then dropout;
- ``NUM_LAYERS`` pre-norm blocks (LayerNorm eps 1e-6).  Attention projects queries, keys and
  values with one bias-free linear layer; with ``QKV_BIAS`` a learned bias is added to the
  queries and values only (the keys get none).  Scores are scaled by ``QK_SCALE`` (false: the
  inverse square root of the head width).  With ``USE_REL_POS_BIAS`` every block adds its own
  learned relative position bias to the scores, with ``USE_SHARED_REL_POS_BIAS`` all blocks
  add one shared bias (both may be on).  The MLP is ``int(HIDDEN_DIM * MLP_RATIO)`` wide
  (GELU), with dropout after its second layer.  With ``INIT_VALUES`` (a number > 0) the
  attention and MLP branches are scaled per channel by learned factors starting at that value
  (layer scale); false, null or 0: no scaling.  ``DROP_PATH_RATE`` rises linearly from 0 over
  the blocks (stochastic depth);
- a final LayerNorm, or none with ``USE_MEAN_POOLING``.  As in VISSL, that switch only removes
  the final norm: the outputs below still read the class token (``lastPOOL`` is the mean of
  the patch tokens).

The relative position bias of an ``H x W`` patch grid is a table of ``(2H-1)(2W-1) + 3`` rows
(one per patch offset, plus class token -> patch, patch -> class token and class token ->
itself), one column per head, indexed by a fixed ``[HW+1, HW+1]`` index
(``relative_position_index``, saved with the weights as in VISSL).

Parameter names are those of VISSL's beit trunk, at the top level of the trunk (it has no
``_feature_blocks``): ``cls_token``, ``pos_embed``, ``patch_embed.proj``, ``rel_pos_bias.*``,
``blocks.<i>.{norm1, attn.{qkv, q_bias, v_bias, relative_position_bias_table,
relative_position_index, proj}, norm2, mlp.{fc1, fc2}, gamma_1, gamma_2}``, ``norm``.

Outputs, named as in VISSL (all [N, D] but the concatenations; "normed" is through the final
norm, which is the identity with USE_MEAN_POOLING):

- ``lastCLS``: the normed class token of the last block (the default);
- ``blkCLS<i>``: the normed class token of block i (0-based);
- ``concatCLS<n>``: the normed class tokens of the last n blocks, concatenated (n x D);
- ``lastPOOL``: the mean of the last block's normed patch tokens (this engine's addition, the
  name of the vision_transformer trunk's output).

Inputs must be ``IMAGE_SIZE`` square, as in VISSL (the position embeddings and the relative
position index are those of one patch grid).
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint
from torchvision.ops import StochasticDepth

from ssl_engine.models.activation_checkpointing import checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk, drop_path_rates
from ssl_engine.models.trunks.transformer_parts import Attention as SharedAttention
from ssl_engine.models.trunks.transformer_parts import Mlp, attend, init_linear_and_norms
from ssl_engine.utils.key_rules import accept_number_or_false

CONFIG = "config.MODEL.TRUNK.BEIT"
NORM_EPS = 1e-6
INIT_STD = 0.02


# ------------------------------------------------------------------ relative position bias
def relative_position_index(grid: Tuple[int, int]) -> torch.Tensor:
    """``[T, T]`` (T = H*W + 1, the class token first) rows of the bias table for each pair
    (query token, key token) on an ``H x W`` patch grid.

    Patches at (row, col) and (row', col') read row ``(row - row' + H - 1) * (2W - 1) +
    (col - col' + W - 1)``; with R = (2H-1)(2W-1) table rows for offsets, the class token as
    query reads R, as key R + 1, and both R + 2.
    """
    height, width = grid
    rows = torch.arange(height).repeat_interleave(width)  # row of each patch, row-major
    cols = torch.arange(width).repeat(height)
    row_offset = rows[:, None] - rows[None, :] + (height - 1)
    col_offset = cols[:, None] - cols[None, :] + (width - 1)
    offsets = (2 * height - 1) * (2 * width - 1)
    index = torch.empty(height * width + 1, height * width + 1, dtype=torch.long)
    index[1:, 1:] = row_offset * (2 * width - 1) + col_offset
    index[0, :] = offsets  # the class token attending to any token
    index[:, 0] = offsets + 1  # any patch attending to the class token
    index[0, 0] = offsets + 2
    return index


def _add_relative_position_table(module: nn.Module, grid: Tuple[int, int],
                                 num_heads: int) -> None:
    """Give ``module`` a zero ``relative_position_bias_table`` [rows, heads] and its index."""
    rows = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3
    module.relative_position_bias_table = nn.Parameter(torch.zeros(rows, num_heads))
    module.register_buffer("relative_position_index", relative_position_index(grid))


def _relative_position_bias(module: nn.Module) -> torch.Tensor:
    """``[heads, T, T]``: the bias each head adds to its attention scores."""
    index = module.relative_position_index
    bias = module.relative_position_bias_table[index.reshape(-1)]
    return bias.reshape(*index.shape, -1).permute(2, 0, 1)


class RelativePositionBias(nn.Module):
    """One relative position bias, shared by every block (USE_SHARED_REL_POS_BIAS)."""

    def __init__(self, grid: Tuple[int, int], num_heads: int):
        super().__init__()
        _add_relative_position_table(self, grid, num_heads)

    def forward(self) -> torch.Tensor:
        return _relative_position_bias(self)


# ------------------------------------------------------------------ the network
class PatchEmbed(nn.Module):
    """``[N, 3, S, S]`` -> ``[N, (S/P)^2, D]`` by a P x P convolution of stride P."""

    def __init__(self, image_size: int, patch_size: int, dim: int):
        super().__init__()
        self.image_size = image_size
        self.grid = (image_size // patch_size, image_size // patch_size)
        self.proj = nn.Conv2d(3, dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if tuple(x.shape[-2:]) != (self.image_size, self.image_size):
            raise ValueError(f"the beit trunk takes {self.image_size}x{self.image_size} images "
                             f"({CONFIG}.IMAGE_SIZE), got {tuple(x.shape[-2:])}")
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(SharedAttention):
    """BEiT's attention: separate query and value biases (the keys have none), a relative
    position bias of its own and/or one shared by every block, added to the scores."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, scale: float,
                 attn_drop: float, proj_drop: float, grid: Optional[Tuple[int, int]]):
        super().__init__(dim, num_heads, False, scale, attn_drop, proj_drop)
        if qkv_bias:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = self.v_bias = None
        self.has_relative_bias = grid is not None
        if grid is not None:
            _add_relative_position_table(self, grid, num_heads)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        bias = None
        if self.q_bias is not None:
            bias = torch.cat([self.q_bias, torch.zeros_like(self.q_bias), self.v_bias])
        return F.linear(x, self.qkv.weight, bias)

    def forward(self, x: torch.Tensor, shared_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        q, k, v = self.heads(x)
        scores_bias = shared_bias
        if self.has_relative_bias:
            own = _relative_position_bias(self)
            scores_bias = own if scores_bias is None else scores_bias + own
        if scores_bias is not None:
            scores_bias = scores_bias.unsqueeze(0)
        return self.merge(attend(q, k, v, scores_bias, self.scale, self.dropout))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_hidden: int, qkv_bias: bool, scale: float,
                 drop: float, attn_drop: float, drop_path: float, init_values: float,
                 grid: Optional[Tuple[int, int]]):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.attn = Attention(dim, num_heads, qkv_bias, scale, attn_drop, drop, grid)
        self.drop_path = StochasticDepth(drop_path, "row") if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=NORM_EPS)
        self.mlp = Mlp(dim, mlp_hidden, drop, drop_hidden=False)
        if init_values > 0:
            self.gamma_1 = nn.Parameter(torch.full((dim,), float(init_values)))
            self.gamma_2 = nn.Parameter(torch.full((dim,), float(init_values)))
        else:
            self.gamma_1 = self.gamma_2 = None

    def forward(self, x: torch.Tensor, shared_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        branch = self.attn(self.norm1(x), shared_bias)
        x = x + self.drop_path(branch if self.gamma_1 is None else self.gamma_1 * branch)
        branch = self.mlp(self.norm2(x))
        return x + self.drop_path(branch if self.gamma_2 is None else self.gamma_2 * branch)


# ------------------------------------------------------------------ configuration
def _number(cfg, key: str) -> float:
    value = cfg.get(key)
    if value is None or value is False:
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{CONFIG}.{key}={value!r} must be a number or false") from None


def check_beit_config(model_cfg) -> None:
    """Refuse, naming the key, a MODEL.TRUNK.BEIT setting the trunk cannot build."""
    cfg = model_cfg.TRUNK.BEIT
    for key in ("IMAGE_SIZE", "PATCH_SIZE", "NUM_LAYERS", "NUM_HEADS", "HIDDEN_DIM"):
        if int(cfg[key]) < 1:
            raise ValueError(f"{CONFIG}.{key} must be at least 1, got {cfg[key]!r}")
    if int(cfg.HIDDEN_DIM) % int(cfg.NUM_HEADS):
        raise ValueError(f"{CONFIG}.NUM_HEADS={cfg.NUM_HEADS} must divide HIDDEN_DIM="
                         f"{cfg.HIDDEN_DIM}")
    if int(cfg.IMAGE_SIZE) < int(cfg.PATCH_SIZE):
        raise ValueError(f"{CONFIG}.IMAGE_SIZE={cfg.IMAGE_SIZE} is smaller than PATCH_SIZE="
                         f"{cfg.PATCH_SIZE}")
    if int(int(cfg.HIDDEN_DIM) * float(cfg.MLP_RATIO)) < 1:
        raise ValueError(f"{CONFIG}.MLP_RATIO={cfg.MLP_RATIO} gives an empty MLP")
    for key in ("DROPOUT_RATE", "ATTENTION_DROPOUT_RATE", "DROP_PATH_RATE"):
        if not 0 <= _number(cfg, key) < 1:
            raise ValueError(f"{CONFIG}.{key}={cfg[key]!r} must be in [0, 1)")
    if _number(cfg, "QK_SCALE") < 0:
        raise ValueError(f"{CONFIG}.QK_SCALE={cfg.QK_SCALE!r} must be false or > 0")
    _number(cfg, "INIT_VALUES")
    checkpointing_splits(model_cfg)


def output_dims(num_layers: int, dim: int) -> Dict[str, int]:
    """Every output name of a trunk of ``num_layers`` blocks of width ``dim``, with its width."""
    dims = {f"blkCLS{i}": dim for i in range(num_layers)}
    dims.update(lastCLS=dim, lastPOOL=dim)
    dims.update({f"concatCLS{n}": n * dim for n in range(1, num_layers + 1)})
    return dims


def _blocks_read(key: str, num_layers: int) -> List[int]:
    """The (0-based) blocks whose output ``key`` reads."""
    if key in ("lastCLS", "lastPOOL"):
        return [num_layers - 1]
    if key.startswith("blkCLS"):
        return [int(key[len("blkCLS"):])]
    count = int(key[len("concatCLS"):])
    return list(range(num_layers - count, num_layers))


accept_number_or_false("config.MODEL.TRUNK.BEIT.INIT_VALUES", "config.MODEL.TRUNK.BEIT.QK_SCALE")

@register_model_trunk("beit")
class BEiTTrunk(StagedTrunk):
    """Outputs: lastCLS (default), blkCLS<i>, concatCLS<n>, lastPOOL; see the module docstring.

    One forward runs the blocks once, up to the last block an output reads, and applies the
    final norm only to the blocks the outputs read.
    """

    default_out_feat_key = "lastCLS"

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_beit_config(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        cfg = model_cfg.TRUNK.BEIT
        dim, depth, heads = int(cfg.HIDDEN_DIM), int(cfg.NUM_LAYERS), int(cfg.NUM_HEADS)
        drop = _number(cfg, "DROPOUT_RATE")
        scale = _number(cfg, "QK_SCALE") or (dim // heads) ** -0.5
        self.patch_embed = PatchEmbed(int(cfg.IMAGE_SIZE), int(cfg.PATCH_SIZE), dim)
        grid = self.patch_embed.grid
        num_tokens = grid[0] * grid[1] + 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = (nn.Parameter(torch.zeros(1, num_tokens, dim))
                          if cfg.USE_ABS_POS_EMB else None)
        self.pos_drop = nn.Dropout(drop)
        self.rel_pos_bias = (RelativePositionBias(grid, heads)
                             if cfg.USE_SHARED_REL_POS_BIAS else None)
        drop_paths = drop_path_rates(_number(cfg, "DROP_PATH_RATE"), depth)
        self.blocks = nn.ModuleList(
            Block(dim, heads, int(dim * float(cfg.MLP_RATIO)), bool(cfg.QKV_BIAS), scale, drop,
                  _number(cfg, "ATTENTION_DROPOUT_RATE"), drop_paths[i],
                  _number(cfg, "INIT_VALUES"), grid if cfg.USE_REL_POS_BIAS else None)
            for i in range(depth)
        )
        self.norm = nn.Identity() if cfg.USE_MEAN_POOLING else nn.LayerNorm(dim, eps=NORM_EPS)
        self.checkpoint_blocks = bool(checkpointing_splits(model_cfg))
        self.stage_dims = output_dims(depth, dim)
        self._init_weights()

    def _init_weights(self) -> None:
        """Truncated normal (std 0.02) linear weights, position embeddings and class token;
        zero biases; unit LayerNorms; each block's output projections divided by
        sqrt(2 * block number) (1-based)."""
        for parameter in (self.pos_embed, self.cls_token):
            if parameter is not None:
                nn.init.trunc_normal_(parameter, std=INIT_STD)
        init_linear_and_norms(self, INIT_STD)
        with torch.no_grad():
            for number, block in enumerate(self.blocks, start=1):
                block.attn.proj.weight.div_(math.sqrt(2.0 * number))
                block.mlp.fc2.weight.div_(math.sqrt(2.0 * number))

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the blocks."""
        return list(self.blocks)

    def stages(self):
        raise NotImplementedError("the BEiT outputs share one pass through the blocks: "
                                  "call forward(x, out_feat_keys)")

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, T, D]``: the class token and the patch embeddings, before the first block."""
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], dim=1)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return self.pos_drop(x)

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        """The outputs named in ``out_feat_keys`` (default: lastCLS), in that order."""
        keys = self.check_out_feat_keys(out_feat_keys)
        depth = len(self.blocks)
        wanted = sorted({i for key in keys for i in _blocks_read(key, depth)})
        x = self.tokens(x)
        shared_bias = self.rel_pos_bias() if self.rel_pos_bias is not None else None
        normed: Dict[int, torch.Tensor] = {}
        for index, block in enumerate(self.blocks[:wanted[-1] + 1]):
            if self.checkpoint_blocks and torch.is_grad_enabled():
                x = checkpoint(block, x, shared_bias, use_reentrant=False)
            else:
                x = block(x, shared_bias)
            if index in wanted:
                normed[index] = self.norm(x)
        outputs = []
        for key in keys:
            if key == "lastPOOL":
                outputs.append(normed[depth - 1][:, 1:].mean(dim=1))
                continue
            parts = [normed[i][:, 0] for i in _blocks_read(key, depth)]
            outputs.append(torch.cat(parts, dim=1) if len(parts) > 1 else parts[0])
        return outputs
