"""The dataset of one split: a data source, label rule, limited subset, unreadable-image policy
and the seeded transform chain."""
import copy
import logging
import multiprocessing
import os
from typing import Any, Dict, List

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms.functional import to_tensor

from ssl_engine.data.batched_reads import BatchedReads, batched_views
from ssl_engine.data.datasources.image_io import ImageLoadError
from ssl_engine.data.device_augmentation import PARAMS_KEY, build_device_augmentation
from ssl_engine.data.labels import sample_label
from ssl_engine.data.local_copy import local_split_paths
from ssl_engine.data.paths import check_data_paths, source_classes, source_paths
from ssl_engine.data.seeding import sample_seed, seeded_rngs
from ssl_engine.data.subset import limited_indices
from ssl_engine.data.transforms import build_transforms

logger = logging.getLogger(__name__)

LABEL_TYPES = ("standard", "sample_index", "zero")


class GenericSSLDataset(Dataset):
    """``ds[i]`` -> {"data": [view tensors], "label": [label per view], "data_idx": i,
    "data_valid": True}, and "mask": [patch mask per view] after a masking transform
    (transforms/masking.py). A label is an int (one class) or a 1-D tensor (a row of an [N, C]
    label file, or what a ``maps_label`` transform such as OneHotEncode made of it).

    The random augmentation of sample i in epoch e is a pure function of (SEED_VALUE, e, i):
    the transforms run with the global generators seeded from those three and restored after,
    so results do not depend on workers, processes or the caller's random state. Views that are
    still PIL images after the transforms are converted with ``to_tensor`` (floats in [0, 1]).

    With DATA_LIMIT, position i reads source sample ``subset[i]`` (see ssl_engine.data.subset).
    An image that cannot be read (missing, empty, corrupt) raises ImageLoadError naming the file,
    its index and the key that skips such files, unless ENABLE_QUEUE_DATASET is set: then the
    next readable sample (i+1, i+2, ...) is returned in its place with "data_valid": False,
    until more than MAX_INVALID_IMAGES distinct files of this split have failed in this process
    (its loader workers count together).

    With ``device_augmentation`` (the trainer's datasets) and DATA.<split>.DEVICE_AUGMENTATION,
    the photometric tail of the transforms is left to the training device
    (data/device_augmentation.py): views are uint8 tensors and "device_params" holds each
    view's drawn parameters.
    """

    def __init__(self, cfg, split: str, device_augmentation: bool = False):
        check_data_paths(cfg, split)
        split_cfg = cfg.DATA[split]
        if split_cfg.LABEL_TYPE not in LABEL_TYPES:
            raise ValueError(
                f"config.DATA.{split}.LABEL_TYPE must be one of {LABEL_TYPES}, "
                f"got '{split_cfg.LABEL_TYPE}'"
            )
        classes = source_classes(cfg, split)
        cfg = _with_local_copies(cfg, split)
        path = source_paths(cfg, split, classes)[0]
        self.split = split
        self.source = classes[0](cfg, split, path, 0)
        self.label_type = split_cfg.LABEL_TYPE
        self.subset = limited_indices(self.source, split_cfg, split)
        self.length = len(self.source) if self.subset is None else len(self.subset)
        self.transform = build_transforms(
            split_cfg.TRANSFORMS, key=f"config.DATA.{split}.TRANSFORMS"
        )
        self.device_augmentation, self.batched = None, None
        if device_augmentation:
            key = f"config.DATA.{split}"
            self.transform, self.device_augmentation = build_device_augmentation(
                self.transform, split_cfg, key)
            views = batched_views(split_cfg, self.transform, key, self.device_augmentation)
            self.batched = None if views is None else BatchedReads(self, views, key)
        self.seed_value = int(cfg.SEED_VALUE)
        self.epoch = 0
        self.substitute = bool(split_cfg.ENABLE_QUEUE_DATASET)
        self.max_invalid = int(split_cfg.MAX_INVALID_IMAGES)
        # one flag per source sample, shared with the loader workers: files found unreadable
        self.invalid = multiprocessing.RawArray("b", len(self.source)) if self.substitute else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.length

    def invalid_count(self) -> int:
        """Distinct unreadable files met so far by this process and its loader workers."""
        return 0 if self.invalid is None else int(np.frombuffer(self.invalid, np.int8).sum())

    def _read(self, position: int):
        source_index = position if self.subset is None else int(self.subset[position])
        image, label = self.source[source_index]
        if self.label_type == "sample_index":
            label = position
        elif self.label_type == "zero":
            label = 0
        return image, label

    def _on_unreadable(self, position: int, err: ImageLoadError) -> None:
        """Count and log the failure; raise unless a substitute may be used."""
        key = f"config.DATA.{self.split}"
        source_index = position if self.subset is None else int(self.subset[position])
        where = f"{err} (index {source_index} of {key})"
        if not self.substitute:
            raise ImageLoadError(
                f"{where}; set {key}.ENABLE_QUEUE_DATASET=true to skip unreadable images, each "
                f"replaced by the next readable sample (up to {key}.MAX_INVALID_IMAGES="
                f"{self.max_invalid})") from err
        self.invalid[source_index] = 1
        count = self.invalid_count()
        if 0 <= self.max_invalid < count:
            raise ImageLoadError(
                f"{count} unreadable images in {key}, more than {key}.MAX_INVALID_IMAGES="
                f"{self.max_invalid} (-1: no limit); the last: {where}") from err
        logger.warning("unreadable image %d (at most %s) in %s, replaced by another sample: %s",
                       count, self.max_invalid if self.max_invalid >= 0 else "unlimited", key,
                       where)

    def __getitems__(self, keys) -> List[Dict[str, Any]]:
        """The samples of a loader's batch: read and drawn at once with BATCHED_READS
        (data/batched_reads.py), else one by one."""
        if self.batched is not None:
            return self.batched.samples(keys)
        return [self[key] for key in keys]

    def __getitem__(self, key) -> Dict[str, Any]:
        """``key``: an index (augmented for the epoch of ``set_epoch``), or ``(epoch, index)``
        from a sampler that passes the epoch along."""
        epoch, idx = key if isinstance(key, tuple) else (self.epoch, key)
        if not 0 <= idx < self.length:
            raise IndexError(f"index {idx} out of range for a dataset of {self.length} samples")
        position, valid = idx, True
        for _ in range(self.length):
            try:
                image, label = self._read(position)
                break
            except ImageLoadError as err:
                self._on_unreadable(position, err)
                position, valid = (position + 1) % self.length, False
        else:
            raise ImageLoadError(f"no readable image in config.DATA.{self.split}")
        # in a loader worker only torch's global state is put back after (data/seeding.py)
        in_worker = torch.utils.data.get_worker_info() is not None
        with seeded_rngs(sample_seed(self.seed_value, epoch, position), keep_all=not in_worker):
            views, view_labels = self.transform.apply(image)
            masks = getattr(views, "masks", None)  # MaskedViews (transforms/masking.py)
            if self.device_augmentation is not None:  # its draws: in the sample's generators
                views, params = self.device_augmentation.draw(views)
        views = views if isinstance(views, list) else [views]
        views = [view if isinstance(view, torch.Tensor) else to_tensor(view) for view in views]
        view_labels = view_labels or [None] * len(views)  # set by e.g. ImgRotatePil
        labels = [sample_label(self.transform.map_label(label if own is None else own))
                  for own in view_labels]
        sample = {"data": views, "label": labels, "data_idx": position, "data_valid": valid}
        if masks is not None:
            sample["mask"] = masks
        if self.device_augmentation is not None:
            sample[PARAMS_KEY] = params
        return sample


def dataset_labels(dataset: GenericSSLDataset):
    """The labels of ``dataset``'s samples as its source lists them (``labels()``; the
    split's LIMIT/subset applied), or None for a source that does not list them."""
    labels = dataset.source.labels() if hasattr(dataset.source, "labels") else None
    if labels is None or dataset.subset is None:
        return labels
    return np.asarray(labels)[np.asarray(dataset.subset)]


def _with_local_copies(cfg, split: str):
    """``cfg``, or a copy whose split reads the local copies (COPY_TO_LOCAL_DISK)."""
    split_cfg = cfg.DATA[split]
    if not split_cfg.COPY_TO_LOCAL_DISK:
        return cfg
    data_paths, label_paths = local_split_paths(split_cfg, int(os.environ.get("LOCAL_RANK", 0)))
    local = copy.deepcopy(cfg)
    local.DATA[split].DATA_PATHS = data_paths
    local.DATA[split].LABEL_PATHS = label_paths
    logger.info("%s data read from local copies: %s", split.lower(), data_paths + label_paths)
    return local


def build_dataset(cfg, split: str, device_augmentation: bool = False) -> GenericSSLDataset:
    """The dataset of ``cfg.DATA.<split>`` (split: "TRAIN" or "TEST"); ``device_augmentation``:
    honour DATA.<split>.DEVICE_AUGMENTATION (the trainer, which runs the device half)."""
    dataset = GenericSSLDataset(cfg, split, device_augmentation)
    split_cfg = cfg.DATA[split]
    name = ", ".join(split_cfg.DATASET_NAMES or split_cfg.DATA_SOURCES)
    logger.info("%s data: %s, %d samples", split.lower(), name, len(dataset))
    return dataset
