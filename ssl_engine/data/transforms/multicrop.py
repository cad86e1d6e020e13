from typing import List, Sequence

import torchvision.transforms as T

from ssl_engine.data.registry import register_transform


@register_transform("ImgPilToMultiCrop")
class ImgPilToMultiCrop:
    """One image -> ``total_num_crops`` RandomResizedCrops: ``num_crops[k]`` crops of side
    ``size_crops[k]`` with area scale range ``crop_scales[k]``, groups in the order given."""

    makes_views = True

    def __init__(
        self,
        total_num_crops: int,
        num_crops: Sequence[int],
        size_crops: Sequence[int],
        crop_scales: Sequence[Sequence[float]],
    ):
        if not len(num_crops) == len(size_crops) == len(crop_scales):
            raise ValueError("num_crops, size_crops and crop_scales need one entry per resolution")
        if sum(num_crops) != total_num_crops:
            raise ValueError(
                f"total_num_crops={total_num_crops} but num_crops sum to {sum(num_crops)}"
            )
        self.crops: List[T.RandomResizedCrop] = []
        self.groups = []  # (count, crop) per resolution, for the device's counterpart
        for count, size, scale in zip(num_crops, size_crops, crop_scales):
            crop = T.RandomResizedCrop(size, scale=tuple(scale))
            self.crops += [crop] * count
            self.groups.append((int(count), crop))

    def __call__(self, image):
        return [crop(image) for crop in self.crops]

    def __repr__(self) -> str:
        return f"ImgPilToMultiCrop({self.crops})"
