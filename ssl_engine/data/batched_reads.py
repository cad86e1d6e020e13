"""DATA.<split>.BATCHED_READS: a loader's batch read and drawn as one piece.

With DEVICE_AUGMENTATION (and usually DEVICE_CROPS), a data set held in memory at one image
size, whose transforms before the device tail only make copies of the image (ImgReplicatePil),
needs no per-sample work at all: the images of a batch are one fancy index into the source's
array, and every view's parameters are drawn for the whole batch at once with counter-based
draws (data/batch_draws.py), still a function of (SEED_VALUE, epoch, index, view), so exact
resumes and any number of loader workers give the same batches. The per-sample path's Python
work (seeded generators, PIL images, one draw call per op and view: about 0.4 ms a sample on
one CPU core) is what this removes; the draws are not those of the per-sample path.

A source takes part by providing ``read_batch(indices) -> (uint8 [n, C, H, W] tensor, labels)``
(torchvision_dataset does).
"""
from typing import List

import numpy as np
import torch

from ssl_engine.data.batch_draws import CounterDraws, row_keys
from ssl_engine.data.device_augmentation import PARAMS_KEY, build_device_augmentation
from ssl_engine.data.labels import sample_label
from ssl_engine.data.transforms import build_transforms
from ssl_engine.data.transforms.img_replicate import ImgReplicatePil


def batched_views(split_cfg, loader_chain, key: str, augmentation=None):
    """The number of views a batched read makes for ``split_cfg`` (cfg.DATA.<split>) whose
    loader side is ``loader_chain`` and device side ``augmentation`` (what DEVICE_AUGMENTATION
    makes of the transforms), or None without BATCHED_READS; ValueError for settings it cannot
    serve."""
    if not split_cfg.get("BATCHED_READS", False):
        return None
    if not split_cfg.get("DEVICE_AUGMENTATION", False):
        raise ValueError(f"{key}.BATCHED_READS=true needs {key}.DEVICE_AUGMENTATION=true (the "
                         "augmentations are drawn for the batch and applied on the device)")
    views = replicated_views(loader_chain, key)  # 1 before a multi-crop (one view maker)
    return views if augmentation is None else views * augmentation.views


def check_batched_reads(cfg, split: str) -> None:
    """Refuse, before launch, DATA.<split>.BATCHED_READS with transforms it cannot serve (the
    same checks as building the dataset; the source is checked when it is built)."""
    split_cfg, key = cfg.DATA[split], f"config.DATA.{split}"
    if split_cfg.get("BATCHED_READS", False):
        chain = build_transforms(split_cfg.TRANSFORMS, f"{key}.TRANSFORMS")
        augmentation = None
        if split_cfg.get("DEVICE_AUGMENTATION", False):
            chain, augmentation = build_device_augmentation(chain, split_cfg, key)
        batched_views(split_cfg, chain, key, augmentation)


def replicated_views(chain, key: str) -> int:
    """The number of views the loader side of ``chain`` makes when it only replicates the
    image (ImgReplicatePil, once or not at all; label maps are allowed); ValueError naming the
    first transform that does more."""
    views = 1
    kept = [t for t in chain.transforms if not getattr(t, "maps_label", False)]
    for position, transform in enumerate(kept):
        if not isinstance(transform, ImgReplicatePil) or position > 0:
            raise ValueError(
                f"{key}.BATCHED_READS=true needs every transform before the device tail of "
                f"{key}.TRANSFORMS to be one ImgReplicatePil, but {type(transform).__name__} "
                f"runs in the loader (set {key}.DEVICE_CROPS=true to move RandomResizedCrop "
                f"and RandomHorizontalFlip to the device, or BATCHED_READS=false)")
        views = transform.num_times
    return views


class BatchedReads:
    """The samples of a batch of ``dataset`` (a GenericSSLDataset with a device half) read
    and drawn at once."""

    def __init__(self, dataset, views: int, key: str):
        if not callable(getattr(dataset.source, "read_batch", None)):
            raise ValueError(
                f"{key}.BATCHED_READS=true needs a data source that holds its images in memory "
                f"(torchvision_dataset); {type(dataset.source).__name__} reads them one by one")
        self.dataset, self.views = dataset, views

    def samples(self, keys) -> List[dict]:
        """The sample dicts of ``keys`` (indices, or (epoch, index) pairs), as the per-sample
        path makes them (views as uint8 tensors, their parameters under PARAMS_KEY)."""
        dataset = self.dataset
        pairs = [key if isinstance(key, tuple) else (dataset.epoch, key) for key in keys]
        epochs = np.array([epoch for epoch, _ in pairs], dtype=np.int64)
        positions = np.array([index for _, index in pairs], dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= dataset.length):
            bad = positions[(positions < 0) | (positions >= dataset.length)][0]
            raise IndexError(f"index {bad} out of range for a dataset of {dataset.length} "
                             "samples")
        sources = positions if dataset.subset is None else np.asarray(dataset.subset)[positions]
        images, labels = dataset.source.read_batch(sources)
        if dataset.label_type == "sample_index":
            labels = positions
        elif dataset.label_type == "zero":
            labels = np.zeros_like(positions)
        shape = tuple(images.shape[1:])
        params = [dataset.device_augmentation.draw_batch(
            CounterDraws(row_keys(dataset.seed_value, epochs, positions, view)), shape, view)
            for view in range(self.views)]
        samples = []
        for row, position in enumerate(positions.tolist()):
            label = sample_label(dataset.transform.map_label(labels[row]))
            image = images[row]
            samples.append({"data": [image] * self.views, "label": [label] * self.views,
                            "data_idx": position, "data_valid": True,
                            PARAMS_KEY: [view_params[row] for view_params in params]})
        return samples


def uint8_batch(images: np.ndarray) -> torch.Tensor:
    """[n, H, W] (grey, made RGB as the per-sample path does) or [n, H, W, C] uint8 arrays as a
    uint8 [n, C, H, W] tensor."""
    tensor = torch.from_numpy(np.ascontiguousarray(images))
    if tensor.dim() == 3:
        return tensor[:, None].expand(-1, 3, -1, -1)
    return tensor.permute(0, 3, 1, 2)
