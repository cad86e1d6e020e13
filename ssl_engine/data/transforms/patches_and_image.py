"""PIRL's views (Misra & van der Maaten 2020): an image crop and the jigsaw patches of another
crop (VISSL's ``ImgPilToPatchesAndImage``)."""
from typing import Sequence

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

from ssl_engine.data.registry import register_transform
from ssl_engine.data.transforms.jigsaw import ImgPatchesFromTensor


@register_transform("ImgPilToPatchesAndImage")
class ImgPilToPatchesAndImage:
    """A PIL image -> ``1 + num_patches`` PIL views: a RandomResizedCrop of ``crop_size_image``
    (scale ``crop_scale_image``), then the ``num_patches`` patches (a g x g grid, each shifted
    by up to ``patch_jitter`` pixels inside its cell, as ``ImgPatchesFromTensor``) of another
    RandomResizedCrop of ``crop_size_patches`` (scale ``crop_scale_patches``), in a random order
    with ``permute_patches``.  Later transforms apply to each view; ``patch_and_image_collator``
    batches them."""

    makes_views = True

    def __init__(self, crop_scale_image: Sequence[float] = (0.08, 1.0), crop_size_image: int = 224,
                 crop_scale_patches: Sequence[float] = (0.6, 1.0), crop_size_patches: int = 255,
                 permute_patches: bool = True, num_patches: int = 9, patch_jitter: int = 21):
        self.crop_image = T.RandomResizedCrop(int(crop_size_image), scale=tuple(crop_scale_image))
        self.crop_patches = T.RandomResizedCrop(int(crop_size_patches),
                                                scale=tuple(crop_scale_patches))
        self.to_patches = ImgPatchesFromTensor(num_patches, patch_jitter)
        self.permute_patches = bool(permute_patches)

    def __call__(self, image):
        views = [self.crop_image(image)]
        region = torch.from_numpy(np.array(self.crop_patches(image).convert("RGB"))).permute(2, 0, 1)
        patches = [Image.fromarray(patch.permute(1, 2, 0).numpy())
                   for patch in self.to_patches(region)]
        if self.permute_patches:
            patches = [patches[i] for i in torch.randperm(len(patches)).tolist()]
        return views + patches

    def __repr__(self) -> str:
        return (f"ImgPilToPatchesAndImage(image={self.crop_image}, patches={self.crop_patches}, "
                f"{self.to_patches}, permute_patches={self.permute_patches})")
