import torch
from PIL import ImageFilter

from ssl_engine.data.registry import register_transform


@register_transform("ImgPilGaussianBlur")
class ImgPilGaussianBlur:
    """With probability ``p``, a PIL Gaussian blur of radius uniform in [radius_min, radius_max]."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def __init__(self, p: float = 0.5, radius_min: float = 0.1, radius_max: float = 2.0):
        if not 0.0 <= p <= 1.0 or radius_min > radius_max:
            raise ValueError(
                "need 0 <= p <= 1 and radius_min <= radius_max, "
                f"got p={p}, radius_min={radius_min}, radius_max={radius_max}"
            )
        self.p, self.radius_min, self.radius_max = p, radius_min, radius_max

    def __call__(self, image):
        if torch.rand(()).item() >= self.p:
            return image
        radius = self.radius_min + (self.radius_max - self.radius_min) * torch.rand(()).item()
        return image.filter(ImageFilter.GaussianBlur(radius=radius))

    def __repr__(self) -> str:
        return (
            f"ImgPilGaussianBlur(p={self.p}, radius_min={self.radius_min}, "
            f"radius_max={self.radius_max})"
        )
