"""torchvision's GaussianBlur, faster on PIL images with small kernels."""
import functools
import math
from typing import List

import numpy as np
import torchvision.transforms as T
from PIL import Image, ImageFilter

from ssl_engine.data.registry import register_transform


def gaussian_kernel2d(size: int, sigma: float) -> List[float]:
    """The normalised ``size`` x ``size`` Gaussian torchvision blurs with (outer product of the
    1-d kernel sampled at the integer offsets from the centre), row-major."""
    weights = [math.exp(-0.5 * ((i - (size - 1) / 2) / sigma) ** 2) for i in range(size)]
    total = sum(weights)
    weights = [w / total for w in weights]
    return [a * b for a in weights for b in weights]


@functools.lru_cache(maxsize=64)
def reflected_index(length: int, pad: int) -> np.ndarray:
    """Indices of ``length`` positions padded by ``pad`` on each side, mirrored without
    repeating the edge (numpy's and torch's "reflect")."""
    inner = np.arange(length)
    return np.concatenate([inner[pad:0:-1], inner, inner[-2:-2 - pad:-1]])


@register_transform("GaussianBlur")
class GaussianBlur(T.GaussianBlur):
    """``torchvision.transforms.GaussianBlur`` (same arguments, same draw of sigma from torch's
    generator, same kernel, same reflected borders) that blurs a PIL image with a square kernel
    of 3 or 5 pixels by PIL's own kernel filter instead of converting it to a tensor and back:
    the output is the same 8-bit image up to one level on rare pixels (3 of 400,000 pixels of
    random images; tested equal on natural ones), at a fraction of the cost on small images
    (benchmarks/transforms_speed.py).  Other inputs and kernels go to torchvision."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def forward(self, img):
        height, width = self.kernel_size[1], self.kernel_size[0]
        if not isinstance(img, Image.Image) or height != width or width not in (3, 5) \
                or img.mode not in ("L", "RGB") or min(img.size) <= width // 2:
            return super().forward(img)
        sigma = self.get_params(self.sigma[0], self.sigma[1])
        kernel = gaussian_kernel2d(width, sigma)
        pad = width // 2
        pixels = np.asarray(img)
        rows = reflected_index(pixels.shape[0], pad)
        cols = reflected_index(pixels.shape[1], pad)
        padded = Image.fromarray(pixels[rows[:, None], cols[None, :]])  # np.pad: 5x slower
        blurred = padded.filter(ImageFilter.Kernel((width, width), kernel,
                                                   scale=1.0))
        return blurred.crop((pad, pad, pad + img.size[0], pad + img.size[1]))
