"""PIL photometric changes with random strengths (PIRL's and BYOL's solarization)."""
from typing import Optional

import torch
from PIL import ImageEnhance, ImageOps

from ssl_engine.data.registry import register_transform


def check_probability(p: float, key: str = "p") -> float:
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"{key} must be in [0, 1], got {p}")
    return float(p)


def random_int(low: int, high: int) -> int:
    """Uniform in [low, high], both included, from torch's global generator."""
    return int(torch.randint(low, high + 1, ()).item())


def random_solarize(image, threshold: Optional[int] = None):
    """Invert every pixel >= ``threshold``; None draws the threshold uniformly from 0..256
    (256 leaves the image as it is)."""
    return ImageOps.solarize(image, random_int(0, 256) if threshold is None else threshold)


def random_posterize(image):
    """Keep 4 to 8 (uniform) most significant bits of every channel."""
    return ImageOps.posterize(image, random_int(4, 8))


def random_sharpness(image):
    """Sharpness factor uniform in [0.1, 1.9) (1: unchanged, < 1: blurred)."""
    return ImageEnhance.Sharpness(image).enhance(0.1 + 1.8 * torch.rand(()).item())


@register_transform("ImgPilRandomPhotometric")
class ImgPilRandomPhotometric:
    """With probability ``p``: random posterize, random sharpness, random solarize, then
    autocontrast, all four in this order (PIRL)."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def __init__(self, p: float = 0.66):
        self.p = check_probability(p)

    def __call__(self, image):
        if torch.rand(()).item() >= self.p:
            return image
        image = random_solarize(random_sharpness(random_posterize(image)))
        return ImageOps.autocontrast(image)

    def __repr__(self) -> str:
        return f"ImgPilRandomPhotometric(p={self.p})"
