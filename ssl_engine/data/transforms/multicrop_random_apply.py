from typing import Any, Dict, List, Sequence

import torch

from ssl_engine.data.registry import register_transform
from ssl_engine.data.transforms.chain import build_transforms
from ssl_engine.data.transforms.photometric import check_probability


@register_transform("ImgPilMultiCropRandomApply")
class ImgPilMultiCropRandomApply:
    """After the views are made: the ``transforms`` (a TRANSFORMS-style list) applied to view i
    with probability ``prob[i]``, e.g. BYOL's solarization ``prob: [0.0, 0.2]``."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    takes_views = True

    def __init__(self, transforms: List[Dict[str, Any]], prob: Sequence[float]):
        self.prob = [check_probability(p, "prob") for p in prob]
        if not self.prob:
            raise ValueError("prob needs one probability per view")
        self.chain = build_transforms(transforms, key="transforms")

    def __call__(self, views):
        if not isinstance(views, list) or len(views) != len(self.prob):
            count = len(views) if isinstance(views, list) else "one image, not"
            raise ValueError(f"ImgPilMultiCropRandomApply has {len(self.prob)} probabilities "
                             f"(prob) for {count} views")
        return [self.chain(view) if torch.rand(()).item() < p else view
                for view, p in zip(views, self.prob)]

    def __repr__(self) -> str:
        return f"ImgPilMultiCropRandomApply(prob={self.prob}, {self.chain!r})"
