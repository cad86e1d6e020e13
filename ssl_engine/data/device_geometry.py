"""Device ops that move or hide pixels (data/device_ops.py says what an op is): torchvision's
RandomResizedCrop and RandomHorizontalFlip (DATA.<split>.DEVICE_CROPS), ImgPilToMultiCrop's
views (MultiCropOp) and RandomErasing."""
from typing import List, Optional, Sequence, Tuple

import torch
import torchvision.transforms as T
from torchvision.ops import roi_align
from torchvision.transforms import InterpolationMode

from ssl_engine.data.device_rows import ChanceOp, on_rows, rand_below


def boxes_in_tries(draws, height: int, width: int, scale, ratio, fits, tall: bool,
                   tries: int = 10):
    """torchvision's search for a random box (RandomResizedCrop, RandomErasing) in an image of
    ``height`` x ``width``, for every row at once: up to ``tries`` boxes of an area uniform in
    ``scale`` of the image's and an aspect log-uniform in ``ratio``; the first for which
    ``fits(h, w)`` holds is placed uniformly. ``tall``: the aspect is height / width
    (RandomErasing), else width / height.
    -> (found, top, left, h, w): [rows] float64 each, all 0 in a row where none fits."""
    areas = (height * width) * draws.uniform(tries, *scale)
    log_ratio = torch.log(torch.tensor(ratio, dtype=torch.float64))
    aspects = torch.exp(draws.uniform(tries, float(log_ratio[0]), float(log_ratio[1])))
    long_side = torch.round(torch.sqrt(areas * aspects))
    short_side = torch.round(torch.sqrt(areas / aspects))
    h, w = (long_side, short_side) if tall else (short_side, long_side)
    ok = fits(h, w)
    found = ok.any(dim=1)
    first = torch.argmax(ok.int(), dim=1, keepdim=True)  # the first try that fits
    h = torch.where(found, h.gather(1, first)[:, 0], 0.0)
    w = torch.where(found, w.gather(1, first)[:, 0], 0.0)
    top = draws.integers(torch.clamp(height - h + 1, min=1))
    left = draws.integers(torch.clamp(width - w + 1, min=1))
    zero = torch.zeros_like(top)
    return (found.double(), torch.where(found, top, zero), torch.where(found, left, zero), h, w)


class ErasingOp:
    """torchvision's RandomErasing with a constant value: with probability ``p``, a rectangle
    of area ``scale`` and aspect ``ratio`` (``RandomErasing.get_params``) set to ``value``.
    Params: applied, top, left, height, width."""

    size = 5

    def __init__(self, p: float = 0.5, scale=(0.02, 0.33), ratio=(0.3, 3.3), value=0.0):
        if not isinstance(value, (int, float)):
            raise ValueError(f"on the device RandomErasing takes one number as value, got {value}")
        self.p, self.scale, self.ratio, self.value = float(p), tuple(scale), tuple(ratio), value

    def draw(self, view) -> List[float]:
        if not rand_below(self.p):
            return [0.0, 0, 0, 0, 0]
        top, left, height, width, _ = T.RandomErasing.get_params(
            view, self.scale, self.ratio, [float(self.value)])
        if (height, width) == tuple(view.shape[-2:]):  # no box found in 10 tries: unchanged
            return [0.0, 0, 0, 0, 0]
        return [1.0, top, left, height, width]

    def draw_batch(self, draws, shape) -> torch.Tensor:
        applied = draws.below(self.p)
        height, width = shape[-2:]
        found, top, left, h, w = boxes_in_tries(
            draws, height, width, self.scale, self.ratio,
            lambda h, w: (h < height) & (w < width), tall=True)
        applied = applied * found
        box = torch.stack([top, left, h, w], dim=1) * applied[:, None]
        return torch.cat([applied[:, None], box], dim=1)

    def plan(self, params: torch.Tensor) -> list:
        return []

    def apply(self, images: torch.Tensor, params: torch.Tensor, plan=None) -> torch.Tensor:
        box = params.to(images.device, non_blocking=True)[:, :, None, None]
        ys = torch.arange(images.shape[-2], device=images.device)[None, :, None]
        xs = torch.arange(images.shape[-1], device=images.device)[None, None, :]
        inside = (box[:, 0] > 0) & (ys >= box[:, 1]) & (ys < box[:, 1] + box[:, 3]) \
            & (xs >= box[:, 2]) & (xs < box[:, 2] + box[:, 4])
        return images.masked_fill(inside[:, None], float(self.value))

    def __repr__(self) -> str:
        return f"ErasingOp(p={self.p}, scale={self.scale}, ratio={self.ratio})"


class ResizedCropOp:
    """torchvision's RandomResizedCrop (``get_params``: a box of ``scale`` of the area and
    ``ratio`` of aspect) resized to ``size`` with ``roi_align``: each output pixel averages
    ceil(box/size) x ceil(box/size) bilinear samples of its bin, so an enlarged box is
    torchvision's bilinear resize (one sample, at the bin's centre) and a shrunk one is
    averaged as its antialiasing does. Every view of a batch must have one size (the collator
    checks). Params: top, left, height, width."""

    size = 4

    def __init__(self, crop: T.RandomResizedCrop):
        if crop.interpolation != InterpolationMode.BILINEAR:
            raise ValueError(f"on the device RandomResizedCrop resizes bilinearly, not with "
                             f"{crop.interpolation.value}")
        self.scale, self.ratio, self.out = tuple(crop.scale), tuple(crop.ratio), tuple(crop.size)

    def draw(self, view) -> List[float]:
        return [float(v) for v in T.RandomResizedCrop.get_params(view, self.scale, self.ratio)]

    def draw_batch(self, draws, shape) -> torch.Tensor:
        height, width = shape[-2:]
        found, top, left, h, w = boxes_in_tries(
            draws, height, width, self.scale, self.ratio,
            lambda h, w: (w > 0) & (w <= width) & (h > 0) & (h <= height), tall=False)
        # torchvision's fallback: the central crop of the largest box of a ratio in range
        in_ratio = width / height
        if in_ratio < min(self.ratio):
            fh, fw = round(width / min(self.ratio)), width
        elif in_ratio > max(self.ratio):
            fh, fw = height, round(height * max(self.ratio))
        else:
            fh, fw = height, width
        fallback = torch.tensor([(height - fh) // 2, (width - fw) // 2, fh, fw],
                                dtype=torch.float64)
        box = torch.stack([top, left, h, w], dim=1)
        return torch.where(found[:, None] > 0, box, fallback)

    def out_shape(self, shape) -> tuple:
        """The shape of a view of ``shape`` ([C, H, W]) once cropped."""
        return (shape[0], *self.out)

    def plan(self, params: torch.Tensor, images: Optional[int] = None) -> list:
        """roi_align's boxes: (image, x1, y1, x2, y2) per row; row r reads image r, or with
        ``images`` (a multi-crop's rows, view-major over that many images) image r % images."""
        top, left, height, width = params.unbind(1)
        rows = torch.arange(len(params), dtype=params.dtype)
        if images is not None:
            rows = rows.remainder(images)
        return [torch.stack([rows, left, top, left + width, top + height], dim=1)]

    def apply(self, images: torch.Tensor, params: torch.Tensor, plan=None) -> torch.Tensor:
        boxes = (self.plan(params) if plan is None else plan)[0]
        return roi_align(images, boxes.to(images.device, images.dtype, non_blocking=True),
                         self.out, spatial_scale=1.0, sampling_ratio=0, aligned=True)

    def __repr__(self) -> str:
        return f"ResizedCropOp(size={self.out}, scale={self.scale}, ratio={self.ratio})"


class MultiCropOp:
    """ImgPilToMultiCrop on the device (DATA.<split>.DEVICE_CROPS): one image made
    ``views`` views, those of group g cropped by ``crops[g]`` (a ResizedCropOp: its own output
    size and scale range), ``counts[g]`` views a group, groups in the transform's order. It
    is not applied by itself: DeviceAugmentation runs each group as a chain of its own, the
    group's crop followed by the ops after the multi-crop (data/device_augmentation.py).
    Params: as ResizedCropOp's (top, left, height, width), drawn by the view's group."""

    size = ResizedCropOp.size

    def __init__(self, groups: Sequence[Tuple[int, T.RandomResizedCrop]]):
        self.counts = [int(count) for count, _ in groups]
        self.crops = [ResizedCropOp(crop) for _, crop in groups]
        self.views = sum(self.counts)

    def __repr__(self) -> str:
        groups = ", ".join(f"{count} x {crop!r}" for count, crop in zip(self.counts, self.crops))
        return f"MultiCropOp({groups})"


class FlipOp(ChanceOp):
    """torchvision's RandomHorizontalFlip(p). Params: applied."""

    def __init__(self, p: float = 0.5):
        super().__init__(p)

    def apply(self, images: torch.Tensor, params: torch.Tensor, plan=None) -> torch.Tensor:
        positions = self.plan(params)[0] if plan is None else plan[0]
        return on_rows(images, positions, lambda rows, at: rows.flip(-1))

    def __repr__(self) -> str:
        return f"FlipOp(p={self.p})"
