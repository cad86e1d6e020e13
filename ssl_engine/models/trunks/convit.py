"""ConViT trunk (MODEL.TRUNK.NAME convit): a Vision Transformer whose first blocks use gated
positional self-attention, configured as in VISSL by MODEL.TRUNK.VISION_TRANSFORMERS
(IMAGE_SIZE, PATCH_SIZE, NUM_LAYERS, NUM_HEADS, HIDDEN_DIM, MLP_DIM, DROPOUT_RATE,
ATTENTION_DROPOUT_RATE, DROP_PATH_RATE, QKV_BIAS, QK_SCALE, CLASSIFIER) together with
MODEL.TRUNK.CONVIT (N_GPSA_LAYERS, LOCALITY_STRENGTH, LOCALITY_DIM, USE_LOCAL_INIT,
CLASS_TOKEN_IN_LOCAL_LAYERS).

The network:

- a patch embedding (a ``PATCH_SIZE`` convolution of the same stride) plus learned position
  embeddings of the patches (bicubically resized to the patch grid of other input sizes),
  then dropout;
- ``NUM_LAYERS`` pre-norm blocks (LayerNorm eps 1e-5): attention, then an ``MLP_DIM`` wide MLP
  (GELU, dropout after both layers), stochastic depth rising linearly from 0 to
  ``DROP_PATH_RATE`` over the blocks;
- the first ``N_GPSA_LAYERS`` blocks use gated positional self-attention (GPSA) over the patch
  tokens; the class token is put before the patches after them, and the other blocks use
  plain multi-head self-attention;
- a final LayerNorm.

GPSA mixes, per head, content attention (softmax of scaled query-key products) and positional
attention with a learned gate: ``(1 - sigmoid(alpha)) * content + sigmoid(alpha) *
positional``, renormalised to sum to 1.  The positional attention of patch i to patch j is a
softmax over j of ``pos_proj(r_ij) / LOCALITY_DIM``, where r_ij repeats ``LOCALITY_DIM`` times
each of dx, dy and dx^2 + dy^2 (the column and row offsets of j from i): ``3 * LOCALITY_DIM``
inputs.  ``QKV_BIAS`` gives the query-key and value projections biases.

Initialisation: truncated normal (std 0.02) linear weights, position embeddings and class
token, zero biases.  With ``USE_LOCAL_INIT`` each GPSA block then starts as a convolution: its
value projection is the identity and head ``h1 + k * h2`` (k = floor(sqrt(NUM_HEADS))) attends
around the offset (h1 - c, h2 - c) from the centre c of a k x k kernel, sharply for a large
``LOCALITY_STRENGTH`` (0 or less: 1 / (block number), from 1).  VISSL's trunk re-initialises
every linear layer after that, undoing the local initialisation; here it is kept, as the ConViT
paper describes (this only changes the starting weights; checkpoints load the same).

Parameter names are those of VISSL's convit trunk, at the top level of the trunk:
``class_token``, ``pos_embedding``, ``patch_embed.proj``, ``blocks.<i>.{norm1, attn.{qk, v,
proj, pos_proj, alpha} (GPSA) or attn.{qkv, proj}, norm2, mlp.{linear_1, linear_2}}``,
``norm``.

Outputs (all [N, D]; VISSL's trunk returns one feature, chosen by ``CLASSIFIER``):

- ``lastCLS``: the class token after the final norm (the default with ``CLASSIFIER: token``);
- ``lastPOOL``: the mean of every token after the final norm, the class token included, as
  VISSL's ``CLASSIFIER: gap`` computes it (the default with ``gap``).

``CLASS_TOKEN_IN_LOCAL_LAYERS: true`` is refused: VISSL's GPSA cannot run with the class token
(its relative positions are those of a square grid of patches only).
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import StochasticDepth

from ssl_engine.models.activation_checkpointing import checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk, drop_path_rates
from ssl_engine.models.trunks.transformer_parts import (Attention, OnGrid, attend,
                                                         init_linear_and_norms, run_blocks)
from ssl_engine.utils.device import from_host
from ssl_engine.utils.key_rules import NEVER_READ, ignore_published_key

VIT = "config.MODEL.TRUNK.VISION_TRANSFORMERS"
CONVIT = "config.MODEL.TRUNK.CONVIT"
INIT_STD = 0.02


def relative_positions(grid: Tuple[int, int], locality_dim: int) -> torch.Tensor:
    """``[1, T, T, 3 L]`` (T = H*W patches, row-major): for patch i and patch j, ``L`` copies
    each of dx, dy (j's column and row minus i's) and dx^2 + dy^2."""
    height, width = grid
    rows = torch.arange(height).repeat_interleave(width).float()
    cols = torch.arange(width).repeat(height).float()
    dx = cols[None, :] - cols[:, None]
    dy = rows[None, :] - rows[:, None]
    parts = [dx, dy, dx ** 2 + dy ** 2]
    return torch.stack(parts, dim=-1).repeat_interleave(locality_dim, dim=-1).unsqueeze(0)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, drop: float):
        super().__init__()
        self.linear_1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.dropout_1 = nn.Dropout(drop)
        self.linear_2 = nn.Linear(hidden, dim)
        self.dropout_2 = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout_2(self.linear_2(self.dropout_1(self.act(self.linear_1(x)))))


class GPSA(nn.Module):
    """Gated positional self-attention over the patch tokens."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool, scale: float, attn_drop: float,
                 proj_drop: float, locality_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.scale = scale
        self.locality_dim = locality_dim
        self.qk = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.pos_proj = nn.Linear(3 * locality_dim, num_heads)
        self.proj_drop = nn.Dropout(proj_drop)
        self.alpha = nn.Parameter(torch.ones(1, num_heads, 1, 1))
        self.grid: Tuple[int, int] = (0, 0)  # set by the trunk for each input
        self._positions: Dict[Tuple[int, int], torch.Tensor] = {}

    def local_init(self, locality_strength: float) -> None:
        """Start as a convolution: identity values, head h1 + k*h2 looking at offset
        (h1 - c, h2 - c) of a k x k kernel centred on c."""
        dim = self.v.weight.shape[0]
        locality = self.locality_dim
        kernel = int(self.num_heads ** 0.5)
        centre = (kernel - 1) / 2 if kernel % 2 == 0 else kernel // 2
        with torch.no_grad():
            self.v.weight.copy_(torch.eye(dim))
            weight = self.pos_proj.weight
            for h1 in range(kernel):
                for h2 in range(kernel):
                    head = h1 + kernel * h2
                    weight[head, :locality] = 2 * (h2 - centre)
                    weight[head, locality:2 * locality] = 2 * (h1 - centre)
                    weight[head, 2 * locality:] = -1
            weight.mul_(locality_strength)

    def positions(self, device) -> torch.Tensor:
        key = self.grid
        if key not in self._positions or self._positions[key].device != device:
            self._positions[key] = from_host(relative_positions(key, self.locality_dim), device)
        return self._positions[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k = self.qk(x).reshape(batch, tokens, 2, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        v = self.v(x).reshape(batch, tokens, self.num_heads, -1).transpose(1, 2)
        positional = self.pos_proj(self.positions(x.device).to(x.dtype)).permute(0, 3, 1, 2)
        positional = (positional / self.locality_dim).softmax(dim=-1)  # [1, heads, T, T]
        gate = torch.sigmoid(self.alpha)
        if self.training and self.attn_drop.p > 0:
            # the dropout acts on the mixed weights: the weights matrix is needed whole
            content = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
            weights = (1.0 - gate) * content + gate * positional
            weights = self.attn_drop(weights / weights.sum(dim=-1, keepdim=True))
            out = weights @ v
        else:
            # the mix of two distributions sums to 1 already: the content part through the
            # fused attention, the positional one (the same for every image) on its own
            out = (1.0 - gate) * attend(q, k, v, None, self.scale, 0.0) + gate * (positional @ v)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, tokens, dim)))


class SelfAttention(Attention):
    """ConViT's plain self-attention (the blocks after the local ones)."""


class Block(nn.Module):
    def __init__(self, attention: nn.Module, dim: int, mlp_dim: int, drop: float,
                 drop_path: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = attention
        self.drop_path = StochasticDepth(drop_path, "row") if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_dim, drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


# ------------------------------------------------------------------ configuration
def _rate(cfg, section: str, key: str) -> float:
    value = float(cfg.get(key) or 0.0)
    if not 0 <= value < 1:
        raise ValueError(f"{section}.{key}={cfg[key]!r} must be in [0, 1)")
    return value


def _qk_scale(vit) -> float:
    value = vit.get("QK_SCALE")
    if value is None or value is False:
        return 0.0
    try:
        scale = float(value)
    except (TypeError, ValueError):
        scale = -1.0
    if scale <= 0:
        raise ValueError(f"{VIT}.QK_SCALE={value!r} must be false or a number > 0")
    return scale


def check_convit_config(model_cfg) -> None:
    """Refuse, naming the key, a setting the convit trunk cannot build."""
    vit, cfg = model_cfg.TRUNK.VISION_TRANSFORMERS, model_cfg.TRUNK.CONVIT
    for key in ("IMAGE_SIZE", "PATCH_SIZE", "NUM_LAYERS", "NUM_HEADS", "HIDDEN_DIM", "MLP_DIM"):
        if int(vit[key]) < 1:
            raise ValueError(f"{VIT}.{key} must be at least 1, got {vit[key]!r}")
    if int(vit.IMAGE_SIZE) % int(vit.PATCH_SIZE):
        raise ValueError(f"{VIT}.IMAGE_SIZE={vit.IMAGE_SIZE} must be a multiple of "
                         f"PATCH_SIZE={vit.PATCH_SIZE} (the convit trunk)")
    if int(vit.HIDDEN_DIM) % int(vit.NUM_HEADS):
        raise ValueError(f"{VIT}.NUM_HEADS={vit.NUM_HEADS} must divide HIDDEN_DIM="
                         f"{vit.HIDDEN_DIM}")
    if vit.get("CLASSIFIER", "token") not in ("token", "gap"):
        raise ValueError(f"{VIT}.CLASSIFIER={vit.CLASSIFIER!r} must be token or gap "
                         "(the convit trunk)")
    for key in ("DROPOUT_RATE", "ATTENTION_DROPOUT_RATE", "DROP_PATH_RATE"):
        _rate(vit, VIT, key)
    _qk_scale(vit)
    gpsa = int(cfg.N_GPSA_LAYERS)
    if not 0 <= gpsa < int(vit.NUM_LAYERS):
        raise ValueError(f"{CONVIT}.N_GPSA_LAYERS={gpsa} must be in [0, NUM_LAYERS="
                         f"{vit.NUM_LAYERS}): the class token joins before the first block "
                         "after them")
    if cfg.CLASS_TOKEN_IN_LOCAL_LAYERS:
        raise ValueError(f"{CONVIT}.CLASS_TOKEN_IN_LOCAL_LAYERS=true is not supported: VISSL's "
                         "gated positional attention has relative positions for the patches "
                         "only (its trunk fails with it too)")
    if int(cfg.LOCALITY_DIM) < 1:
        raise ValueError(f"{CONVIT}.LOCALITY_DIM must be at least 1, got {cfg.LOCALITY_DIM!r}")
    checkpointing_splits(model_cfg)


ignore_published_key("config.MODEL.TRUNK.VISION_TRANSFORMERS.CONVIT",
                     f"{NEVER_READ}: ConViT is the convit trunk, set by MODEL.TRUNK.CONVIT")
for _key in ("QKV_BIAS", "QK_SCALE"):
    ignore_published_key(f"config.MODEL.TRUNK.CONVIT.{_key}",
                         f"{NEVER_READ}: the convit trunk reads "
                         f"MODEL.TRUNK.VISION_TRANSFORMERS.{_key}")

@register_model_trunk("convit")
class ConViTTrunk(StagedTrunk):
    """Outputs: lastCLS, lastPOOL (the default follows CLASSIFIER); see the module docstring."""

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_convit_config(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        vit, cfg = model_cfg.TRUNK.VISION_TRANSFORMERS, model_cfg.TRUNK.CONVIT
        dim, heads, depth = int(vit.HIDDEN_DIM), int(vit.NUM_HEADS), int(vit.NUM_LAYERS)
        patch = int(vit.PATCH_SIZE)
        drop = _rate(vit, VIT, "DROPOUT_RATE")
        attn_drop = _rate(vit, VIT, "ATTENTION_DROPOUT_RATE")
        scale = _qk_scale(vit) or (dim // heads) ** -0.5
        qkv_bias = bool(vit.QKV_BIAS)
        self.n_gpsa_layers = int(cfg.N_GPSA_LAYERS)
        self.grid = (int(vit.IMAGE_SIZE) // patch, int(vit.IMAGE_SIZE) // patch)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, self.grid[0] * self.grid[1], dim))
        self.pos_drop = nn.Dropout(drop)
        rates = drop_path_rates(_rate(vit, VIT, "DROP_PATH_RATE"), depth)
        blocks = []
        for i in range(depth):
            if i < self.n_gpsa_layers:
                attention = GPSA(dim, heads, qkv_bias, scale, attn_drop, drop,
                                 int(cfg.LOCALITY_DIM))
            else:
                attention = SelfAttention(dim, heads, qkv_bias, scale, attn_drop, drop)
            blocks.append(Block(attention, dim, int(vit.MLP_DIM), drop, rates[i]))
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim)
        self.checkpoint_splits = checkpointing_splits(model_cfg)
        self.stage_dims = {"lastCLS": dim, "lastPOOL": dim}
        self.default_out_feat_key = "lastPOOL" if vit.get("CLASSIFIER") == "gap" else "lastCLS"
        self._init_weights(float(cfg.LOCALITY_STRENGTH) if cfg.USE_LOCAL_INIT else None)

    def _init_weights(self, locality_strength: Optional[float]) -> None:
        for parameter in (self.pos_embedding, self.class_token):
            nn.init.trunc_normal_(parameter, std=INIT_STD)
        init_linear_and_norms(self, INIT_STD)
        if locality_strength is None:
            return
        for number, block in enumerate(self.blocks[:self.n_gpsa_layers], start=1):
            block.attn.local_init(locality_strength if locality_strength > 0 else 1 / number)

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the blocks."""
        return list(self.blocks)

    def stages(self):
        raise NotImplementedError("the ConViT outputs share one pass through the blocks: "
                                  "call forward(x, out_feat_keys)")

    def _position_embedding(self, grid: Tuple[int, int]) -> torch.Tensor:
        if grid == self.grid:
            return self.pos_embedding
        dim = self.pos_embedding.shape[-1]
        table = self.pos_embedding.reshape(1, *self.grid, dim).permute(0, 3, 1, 2)
        table = F.interpolate(table, size=grid, mode="bicubic", align_corners=False)
        return table.permute(0, 2, 3, 1).reshape(1, -1, dim)

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        """The outputs named in ``out_feat_keys`` (default: as CLASSIFIER says), in order."""
        keys = self.check_out_feat_keys(out_feat_keys)
        x = self.patch_embed.proj(x)
        grid = (x.shape[2], x.shape[3])
        x = self.pos_drop(x.flatten(2).transpose(1, 2) + self._position_embedding(grid))
        gpsa = [OnGrid(block, block.attn, grid) for block in self.blocks[:self.n_gpsa_layers]]
        x = run_blocks(gpsa, x, self.checkpoint_splits)
        x = torch.cat([self.class_token.expand(len(x), -1, -1), x], dim=1)
        x = self.norm(run_blocks(self.blocks[self.n_gpsa_layers:], x, self.checkpoint_splits))
        found = {"lastCLS": x[:, 0], "lastPOOL": x.mean(dim=1)}
        return [found[key] for key in keys]
