import torch

from ssl_engine.data.registry import register_transform
from ssl_engine.data.transforms.photometric import check_probability, random_solarize


@register_transform("ImgPilRandomSolarize")
class ImgPilRandomSolarize:
    """With probability ``p``, invert every pixel value >= a threshold drawn uniformly from
    0..256 (VISSL's behaviour), or >= ``threshold`` when given (BYOL's recipe: 128).
    ``prob`` is accepted as another name of ``p``."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def __init__(self, p: float = 0.66, threshold: int = None, prob: float = None):
        self.p = check_probability(p if prob is None else prob)
        if threshold is not None and not 0 <= int(threshold) <= 256:
            raise ValueError(f"threshold must be in [0, 256], got {threshold}")
        self.threshold = None if threshold is None else int(threshold)

    def __call__(self, image):
        if torch.rand(()).item() >= self.p:
            return image
        return random_solarize(image, self.threshold)

    def __repr__(self) -> str:
        return f"ImgPilRandomSolarize(p={self.p}, threshold={self.threshold})"
