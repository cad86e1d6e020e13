"""Pieces the transformer trunks share (ViT, BEiT, XCiT, Swin, ConViT, MAE's decoder): the
attention of a block and the MLP, under the parameter names VISSL's and timm's trunks give them,
running a list of blocks (checkpointed or not), the usual initialisation of linear and norm
layers, and the reading of number settings."""
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
           scale: Optional[float], dropout: float) -> torch.Tensor:
    """``softmax(q k^T * scale + mask) v`` with dropout on the weights: torch's fused
    ``scaled_dot_product_attention`` (flash or memory-efficient kernels where the device and
    shapes allow; the weights matrix is never stored), for every trunk's attention. ``scale``
    None: 1/sqrt(head width); ``mask`` is added to the scores (a bias, or -inf / large negative
    values to mask), in the dtype of ``q``."""
    if mask is not None:
        mask = mask.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout,
                                          scale=scale)


class Attention(nn.Module):
    """Multi-head self-attention on ``[N, T, D]`` tokens: ``qkv`` (one linear layer for the
    queries, keys and values), ``attend``, ``proj`` and its dropout. The names are those of
    timm's and VISSL's trunks, so their checkpoints load. A trunk with more (a relative
    position bias, separate query and value biases) subclasses it and overrides
    ``project_qkv`` or ``scores_bias``."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = False,
                 scale: Optional[float] = None, attn_drop: float = 0.0, proj_drop: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.scale = scale  # None: 1/sqrt(head width)
        self.attn_drop_rate = float(attn_drop)
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def project_qkv(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x)

    def heads(self, x: torch.Tensor):
        """q, k, v as ``[N, heads, T, head width]``."""
        batch, tokens, _ = x.shape
        qkv = self.project_qkv(x).reshape(batch, tokens, 3, self.num_heads, -1)
        return qkv.permute(2, 0, 3, 1, 4).unbind(0)

    def scores_bias(self, tokens: int) -> Optional[torch.Tensor]:
        """What is added to the scores ([heads, T, T] or broadcastable), or None."""
        return None

    @property
    def dropout(self) -> float:
        return self.attn_drop_rate if self.training else 0.0

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """``[N, heads, T, head width]`` -> ``proj`` of ``[N, T, D]``, with its dropout."""
        batch, _, tokens, _ = out.shape
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, tokens, -1)))

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None,
                is_causal: bool = False) -> torch.Tensor:
        """``attn_mask`` is added to the scores (timm's blocks pass it, None by default);
        causal attention is not used by these trunks."""
        if is_causal:
            raise ValueError("the trunks' attention is not causal")
        q, k, v = self.heads(x)
        bias = self.scores_bias(x.shape[1])
        if attn_mask is not None:
            bias = attn_mask if bias is None else bias + attn_mask
        return self.merge(attend(q, k, v, bias, self.scale, self.dropout))

    @classmethod
    def like_timm(cls, timm_attention: nn.Module) -> "Attention":
        """This module in place of a timm ``Attention`` (ViT blocks, MAE's decoder), holding its
        ``qkv`` and ``proj`` layers (the same parameters and names); timm's options this module
        does not have (normalised queries and keys, a gate, another scale) are refused."""
        for name in ("q_norm", "k_norm", "norm"):
            if not isinstance(getattr(timm_attention, name, nn.Identity()), nn.Identity):
                raise ValueError(f"timm attention with {name} is not supported")
        if getattr(timm_attention, "gate", None) is not None:
            raise ValueError("timm's gated attention is not supported")
        head_dim = timm_attention.qkv.out_features // 3 // timm_attention.num_heads
        if abs(timm_attention.scale - head_dim ** -0.5) > 1e-12:
            raise ValueError("timm attention with a scale other than 1/sqrt(head width)")
        # built around timm's layers without making new ones: no random numbers are drawn, so
        # a seed gives the same weights as before the replacement
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module.num_heads, module.scale = timm_attention.num_heads, None
        module.attn_drop_rate = float(timm_attention.attn_drop.p)
        module.qkv, module.proj = timm_attention.qkv, timm_attention.proj
        module.proj_drop = timm_attention.proj_drop
        return module


def use_shared_attention(blocks: Sequence[nn.Module]) -> None:
    """Every timm block of ``blocks`` attends through ``Attention`` (its parameters kept)."""
    for block in blocks:
        block.attn = Attention.like_timm(block.attn)

from ssl_engine.models.activation_checkpointing import checkpointed_segments


class Mlp(nn.Module):
    """fc1 -> GELU [-> dropout] -> fc2 -> dropout; ``drop_hidden`` puts the dropout after the
    activation too (XCiT, Swin; BEiT has it only after fc2)."""

    def __init__(self, dim: int, hidden: int, drop: float, drop_hidden: bool = True):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)
        self.drop_hidden = drop_hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.fc1(x))
        if self.drop_hidden:
            x = self.drop(x)
        return self.drop(self.fc2(x))



class OnGrid(nn.Module):
    """``block`` called with ``holder.grid`` set to ``grid`` first. The token grid of the input
    travels with each call (not as the holder's state between calls), so that a checkpointed
    block recomputed in the backward pass uses its own input's grid even when the trunk has
    since run on another resolution (multi-crop: global, then local crops)."""

    def __init__(self, block: nn.Module, holder: nn.Module, grid):
        super().__init__()
        self.block = block
        self._holder = [holder]  # not a submodule: the block holds it
        self.grid = tuple(grid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._holder[0].grid = self.grid
        return self.block(x)


def run_blocks(blocks: Sequence[nn.Module], x: torch.Tensor, splits: int) -> torch.Tensor:
    """``blocks`` applied to ``x`` in order: as ``splits`` checkpointed segments while gradients
    are recorded (``splits`` > 0), else one after another. ConViT's and XCiT's forward."""
    if not blocks:
        return x
    if splits and torch.is_grad_enabled():
        return checkpointed_segments(list(blocks), splits)(x)
    for block in blocks:
        x = block(x)
    return x

def config_number(section: str, cfg, key: str, allow_false: bool = False) -> float:
    """``cfg[key]`` as a float (a number written as a string, e.g. YAML 1.1's "1e-5", too);
    false or null read as 0 when ``allow_false``; anything else is refused naming
    ``section.key``."""
    value = cfg.get(key)
    if allow_false and (value is None or value is False):
        return 0.0
    try:
        if isinstance(value, bool):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{section}.{key}={value!r} must be a number"
                         + (" or false" if allow_false else "")) from None


def init_linear_and_norms(module: nn.Module, std: float) -> None:
    """Every Linear of ``module``: weights from a normal of ``std`` truncated at 2 std, zero
    biases; every LayerNorm: unit weight, zero bias (in module order)."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.trunc_normal_(layer.weight, std=std)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.LayerNorm):
            nn.init.ones_(layer.weight)
            nn.init.zeros_(layer.bias)
