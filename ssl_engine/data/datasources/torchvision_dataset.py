"""CIFAR-10, CIFAR-100, STL-10 and MNIST read from their official files under a local root.

The dataset is named by DATASET_NAMES (VISSL's names: CIFAR10, CIFAR100, STL10, MNIST); the
root is the DATA_PATHS entry. TRAIN reads the training files, TEST the test files. Nothing is
ever downloaded: a missing file is refused with its path.
"""
import os
import pickle

import numpy as np
from PIL import Image

from ssl_engine.data.registry import register_datasource

# name -> (folder under the root, {split: (files, label key)})
_CIFAR = {
    "CIFAR10": ("cifar-10-batches-py",
                {"TRAIN": ([f"data_batch_{i}" for i in range(1, 6)], "labels"),
                 "TEST": (["test_batch"], "labels")}),
    "CIFAR100": ("cifar-100-python",
                 {"TRAIN": (["train"], "fine_labels"), "TEST": (["test"], "fine_labels")}),
}
_STL10 = ("stl10_binary", {"TRAIN": "train", "TEST": "test"})
_MNIST = ("MNIST/raw", {"TRAIN": "train", "TEST": "t10k"})
NAMES = ("CIFAR10", "CIFAR100", "STL10", "MNIST")


def _need(path: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist (datasets are read from local files, "
                                "never downloaded)")
    return path


def _read_cifar(root: str, name: str, split: str):
    folder, splits = _CIFAR[name]
    files, label_key = splits[split]
    images, labels = [], []
    for file in files:
        with open(_need(os.path.join(root, folder, file)), "rb") as f:
            batch = pickle.load(f, encoding="latin1")
        images.append(np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        labels.extend(batch[label_key])
    return np.concatenate(images).transpose(0, 2, 3, 1), np.asarray(labels, dtype=np.int64)


def _read_stl10(root: str, split: str):
    folder, prefixes = _STL10
    base = os.path.join(root, folder, prefixes[split])
    pixels = np.fromfile(_need(base + "_X.bin"), dtype=np.uint8)
    # stored column-major per channel: [N, C, W, H]
    images = pixels.reshape(-1, 3, 96, 96).transpose(0, 3, 2, 1)
    labels = np.fromfile(_need(base + "_y.bin"), dtype=np.uint8).astype(np.int64) - 1
    return images, labels


def _read_idx(path: str) -> np.ndarray:
    """An IDX file of unsigned bytes (MNIST's format): magic, dimensions, data."""
    with open(_need(path), "rb") as f:
        magic = int.from_bytes(f.read(4), "big")
        dims = [int.from_bytes(f.read(4), "big") for _ in range(magic % 256)]
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


def _read_mnist(root: str, split: str):
    folder, prefixes = _MNIST
    base = os.path.join(root, folder, prefixes[split])
    grey = _read_idx(base + "-images-idx3-ubyte")
    labels = _read_idx(base + "-labels-idx1-ubyte").astype(np.int64)
    return np.repeat(grey[..., None], 3, axis=-1), labels


def dataset_name(cfg, split: str, source_index: int) -> str:
    """The DATASET_NAMES entry of a torchvision_dataset source (ValueError if missing/unknown)."""
    names = cfg.DATA[split].DATASET_NAMES
    key = f"config.DATA.{split}.DATASET_NAMES[{source_index}]"
    if source_index >= len(names):
        raise ValueError(f"{key} is missing: the torchvision_dataset source is named by it, one "
                         f"of {', '.join(NAMES)}")
    if names[source_index] not in NAMES:
        raise ValueError(f"{key}={names[source_index]!r}: the torchvision_dataset source reads "
                         f"one of {', '.join(NAMES)}")
    return names[source_index]


@register_datasource("torchvision_dataset")
class TorchvisionDatasetSource:
    """The images (RGB, uint8) and labels of one of NAMES, all held in memory."""

    needs_path = True

    def __init__(self, cfg, split: str, path: str, source_index: int):
        name = dataset_name(cfg, split, source_index)
        if name in _CIFAR:
            self.images, self.targets = _read_cifar(path, name, split)
        elif name == "STL10":
            self.images, self.targets = _read_stl10(path, split)
        else:
            self.images, self.targets = _read_mnist(path, split)
        if len(self.images) != len(self.targets):
            raise ValueError(f"{name} under {path}: {len(self.images)} images but "
                             f"{len(self.targets)} labels")

    def __len__(self) -> int:
        return len(self.targets)

    def labels(self):
        return self.targets

    def __getitem__(self, index: int):
        return Image.fromarray(self.images[index]), int(self.targets[index])
