"""Patch masks for masked image modelling, made in the data pipeline.

Both transforms take the list of views (tensors [C, H, W], after ToTensor) and give it back
as a ``MaskedViews`` list whose ``masks`` holds one boolean [H / patch_size, W / patch_size]
mask per view (True: the patch is masked).  The dataset puts them in the sample's "mask"; a
masking collator batches them.  They draw from the global generators, which the dataset seeds
by (SEED_VALUE, epoch, sample index): the masks of a sample are replayed exactly on resume.
"""
import math
import random
from typing import List, Sequence, Union

import torch

from ssl_engine.data.registry import register_transform


class MaskedViews(list):
    """Views with their patch masks (``masks[i]`` belongs to view ``i``)."""

    def __init__(self, views, masks):
        super().__init__(views)
        self.masks = list(masks)


def _grid(view: torch.Tensor, patch_size: int, name: str):
    if not isinstance(view, torch.Tensor) or view.ndim != 3:
        raise TypeError(f"{name} takes tensor views [C, H, W]: put it after ToTensor")
    height, width = view.shape[1] // patch_size, view.shape[2] // patch_size
    if height < 1 or width < 1:
        raise ValueError(f"{name}: a view of {tuple(view.shape[1:])} pixels is smaller than "
                         f"patch_size={patch_size}")
    return height, width


def _as_list(views) -> List[torch.Tensor]:
    return list(views) if isinstance(views, (list, tuple)) else [views]


def _listed(value: Union[float, Sequence[float]]) -> List[float]:
    return [float(v) for v in value] if isinstance(value, (list, tuple)) else [float(value)]


def block_mask(height: int, width: int, count: int) -> torch.Tensor:
    """About ``count`` patches masked as rectangles (BEiT's and iBOT's block-wise masking):
    rectangles of random area (at least (min side // 3)^2 patches) and aspect ratio in
    [0.3, 1/0.3] are added while they mask new patches without exceeding ``count``."""
    mask = torch.zeros(height, width, dtype=torch.bool)
    smallest = (min(height, width) // 3) ** 2
    while int(mask.sum()) < count:
        room = count - int(mask.sum())
        added = 0
        for _ in range(10):
            area = random.uniform(min(smallest, room), room)
            aspect = math.exp(random.uniform(math.log(0.3), math.log(1 / 0.3)))
            h = int(round(math.sqrt(area * aspect)))
            w = int(round(math.sqrt(area / aspect)))
            if not (0 < h < height and 0 < w < width):
                continue
            top, left = random.randint(0, height - h), random.randint(0, width - w)
            new = h * w - int(mask[top:top + h, left:left + w].sum())
            if 0 < new <= room:
                mask[top:top + h, left:left + w] = True
                added = new
                break
        if not added:
            break
    return mask


def random_mask(height: int, width: int, count: int) -> torch.Tensor:
    """Exactly ``count`` patches masked, chosen uniformly."""
    order = torch.randperm(height * width)
    mask = torch.zeros(height * width, dtype=torch.bool)
    mask[order[:count]] = True
    return mask.view(height, width)


@register_transform("MaskedImageModeling")
class MaskedImageModeling:
    """iBOT's masks (VISSL's transform): per view, a prediction ratio is drawn, one per entry
    of ``pred_ratio_mean``, uniformly in [mean - var, mean + var] (``pred_ratio_var``), and
    one of them is picked at random; that fraction of the patches is masked, block-wise
    (``pred_shape: block``, iBOT's default) or patch by patch (``rand``).  With
    ``pred_ratio_mean: [0.0, 0.3]`` and ``pred_ratio_var: [0.0, 0.2]`` (iBOT's setting) half the
    views are left whole and the others lose 10 to 50% of their patches."""

    takes_views = True

    def __init__(self, pred_ratio_mean: Union[float, Sequence[float]] = 0.3,
                 pred_ratio_var: Union[float, Sequence[float]] = 0.0, patch_size: int = 16,
                 pred_shape: str = "block"):
        self.means, self.vars = _listed(pred_ratio_mean), _listed(pred_ratio_var)
        if len(self.means) != len(self.vars):
            raise ValueError(f"MaskedImageModeling: pred_ratio_mean {self.means} and "
                             f"pred_ratio_var {self.vars} need as many entries")
        for mean, var in zip(self.means, self.vars):
            if not 0 <= mean - var <= mean + var <= 1:
                raise ValueError(f"MaskedImageModeling: the ratio {mean} +- {var} leaves [0, 1]")
        if pred_shape not in ("block", "rand"):
            raise ValueError(f"MaskedImageModeling: pred_shape is block or rand, got "
                             f"{pred_shape!r}")
        self.patch_size, self.pred_shape = int(patch_size), pred_shape

    def ratio(self) -> float:
        ratios = [random.uniform(m - v, m + v) if v > 0 else m
                  for m, v in zip(self.means, self.vars)]
        return random.choice(ratios)

    def __call__(self, views) -> MaskedViews:
        views = _as_list(views)
        masks = []
        for view in views:
            height, width = _grid(view, self.patch_size, "MaskedImageModeling")
            count = int(self.ratio() * height * width)
            make = block_mask if self.pred_shape == "block" else random_mask
            masks.append(make(height, width, count))
        return MaskedViews(views, masks)

    def __repr__(self) -> str:
        return (f"MaskedImageModeling(pred_ratio_mean={self.means}, pred_ratio_var={self.vars}, "
                f"patch_size={self.patch_size}, pred_shape={self.pred_shape!r})")


@register_transform("RandomPatchMasking")
class RandomPatchMasking:
    """MAE's masks: in every view, ``int(L * mask_ratio)`` of its ``L`` patches, chosen
    uniformly (so every view of one size masks as many, and the encoder can drop them)."""

    takes_views = True

    def __init__(self, mask_ratio: float = 0.75, patch_size: int = 16):
        if not 0 <= mask_ratio < 1:
            raise ValueError(f"RandomPatchMasking: mask_ratio must be in [0, 1), got {mask_ratio}")
        self.mask_ratio, self.patch_size = float(mask_ratio), int(patch_size)

    def __call__(self, views) -> MaskedViews:
        views = _as_list(views)
        masks = []
        for view in views:
            height, width = _grid(view, self.patch_size, "RandomPatchMasking")
            masks.append(random_mask(height, width, int(height * width * self.mask_ratio)))
        return MaskedViews(views, masks)

    def __repr__(self) -> str:
        return f"RandomPatchMasking(mask_ratio={self.mask_ratio}, patch_size={self.patch_size})"
