"""``RandAugment`` as VISSL's configs write it (``magnitude``, ``magnitude_std``,
``num_layers``, ``increasing_severity``): timm's RandAugment, which VISSL's was adapted from;
given torchvision's own arguments (``num_ops``, ``num_magnitude_bins``, ``interpolation``,
``fill``), torchvision's RandAugment, as before this name was registered."""
from typing import Optional

import numpy as np
import torchvision.transforms as tv_transforms

from ssl_engine.data.registry import register_transform

TORCHVISION_ONLY = ("num_ops", "num_magnitude_bins", "interpolation", "fill")

# ``weight_choice: 0``: the probability of drawing each operation (timm's first and only table
# of choice weights, by the operation's name without "Increasing"); posterize and invert are
# never drawn.
CHOICE_WEIGHTS = {0: {
    "AutoContrast": 0.025, "Equalize": 0.005, "Invert": 0.0, "Rotate": 0.3, "Posterize": 0.0,
    "Solarize": 0.005, "SolarizeAdd": 0.005, "Color": 0.025, "Contrast": 0.005,
    "Brightness": 0.005, "Sharpness": 0.025, "ShearX": 0.2, "ShearY": 0.2,
    "TranslateXRel": 0.1, "TranslateYRel": 0.1}}


@register_transform("RandAugment")
class RandAugment:
    """``num_layers`` operations drawn per image, each applied with probability 0.5 at a
    magnitude drawn from N(``magnitude``, ``magnitude_std``) (of 10); with
    ``increasing_severity`` the operations whose strength grows with the magnitude; with
    ``weight_choice: 0`` the operations are drawn without replacement with the probabilities of
    ``CHOICE_WEIGHTS[0]`` instead of uniformly (``WeightedChoice``). Other
    keyword arguments are timm's hparams (e.g. ``translate_const``, ``img_mean``)."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def __init__(self, magnitude: int = 10, magnitude_std: float = 0.0, num_layers: int = 2,
                 increasing_severity: bool = False, weight_choice: Optional[int] = None,
                 **kwargs):
        if any(key in kwargs for key in TORCHVISION_ONLY):
            self.transform = tv_transforms.RandAugment(magnitude=int(magnitude), **kwargs)
            return
        if weight_choice is not None and int(weight_choice) not in CHOICE_WEIGHTS:
            raise ValueError(f"RandAugment: weight_choice={weight_choice}: the only table of "
                             f"choice weights is {sorted(CHOICE_WEIGHTS)}")
        from timm.data.auto_augment import rand_augment_transform

        config = (f"rand-m{int(magnitude)}-n{int(num_layers)}-mstd{float(magnitude_std)}"
                  f"-inc{int(bool(increasing_severity))}")
        self.transform = rand_augment_transform(config, dict(kwargs) or None)
        if weight_choice is not None:
            self.transform = WeightedChoice(self.transform.ops, int(num_layers),
                                            CHOICE_WEIGHTS[int(weight_choice)])

    def __call__(self, image):
        return self.transform(image)

    def __repr__(self) -> str:
        return f"RandAugment({self.transform!r})"


class WeightedChoice:
    """``num_layers`` distinct operations per image, drawn with the table's probabilities
    (normalised), each then applied as in the uniform RandAugment (probability 0.5)."""

    def __init__(self, ops, num_layers: int, table: dict):
        self.ops = list(ops)
        self.num_layers = num_layers
        weights = np.array([table[op.name.replace("Increasing", "")] for op in self.ops])
        self.probs = weights / weights.sum()

    def choose(self):
        """The indices of the operations drawn for one image (numpy's global generator, which
        the data loader's workers seed)."""
        return np.random.choice(len(self.ops), self.num_layers, replace=False, p=self.probs)

    def __call__(self, image):
        for index in self.choose():
            image = self.ops[index](image)
        return image

    def __repr__(self) -> str:
        names = ", ".join(f"{op.name}: {p:.3f}" for op, p in zip(self.ops, self.probs))
        return f"WeightedChoice(n={self.num_layers}, {names})"
