"""Jigsaw puzzles (VISSL's ``ImgPatchesFromTensor`` and ``ShuffleImgPatches``): an image tensor
is cut into a grid of jittered patches, which are put in the order of one permutation drawn
from a fixed set; the label is the index of that permutation.

With ``siamese_collator`` a batch is the patches of every image, sample-major, and the
``siamese_concat_view`` head puts the patch features of each image side by side.
"""
import math
import os
import urllib.parse
from pathlib import Path

import numpy as np
import torch

from ssl_engine.data.registry import register_transform


@register_transform("ImgPatchesFromTensor")
class ImgPatchesFromTensor:
    """A [C, H, W] tensor -> a list of ``num_patches`` (a square: g x g grid) patches. The grid
    cells are ``H // g`` pixels wide; each patch is a square of ``cell - patch_jitter`` pixels at
    a random offset in [0, patch_jitter) inside its cell. Patches are listed column by column
    (patch ``i * g + j``: column i, row j), as VISSL lists them."""

    random_augmentation = True  # dropped from extraction pipelines (extraction/one_view.py)

    def __init__(self, num_patches: int = 9, patch_jitter: int = 21):
        side = math.isqrt(int(num_patches))
        if num_patches < 1 or side * side != num_patches:
            raise ValueError(f"num_patches must be a square number (a g x g grid), "
                             f"got {num_patches}")
        if patch_jitter <= 0:
            raise ValueError(f"patch_jitter must be > 0, got {patch_jitter}")
        self.num_patches, self.side, self.jitter = int(num_patches), side, int(patch_jitter)

    def __call__(self, image):
        if not isinstance(image, torch.Tensor) or image.dim() != 3:
            raise TypeError("ImgPatchesFromTensor takes a [C, H, W] tensor: put it after "
                            f"ToTensor (and Normalize), got {type(image).__name__}")
        cell = image.shape[1] // self.side
        size = cell - self.jitter
        if size < 1 or image.shape[2] < cell * self.side:
            raise ValueError(
                f"ImgPatchesFromTensor: a {tuple(image.shape[1:])} image gives {self.side} x "
                f"{self.side} cells of {cell} pixels, too small for patch_jitter={self.jitter} "
                "(cells must be wider than the jitter); crop larger images")
        offsets = torch.randint(0, self.jitter, (2, self.side, self.side))
        patches = []
        for column in range(self.side):
            for row in range(self.side):
                x = column * cell + int(offsets[0, column, row])
                y = row * cell + int(offsets[1, column, row])
                patches.append(image[:, y:y + size, x:x + size].clone())
        return patches

    def __repr__(self) -> str:
        return f"ImgPatchesFromTensor(num_patches={self.num_patches}, patch_jitter={self.jitter})"


def _local_copy(perm_file: str) -> Path:
    """``perm_file`` itself, or for an http(s) URL a copy downloaded once into the torch hub
    cache (``$TORCH_HOME/hub/ssl_engine_permutations``)."""
    if not perm_file.startswith(("http://", "https://")):
        return Path(perm_file)
    name = os.path.basename(urllib.parse.urlparse(perm_file).path)
    local = Path(torch.hub.get_dir()) / "ssl_engine_permutations" / name
    if not local.is_file():
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(perm_file, str(local), progress=False)
        except Exception as err:  # noqa: BLE001  (no network, HTTP error ...)
            raise ValueError(f"ShuffleImgPatches: could not download perm_file {perm_file} "
                             f"({type(err).__name__}: {err}); download it and set perm_file "
                             "to the local .npy") from None
    return local


@register_transform("ShuffleImgPatches")
class ShuffleImgPatches:
    """The list of patches of ImgPatchesFromTensor -> one tensor [num_patches, C, h, w] with
    the patches in the order of a permutation drawn uniformly from ``perm_file`` (a .npy of
    shape [num_permutations, num_patches]; 1-based files are shifted to 0-based, as VISSL
    does); position t holds patch ``perm[t]``. The label becomes the permutation's index."""

    random_augmentation = True
    takes_views = True  # gets the whole list of patches
    sets_label = True

    def __init__(self, perm_file: str):
        path = _local_copy(str(perm_file))
        if not path.is_file():
            raise ValueError(f"ShuffleImgPatches: perm_file {perm_file} does not exist")
        perms = np.load(path, allow_pickle=False)
        if perms.ndim != 2 or not np.issubdtype(perms.dtype, np.number) or perms.size == 0:
            raise ValueError(f"ShuffleImgPatches: perm_file {perm_file} must hold a "
                             f"[num_permutations, num_patches] array, got {perms.shape} "
                             f"{perms.dtype}")
        perms = perms.astype(np.int64)
        if perms.min() == 1:
            perms = perms - 1
        expected = np.arange(perms.shape[1])
        if not all(np.array_equal(np.sort(row), expected) for row in perms):
            raise ValueError(f"ShuffleImgPatches: every row of {perm_file} must be a "
                             f"permutation of 0..{perms.shape[1] - 1} (or 1..{perms.shape[1]})")
        self.perm_file, self.perms = str(perm_file), perms

    def __call__(self, patches):
        if not isinstance(patches, list):
            raise TypeError("ShuffleImgPatches takes the list of patches of "
                            "ImgPatchesFromTensor: put it right after that transform")
        if len(patches) != self.perms.shape[1]:
            raise ValueError(f"ShuffleImgPatches: {len(patches)} patches for permutations of "
                             f"{self.perms.shape[1]} ({self.perm_file})")
        index = int(torch.randint(len(self.perms), ()).item())
        return torch.stack([patches[k] for k in self.perms[index]]), index

    def __repr__(self) -> str:
        return f"ShuffleImgPatches(perm_file={self.perm_file!r}, {len(self.perms)} permutations)"
