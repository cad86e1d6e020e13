"""``RandAugment`` as VISSL's configs write it (``magnitude``, ``magnitude_std``,
``num_layers``, ``increasing_severity``): timm's RandAugment, which VISSL's was adapted from;
given torchvision's own arguments (``num_ops``, ``num_magnitude_bins``, ``interpolation``,
``fill``), torchvision's RandAugment, as before this name was registered."""
from typing import Optional

import torchvision.transforms as tv_transforms

from ssl_engine.data.registry import register_transform

TORCHVISION_ONLY = ("num_ops", "num_magnitude_bins", "interpolation", "fill")


@register_transform("RandAugment")
class RandAugment:
    """``num_layers`` operations drawn per image, each applied with probability 0.5 at a
    magnitude drawn from N(``magnitude``, ``magnitude_std``) (of 10); with
    ``increasing_severity`` the operations whose strength grows with the magnitude. Other
    keyword arguments are timm's hparams (e.g. ``translate_const``, ``img_mean``)."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def __init__(self, magnitude: int = 10, magnitude_std: float = 0.0, num_layers: int = 2,
                 increasing_severity: bool = False, weight_choice: Optional[int] = None,
                 **kwargs):
        if any(key in kwargs for key in TORCHVISION_ONLY):
            self.transform = tv_transforms.RandAugment(magnitude=int(magnitude), **kwargs)
            return
        if weight_choice is not None:
            raise ValueError("RandAugment: weight_choice (VISSL's weighted choice of the "
                             "operations) is not supported; leave it out for a uniform choice")
        from timm.data.auto_augment import rand_augment_transform

        config = (f"rand-m{int(magnitude)}-n{int(num_layers)}-mstd{float(magnitude_std)}"
                  f"-inc{int(bool(increasing_severity))}")
        self.transform = rand_augment_transform(config, dict(kwargs) or None)

    def __call__(self, image):
        return self.transform(image)

    def __repr__(self) -> str:
        return f"RandAugment({self.transform!r})"
