"""Pieces the transformer trunks share (BEiT, XCiT, Swin, ConViT): the MLP of a block, under
the parameter names VISSL's trunks give it, running a list of blocks (checkpointed or not), the
usual initialisation of linear and norm layers, and the reading of number settings."""
from typing import Sequence

import torch
from torch import nn

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
