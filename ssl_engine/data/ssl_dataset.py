"""The dataset of one split: a data source, label rule, limit and the seeded transform chain."""
import logging
from typing import Any, Dict

import torch
from torch.utils.data import Dataset
from torchvision.transforms.functional import to_tensor

from ssl_engine.data.paths import check_data_paths, source_classes, source_paths
from ssl_engine.data.seeding import sample_seed, seeded_rngs
from ssl_engine.data.transforms import build_transforms

logger = logging.getLogger(__name__)

LABEL_TYPES = ("standard", "sample_index", "zero")


class GenericSSLDataset(Dataset):
    """``ds[i]`` -> {"data": [view tensors], "label": [int per view], "data_idx": i,
    "data_valid": True}.

    The random augmentation of sample i in epoch e is a pure function of (SEED_VALUE, e, i):
    the transforms run with the global generators seeded from those three and restored after,
    so results do not depend on workers, processes or the caller's random state. Views that are
    still PIL images after the transforms are converted with ``to_tensor`` (floats in [0, 1]).
    """

    def __init__(self, cfg, split: str):
        check_data_paths(cfg, split)
        split_cfg = cfg.DATA[split]
        if split_cfg.LABEL_TYPE not in LABEL_TYPES:
            raise ValueError(
                f"config.DATA.{split}.LABEL_TYPE must be one of {LABEL_TYPES}, "
                f"got '{split_cfg.LABEL_TYPE}'"
            )
        classes = source_classes(cfg, split)
        path = source_paths(cfg, split, classes)[0]
        self.split = split
        self.source = classes[0](cfg, split, path, 0)
        self.label_type = split_cfg.LABEL_TYPE
        limit = int(split_cfg.DATA_LIMIT)
        self.length = min(len(self.source), limit) if limit > 0 else len(self.source)
        self.transform = build_transforms(
            split_cfg.TRANSFORMS, key=f"config.DATA.{split}.TRANSFORMS"
        )
        self.seed_value = int(cfg.SEED_VALUE)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key) -> Dict[str, Any]:
        """``key``: an index (augmented for the epoch of ``set_epoch``), or ``(epoch, index)``
        from a sampler that passes the epoch along."""
        epoch, idx = key if isinstance(key, tuple) else (self.epoch, key)
        if not 0 <= idx < self.length:
            raise IndexError(f"index {idx} out of range for a dataset of {self.length} samples")
        image, label = self.source[idx]
        if self.label_type == "sample_index":
            label = idx
        elif self.label_type == "zero":
            label = 0
        with seeded_rngs(sample_seed(self.seed_value, epoch, idx)):
            views, view_labels = self.transform.apply(image)
        views = views if isinstance(views, list) else [views]
        views = [view if isinstance(view, torch.Tensor) else to_tensor(view) for view in views]
        view_labels = view_labels or [None] * len(views)  # set by e.g. ImgRotatePil
        labels = [int(label) if own is None else int(own) for own in view_labels]
        return {"data": views, "label": labels, "data_idx": idx, "data_valid": True}


def build_dataset(cfg, split: str) -> GenericSSLDataset:
    """The dataset of ``cfg.DATA.<split>`` (split: "TRAIN" or "TEST")."""
    dataset = GenericSSLDataset(cfg, split)
    split_cfg = cfg.DATA[split]
    name = ", ".join(split_cfg.DATASET_NAMES or split_cfg.DATA_SOURCES)
    logger.info("%s data: %s, %d samples", split.lower(), name, len(dataset))
    return dataset
