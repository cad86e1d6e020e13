"""Layer-wise learning-rate decay for fine-tuning transformers (BEiT, Bao et al. 2021; MAE's
fine-tuning): OPTIMIZER.param_group_constructor=lr_decay with
OPTIMIZER.layer_wise_lr_decay.decay.

With ``depth`` transformer blocks (parameters named ``...blocks.<i>....``, i = 0 .. depth-1)
each parameter's lr is the schedule's times

- ``decay ** (depth + 1)``: the embeddings, before the first block (names containing
  ``patch_embed``, ``pos_embed``, ``cls_token``, ``mask_token``, ``reg_token`` or ``dist_token``);
- ``decay ** (depth - i)``: block ``i``;
- 1: everything after the blocks (the final norm, the heads, a relative-position bias shared
  by the blocks).

So the last block learns at ``decay`` times the head's rate, and each block below it at
``decay`` times the one above.
"""
import re
from typing import Dict, Sequence

EMBEDDING_PARTS = ("patch_embed", "pos_embed", "cls_token", "mask_token", "reg_token",
                   "dist_token")
BLOCK = re.compile(r"(?:^|\.)blocks\.(\d+)\.")
STAGED_BLOCK = re.compile(r"(?:^|\.)layers\.\d+\.blocks\.")  # Swin's stages
KEY = "config.OPTIMIZER.layer_wise_lr_decay.decay"


def layer_lr_scales(names: Sequence[str], decay: float) -> Dict[str, float]:
    """``{parameter name: lr scale}`` for the trainable parameters ``names`` (see the module
    docstring); ValueError when no name is that of a transformer block."""
    if not 0.0 < float(decay) <= 1.0:
        raise ValueError(f"{KEY} must be in (0, 1], got {decay}")
    blocks = {name: int(match.group(1)) for name in names if (match := BLOCK.search(name))}
    if not blocks:
        raise ValueError("config.OPTIMIZER.param_group_constructor=lr_decay needs a transformer "
                         "trunk: no trainable parameter is named '...blocks.<index>....' "
                         f"(e.g. {list(names)[:3]})")
    staged = [name for name in blocks if STAGED_BLOCK.search(name)]
    if staged:
        raise ValueError("config.OPTIMIZER.param_group_constructor=lr_decay numbers the blocks "
                         "of one flat list (ViT, BEiT, XCiT); this trunk has blocks inside "
                         f"stages (e.g. {staged[0]})")
    depth = max(blocks.values()) + 1
    scales = {}
    for name in names:
        if name in blocks:
            layer = blocks[name] + 1
        elif any(part in name for part in EMBEDDING_PARTS):
            layer = 0
        else:
            layer = depth + 1
        scales[name] = float(decay) ** (depth + 1 - layer)
    return scales
