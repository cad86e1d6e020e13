"""Photometric augmentations (and, for DATA.<split>.DEVICE_CROPS, random crops and flips) split
in two halves for DATA.<split>.DEVICE_AUGMENTATION: a loader worker *draws* each view's random
parameters (a few floats, from the per-sample seeded generators, so the draws are those of
sample i in epoch e whatever the worker or batch), and
the training process *applies* them to a whole batch at once on its device (CUDA or CPU) with
``kornia``'s batched functions, which take one factor per image.

Each op has ``size`` (floats per view), ``draw(view) -> list`` (``view``: the uint8 [C, H, W]
crop), ``draw_batch(draws, shape) -> [rows, size]`` (every row's parameters at once from
counter-based draws, data/batch_draws.py, for DATA.<split>.BATCHED_READS) and
``apply(images, params) -> images`` (``images``: float [N, C, H, W] in the
transform's value range, on the device; ``params``: the [N, size] float CPU tensor of draws).
``plan(params)`` picks the rows each step of ``apply`` changes, as CPU index tensors: the
loader's collator calls it (in the worker), so that ``apply(images, params, plan)`` in the
training step reads nothing back and sizes nothing by the data (no host waits on a GPU).
The distributions are torchvision's (or the engine transform's that the op stands for); the
formulas are torchvision's tensor formulas (tests/test_device_augmentation.py compares both).
"""
import math
from typing import List

import torch
import torchvision.transforms as T

from ssl_engine.data.device_geometry import ErasingOp, FlipOp, MultiCropOp, ResizedCropOp
from ssl_engine.data.device_rows import (AppliedOp, ChanceOp, kornia, on_rows, per_row,
                                        rand_below)
from ssl_engine.data.transforms.color_distortion import (
    ImgPilColorDistortion,
    ImgPilRandomColorJitter,
    simclr_jitter,
)
from ssl_engine.data.transforms.gaussian_blur import ImgPilGaussianBlur
from ssl_engine.data.transforms.multicrop import ImgPilToMultiCrop
from ssl_engine.data.transforms.solarize import ImgPilRandomSolarize


class ColorJitterOp:
    """torchvision's ColorJitter with probability ``p``: brightness, contrast, saturation and
    hue factors and their order drawn per view (``ColorJitter.get_params``); a component of
    zero strength is skipped, as in torchvision. Params: applied, the order (4), the factors
    (4; a skipped component's is neutral)."""

    size = 9
    NEUTRAL = (1.0, 1.0, 1.0, 0.0)

    def __init__(self, jitter: T.ColorJitter, p: float = 1.0):
        self.jitter, self.p = jitter, float(p)
        self.ranges = (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)

    def draw(self, view) -> List[float]:
        applied = rand_below(self.p) if self.p < 1 else 1.0
        if not applied:
            return [0.0, 0, 1, 2, 3, *self.NEUTRAL]
        order, *factors = T.ColorJitter.get_params(*self.ranges)
        factors = [n if f is None else f for f, n in zip(factors, self.NEUTRAL)]
        return [1.0, *order.tolist(), *factors]

    def draw_batch(self, draws, shape) -> torch.Tensor:
        applied = draws.below(self.p) if self.p < 1 else torch.ones(len(draws), dtype=torch.float64)
        order = draws.permutations(4)
        factors = torch.stack([draws.uniform(1, *r)[:, 0] if r is not None
                               else torch.full((len(draws),), n, dtype=torch.float64)
                               for r, n in zip(self.ranges, self.NEUTRAL)], dim=1)
        off = applied == 0
        order[off] = torch.arange(4, dtype=torch.float64)
        factors[off] = torch.tensor(self.NEUTRAL, dtype=torch.float64)
        return torch.cat([applied[:, None], order, factors], dim=1)

    @staticmethod
    def adjust(which: int, images: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
        if which == 0:  # torchvision: blend with black = scale, clamped
            return kornia().enhance.adjust_brightness_accumulative(images, factors)
        if which == 1:  # blend with the mean of the grey image
            return kornia().enhance.adjust_contrast_with_mean_subtraction(images, factors)
        if which == 2:  # blend with the grey image
            return kornia().enhance.adjust_saturation_with_gray_subtraction(images, factors)
        # a turn of the HSV hue, in radians
        return kornia().enhance.adjust_hue(images, factors * (2 * math.pi))

    def plan(self, params: torch.Tensor) -> list:
        """For each position in the order, then each component: the rows it changes there."""
        applied, order = params[:, 0] > 0, params[:, 1:5].long()
        return [torch.nonzero(applied & (order[:, position] == which)).flatten()
                if self.ranges[which] is not None else torch.zeros(0, dtype=torch.long)
                for position in range(4) for which in range(4)]

    def apply(self, images: torch.Tensor, params: torch.Tensor, plan=None) -> torch.Tensor:
        factors = params[:, 5:9]
        for step, positions in enumerate(self.plan(params) if plan is None else plan):
            images = on_rows(images, positions, lambda rows, at, w=step % 4: self.adjust(
                w, rows, per_row(factors[at, w], rows)))
        return images

    def __repr__(self) -> str:
        return f"ColorJitterOp({self.jitter!r}, p={self.p})"


class GrayscaleOp(ChanceOp):
    """torchvision's RandomGrayscale(p) for 3-channel images (ITU-R 601 luma in every
    channel). Params: applied."""

    def __init__(self, p: float = 0.1):
        super().__init__(p)

    def apply(self, images: torch.Tensor, params: torch.Tensor, plan=None) -> torch.Tensor:
        positions = self.plan(params)[0] if plan is None else plan[0]
        if images.shape[1] != 3:
            return images
        return on_rows(images, positions, lambda rows, at: kornia().color
                       .rgb_to_grayscale(rows).expand_as(rows))

    def __repr__(self) -> str:
        return f"GrayscaleOp(p={self.p})"


class BlurOp(AppliedOp):
    """A Gaussian blur of odd ``kernel`` pixels with reflected borders and sigma uniform in
    [sigma_min, sigma_max], with probability ``p``: torchvision's GaussianBlur (p=1), or the
    engine's ImgPilGaussianBlur, whose radius is the standard deviation of the Gaussian that
    PIL's filter approximates (here computed exactly, kernel 2*ceil(3*radius_max)+1).
    Params: applied, sigma."""

    size = 2

    def __init__(self, kernel: int, sigma_min: float, sigma_max: float, p: float = 1.0):
        if kernel % 2 == 0 or kernel < 1:
            raise ValueError(f"the blur's kernel size must be odd and positive, got {kernel}")
        self.kernel, self.sigma_min, self.sigma_max, self.p = kernel, sigma_min, sigma_max, p

    def draw(self, view) -> List[float]:
        if self.p < 1 and not rand_below(self.p):
            return [0.0, 0.0]
        return [1.0, T.GaussianBlur.get_params(self.sigma_min, self.sigma_max)]  # uniform

    def draw_batch(self, draws, shape) -> torch.Tensor:
        applied = draws.below(self.p) if self.p < 1 else torch.ones(len(draws), dtype=torch.float64)
        sigma = draws.uniform(1, self.sigma_min, self.sigma_max)[:, 0]
        return torch.stack([applied, sigma * applied], dim=1)

    def apply(self, images: torch.Tensor, params: torch.Tensor, plan=None) -> torch.Tensor:
        positions = self.plan(params)[0] if plan is None else plan[0]
        # reflected borders need a half-kernel under the image's side (torchvision refuses it)
        size = min(self.kernel, 2 * (min(images.shape[-2:]) - 1) + 1)
        return on_rows(images, positions, lambda rows, at: self.blur(
            rows, size, per_row(params[at, 1], rows)[:, None]))

    @staticmethod
    def blur(rows: torch.Tensor, size: int, sigmas: torch.Tensor) -> torch.Tensor:
        """Each row blurred with its own sigma ([n, 1]): one 1-d kernel per row, applied along
        both axes (kornia's gaussian_blur2d, minus its check that the sigmas are positive,
        which reads them back from the device; they are drawn positive)."""
        kernel = kornia().filters.get_gaussian_kernel1d(size, sigmas)
        return kornia().filters.filter2d_separable(rows, kernel, kernel, "reflect")

    def __repr__(self) -> str:
        return f"BlurOp(kernel={self.kernel}, sigma=[{self.sigma_min}, {self.sigma_max}], " \
               f"p={self.p})"


class SolarizeOp(AppliedOp):
    """With probability ``p``, every value >= a threshold inverted (1 - x), the threshold
    fixed or, for None, drawn uniformly from 0..256 levels (the engine's
    ImgPilRandomSolarize; 256 changes nothing). Params: applied, threshold in [0, 1] units."""

    size = 2

    def __init__(self, p: float, threshold=None):
        self.p, self.threshold = float(p), threshold

    def draw(self, view) -> List[float]:
        if not rand_below(self.p):
            return [0.0, 2.0]
        level = torch.randint(0, 257, ()).item() if self.threshold is None else self.threshold
        return [1.0, level / 255.0]

    def draw_batch(self, draws, shape) -> torch.Tensor:
        applied = draws.below(self.p)
        if self.threshold is None:
            level = draws.integers(torch.tensor(257.0)) / 255.0
        else:
            level = torch.full((len(draws),), self.threshold / 255.0, dtype=torch.float64)
        return torch.stack([applied, torch.where(applied > 0, level, 2.0)], dim=1)

    def apply(self, images: torch.Tensor, params: torch.Tensor, plan=None) -> torch.Tensor:
        positions = self.plan(params)[0] if plan is None else plan[0]
        return on_rows(images, positions, lambda rows, at: kornia().enhance.solarize(
            rows, per_row(params[at, 1], rows)))

    def __repr__(self) -> str:
        return f"SolarizeOp(p={self.p}, threshold={self.threshold})"


class NormalizeOp:
    """torchvision's Normalize: (x - mean) / std per channel. No params."""

    size = 0

    def __init__(self, mean, std):
        self.mean, self.std = torch.tensor(mean, dtype=torch.float32), \
            torch.tensor(std, dtype=torch.float32)

    def draw(self, view) -> List[float]:
        return []

    def draw_batch(self, draws, shape) -> torch.Tensor:
        return torch.zeros(len(draws), 0, dtype=torch.float64)

    def plan(self, params: torch.Tensor) -> list:
        return []

    def apply(self, images: torch.Tensor, params: torch.Tensor, plan=None) -> torch.Tensor:
        return kornia().enhance.normalize(images, self.mean.to(images.device, non_blocking=True),
                                 self.std.to(images.device, non_blocking=True))

    def __repr__(self) -> str:
        return f"NormalizeOp(mean={self.mean.tolist()}, std={self.std.tolist()})"


def device_ops(transform, crops: bool = False) -> list:
    """The ops standing for ``transform`` (a built transform of the chain: the distributions
    and validated arguments are its own), or None when it has no device counterpart. ToTensor
    is no op: every batch is first scaled from uint8 to [0, 1]. RandomResizedCrop,
    RandomHorizontalFlip and ImgPilToMultiCrop have counterparts only with ``crops``
    (DATA.<split>.DEVICE_CROPS)."""
    if isinstance(transform, T.ToTensor):
        return []
    if crops and isinstance(transform, T.RandomResizedCrop):
        return [ResizedCropOp(transform)]
    if crops and isinstance(transform, T.RandomHorizontalFlip):
        return [FlipOp(transform.p)]
    if crops and isinstance(transform, ImgPilToMultiCrop):
        return [MultiCropOp(transform.groups)]
    if isinstance(transform, T.ColorJitter):
        return [ColorJitterOp(transform)]
    if isinstance(transform, ImgPilColorDistortion):  # SimCLR: jitter p=0.8, then grey p=0.2
        return [ColorJitterOp(simclr_jitter(transform.strength), 0.8), GrayscaleOp(0.2)]
    if isinstance(transform, ImgPilRandomColorJitter):
        return [ColorJitterOp(transform.jitter, transform.p)]
    if isinstance(transform, T.RandomGrayscale):
        return [GrayscaleOp(transform.p)]
    if isinstance(transform, T.GaussianBlur):  # also the engine's GaussianBlur
        if transform.kernel_size[0] != transform.kernel_size[1]:
            raise ValueError("on the device GaussianBlur takes a square kernel")
        return [BlurOp(transform.kernel_size[0], *transform.sigma)]
    if isinstance(transform, ImgPilGaussianBlur):
        return [BlurOp(2 * math.ceil(3 * transform.radius_max) + 1, transform.radius_min,
                       transform.radius_max, transform.p)]
    if isinstance(transform, ImgPilRandomSolarize):
        return [SolarizeOp(transform.p, transform.threshold)]
    if isinstance(transform, T.Normalize):
        return [NormalizeOp(transform.mean, transform.std)]
    if isinstance(transform, T.RandomErasing):
        return [ErasingOp(transform.p, transform.scale, transform.ratio, transform.value)]
    return None
