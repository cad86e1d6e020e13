"""The patch masks of I-JEPA and AIM, made per sample in the data pipeline (after ToTensor).

Like transforms/masking.py they give the views back as ``MaskedViews`` and draw from the global
generators, which the dataset seeds by (SEED_VALUE, epoch, sample index): a resumed run
replays the masks exactly.

- ``MultiBlockMasking`` (I-JEPA, Assran et al. 2023): per view a boolean [1 + num_targets, h, w]
  tensor; entry 0 is the context (True: the encoder sees the patch), entries 1.. are the target
  blocks (True: in the block). Each target block has a scale drawn in ``target_scale`` (share of
  the patches) and an aspect ratio (height / width) in ``target_aspect_ratio``; the context block
  a scale in ``context_scale`` and an aspect ratio in ``context_aspect_ratio``; both from one
  uniform draw, as I-JEPA's mask collator does. Unless ``allow_overlap``, the target patches are
  taken out of the context; a context position is drawn again (20 tries, then one target fewer
  is taken out, and so on) until more than ``min_keep`` patches are left. Difference from
  I-JEPA: its block sizes are drawn once per batch, here once per image (so that the masks
  depend on the sample alone); the ijepa_collator cuts every block and context to the smallest
  of the batch, as I-JEPA's collator cuts to the batch's smallest.
- ``RandomPrefixMasking`` (AIM, El-Nouby et al. 2024): per view a boolean [h, w] mask whose
  first ``K`` patches in raster order are False (the prefix, attended bidirectionally) and the
  others True (attended causally, and predicted); ``K`` uniform in 1 .. L - 1, as in the paper.
"""
import math
import random
from typing import Sequence, Tuple

import torch

from ssl_engine.data.registry import register_transform
from ssl_engine.data.transforms.masking import MaskedViews, _as_list, _grid


def _pair(value: Sequence[float], name: str) -> Tuple[float, float]:
    low, high = (float(v) for v in value)
    if not 0 < low <= high:
        raise ValueError(f"MultiBlockMasking: {name} must be [low, high] with 0 < low <= high, "
                         f"got {list(value)}")
    return low, high


def block_size(height: int, width: int, scale: Tuple[float, float],
               aspect: Tuple[float, float]) -> Tuple[int, int]:
    """(rows, columns) of a block: one uniform draw sets both its share of the patches and its
    aspect ratio; the block stays smaller than the grid."""
    draw = random.random()
    area = int(height * width * (scale[0] + draw * (scale[1] - scale[0])))
    ratio = aspect[0] + draw * (aspect[1] - aspect[0])
    rows = min(max(int(round(math.sqrt(area * ratio))), 1), max(height - 1, 1))
    cols = min(max(int(round(math.sqrt(area / ratio))), 1), max(width - 1, 1))
    return rows, cols


def place(height: int, width: int, size: Tuple[int, int]) -> torch.Tensor:
    """A [height, width] mask with the block of ``size`` at a uniform position."""
    rows, cols = size
    top, left = random.randint(0, height - rows), random.randint(0, width - cols)
    mask = torch.zeros(height, width, dtype=torch.bool)
    mask[top:top + rows, left:left + cols] = True
    return mask


@register_transform("MultiBlockMasking")
class MultiBlockMasking:
    """I-JEPA's context and target blocks (see the module docstring); its defaults are the
    paper's ImageNet settings."""

    takes_views = True

    def __init__(self, patch_size: int = 16, num_targets: int = 4,
                 target_scale: Sequence[float] = (0.15, 0.2),
                 target_aspect_ratio: Sequence[float] = (0.75, 1.5),
                 context_scale: Sequence[float] = (0.85, 1.0),
                 context_aspect_ratio: Sequence[float] = (1.0, 1.0), min_keep: int = 10,
                 allow_overlap: bool = False):
        if int(num_targets) < 1:
            raise ValueError(f"MultiBlockMasking: num_targets must be >= 1, got {num_targets}")
        self.patch_size, self.num_targets = int(patch_size), int(num_targets)
        self.target_scale = _pair(target_scale, "target_scale")
        self.target_aspect_ratio = _pair(target_aspect_ratio, "target_aspect_ratio")
        self.context_scale = _pair(context_scale, "context_scale")
        self.context_aspect_ratio = _pair(context_aspect_ratio, "context_aspect_ratio")
        self.min_keep, self.allow_overlap = int(min_keep), bool(allow_overlap)

    def masks(self, height: int, width: int) -> torch.Tensor:
        """[1 + num_targets, height, width]: the context, then the target blocks."""
        size = block_size(height, width, self.target_scale, self.target_aspect_ratio)
        targets = [place(height, width, size) for _ in range(self.num_targets)]
        size = block_size(height, width, self.context_scale, self.context_aspect_ratio)
        excluded = [] if self.allow_overlap else list(targets)
        while True:
            for _ in range(20):
                context = place(height, width, size)
                for target in excluded:
                    context &= ~target
                if int(context.sum()) > min(self.min_keep, height * width - 1) or not excluded:
                    return torch.stack([context] + targets)
            excluded.pop()  # no room: one target fewer taken out of the context

    def __call__(self, views) -> MaskedViews:
        views = _as_list(views)
        return MaskedViews(views, [self.masks(*_grid(view, self.patch_size, "MultiBlockMasking"))
                                   for view in views])

    def __repr__(self) -> str:
        return (f"MultiBlockMasking(patch_size={self.patch_size}, num_targets={self.num_targets}"
                f", target_scale={self.target_scale}, context_scale={self.context_scale})")


@register_transform("RandomPrefixMasking")
class RandomPrefixMasking:
    """AIM's prefix (see the module docstring)."""

    takes_views = True

    def __init__(self, patch_size: int = 16):
        self.patch_size = int(patch_size)

    def __call__(self, views) -> MaskedViews:
        views = _as_list(views)
        masks = []
        for view in views:
            height, width = _grid(view, self.patch_size, "RandomPrefixMasking")
            if height * width < 2:
                raise ValueError("RandomPrefixMasking needs at least 2 patches per view")
            prefix = random.randint(1, height * width - 1)
            masks.append((torch.arange(height * width) >= prefix).view(height, width))
        return MaskedViews(views, masks)

    def __repr__(self) -> str:
        return f"RandomPrefixMasking(patch_size={self.patch_size})"
