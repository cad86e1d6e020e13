import logging

import torch
import torchvision.transforms as T

from ssl_engine.data.registry import register_transform
from ssl_engine.data.transforms.photometric import check_probability

logger = logging.getLogger(__name__)
# keys VISSL's ImgPilColorDistortion took but never read (its from_config passed strength alone)
VISSL_UNREAD = ("brightness", "contrast", "saturation", "hue", "color_jitter_probability",
                "grayscale_probability")
_warned = set()


def simclr_jitter(strength: float) -> T.ColorJitter:
    """SimCLR's ColorJitter of strength s: brightness, contrast, saturation 0.8s, hue 0.2s."""
    return T.ColorJitter(0.8 * strength, 0.8 * strength, 0.8 * strength, 0.2 * strength)


@register_transform("ImgPilColorDistortion")
class ImgPilColorDistortion:
    """SimCLR colour distortion: with p=0.8 ColorJitter(0.8s, 0.8s, 0.8s, 0.2s), then grayscale
    with p=0.2, where s is ``strength``. VISSL's keys brightness, contrast, saturation, hue,
    color_jitter_probability and grayscale_probability (its iBOT files set them) are accepted
    and, as VISSL built this transform from ``strength`` alone, not read: said once."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def __init__(self, strength: float = 1.0, **vissl_unread):
        unknown = sorted(set(vissl_unread) - set(VISSL_UNREAD))
        if unknown:
            raise TypeError(f"ImgPilColorDistortion got unexpected arguments {unknown}")
        if vissl_unread and not _warned.issuperset(vissl_unread):
            _warned.update(vissl_unread)
            logger.warning("ImgPilColorDistortion: %s ignored; VISSL built this transform from "
                           "strength alone, and so does the engine", vissl_unread)
        self.strength = strength
        self.transform = T.Compose([T.RandomApply([simclr_jitter(strength)], p=0.8),
                                    T.RandomGrayscale(p=0.2)])

    def __call__(self, image):
        return self.transform(image)

    def __repr__(self) -> str:
        return f"ImgPilColorDistortion(strength={self.strength})"


@register_transform("ImgPilRandomColorJitter")
class ImgPilRandomColorJitter:
    """With probability ``p``, SimCLR's ColorJitter of ``strength`` (no grayscale)."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def __init__(self, strength: float = 1.0, p: float = 0.8):
        self.strength, self.p = strength, check_probability(p)
        self.jitter = simclr_jitter(strength)

    def __call__(self, image):
        if torch.rand(1).item() >= self.p:
            return image
        return self.jitter(image)

    def __repr__(self) -> str:
        return f"ImgPilRandomColorJitter(strength={self.strength}, p={self.p})"
