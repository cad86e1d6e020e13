"""CIFAR-10, CIFAR-100, STL-10, MNIST and Fashion-MNIST read from their official files under a
local root.

The dataset is named by DATASET_NAMES (VISSL's names: CIFAR10, CIFAR100, STL10, MNIST; and
FASHION_MNIST); the root is the DATA_PATHS entry. TRAIN reads the training files, TEST the test
files. The IDX files of MNIST and Fashion-MNIST are read as published (gzipped, ``.gz``) or
unpacked, from torchvision's folder (``MNIST/raw``, ``FashionMNIST/raw``) or from the root itself
(Debian's ``dataset-fashion-mnist`` puts them in /usr/share/datasets/fashion-mnist). Nothing is
ever downloaded: a missing file is refused with its path.

The grey images are held as one uint8 array [N, 28, 28] (an array, not a list of objects, so
forked data-loading workers share its pages instead of copying them as they read) and made RGB
per sample.
"""
import gzip
import os
import pickle

import numpy as np
from PIL import Image

from ssl_engine.data.batched_reads import uint8_batch
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
_IDX_PREFIXES = {"TRAIN": "train", "TEST": "t10k"}
_IDX_FOLDERS = {"MNIST": "MNIST/raw", "FASHION_MNIST": "FashionMNIST/raw"}
NAMES = ("CIFAR10", "CIFAR100", "STL10", "MNIST", "FASHION_MNIST")


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
    """An IDX file of unsigned bytes (MNIST's format): magic, dimensions, data; gzipped when
    its name ends in .gz."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(_need(path), "rb") as f:
        magic = int.from_bytes(f.read(4), "big")
        if magic >> 8 != 0x08:  # two zero bytes, then 0x08: unsigned bytes
            raise ValueError(f"{path} is not an IDX file of unsigned bytes (magic {magic:#x})")
        dims = [int.from_bytes(f.read(4), "big") for _ in range(magic % 256)]
        data = np.frombuffer(f.read(), dtype=np.uint8)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path} holds {data.size} bytes of data, its header says "
                         f"{'x'.join(map(str, dims))}: the file is cut or damaged")
    return data.reshape(dims)


def _idx_file(root: str, name: str, stem: str) -> str:
    """The first of ``<root>/<torchvision folder>/<stem>``, ``<root>/<stem>``, each unpacked or
    ``.gz``, that exists (the first candidate when none does, for the error)."""
    candidates = [os.path.join(base, stem + ending)
                  for base in (os.path.join(root, _IDX_FOLDERS[name]), root)
                  for ending in ("", ".gz")]
    return next((path for path in candidates if os.path.isfile(path)), candidates[0])


def _read_idx_dataset(root: str, name: str, split: str):
    prefix = _IDX_PREFIXES[split]
    grey = _read_idx(_idx_file(root, name, f"{prefix}-images-idx3-ubyte"))
    labels = _read_idx(_idx_file(root, name, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
    return grey, labels


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
            self.images, self.targets = _read_idx_dataset(path, name, split)
        if len(self.images) != len(self.targets):
            raise ValueError(f"{name} under {path}: {len(self.images)} images but "
                             f"{len(self.targets)} labels")

    def __len__(self) -> int:
        return len(self.targets)

    def labels(self):
        return self.targets

    def read_batch(self, indices):
        """(the images at ``indices`` as one uint8 [n, 3, H, W] tensor, their labels): for
        DATA.<split>.BATCHED_READS (data/batched_reads.py)."""
        indices = np.asarray(indices, dtype=np.int64)
        return uint8_batch(self.images[indices]), self.targets[indices]

    def __getitem__(self, index: int):
        image = Image.fromarray(self.images[index])
        return image.convert("RGB") if image.mode != "RGB" else image, int(self.targets[index])
