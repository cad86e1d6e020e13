"""PIL image -> float tensor [C, H, W], in [0, 1] or in raw 0..255 values."""
import numpy as np
import torch

from ssl_engine.data.registry import register_transform


def channels_first(image) -> np.ndarray:
    """The pixels of a PIL image or HxW(xC) array as a C x H x W array (C=1 for grayscale)."""
    pixels = np.asarray(image)
    return pixels[None] if pixels.ndim == 2 else np.moveaxis(pixels, -1, 0)


@register_transform("ImgToTensor")
class ImgToTensor:
    """Float32 tensor with pixel values divided by 255."""

    def __call__(self, image):
        return torch.from_numpy(channels_first(image).astype(np.float32) / 255)

    def __repr__(self) -> str:
        return "ImgToTensor()"


@register_transform("ImgPilToRawTensor")
class ImgPilToRawTensor:
    """Float32 tensor with the raw 0..255 pixel values (for a Normalize with 0..255 means)."""

    def __call__(self, image):
        return torch.from_numpy(np.ascontiguousarray(channels_first(image))).float()

    def __repr__(self) -> str:
        return "ImgPilToRawTensor()"
