"""Images listed in a .npy file of paths, with labels from an optional label file."""
import json

import numpy as np

from ssl_engine.data.datasources.image_io import load_rgb_image
from ssl_engine.data.registry import register_datasource


def _load_npy(path: str, key: str, mmap: bool) -> np.ndarray:
    """The array in ``path``; with ``mmap`` a read-only numpy memory map (pages are read when
    indexed, and shared by the processes that map the same file)."""
    try:
        return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except ValueError as err:
        raise ValueError(
            f"{key}: {path} must be a numpy array of strings or integers saved without pickling "
            f"(e.g. np.save(path, np.array(list_of_str))): {err}"
        ) from err


_OBJECT_LABELS_FIX = (
    "holds Python objects (e.g. a list of classes per image, as ImageNet-ReaL's labels), which "
    "only pickles can store, and pickled files are not read (loading one can run code). Save "
    "the classes as an [N, K] integer array padded with -1 (np.save(path, rows) where rows[i] "
    "lists image i's classes, then -1s), or give a .json file holding one list of classes per "
    "image; OneHotEncode turns either into multi-hot vectors")


def load_labels(path: str, key: str, mmap: bool) -> np.ndarray:
    """The labels in ``path``: [N] class indices or [N, C] rows (integers such as VOC's
    1 / 0 / -1, or numbers). A .json file holds one class index or one list of class
    indices per image; lists become rows padded with -1."""
    if path.endswith(".json"):
        return _json_labels(path, key)
    try:
        labels = np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
    except ValueError as err:
        if any(hint in str(err) for hint in ("allow_pickle", "Object arrays", "Python objects")):
            raise ValueError(f"{key}: {path} {_OBJECT_LABELS_FIX}") from None
        raise ValueError(f"{key}: {path} must be a numpy array of integers saved without "
                         f"pickling: {err}") from err
    numeric = labels.dtype == np.bool_ or np.issubdtype(labels.dtype, np.number)
    if labels.ndim not in (1, 2) or (labels.ndim == 2 and not numeric):
        raise ValueError(
            f"{key}: {path} holds an array of shape {labels.shape} and dtype {labels.dtype}; "
            "labels are [N] class indices or [N, C] numeric rows (e.g. VOC's 1 / 0 / -1)")
    return labels


def _json_labels(path: str, key: str) -> np.ndarray:
    with open(path) as handle:
        try:
            entries = json.load(handle)
        except json.JSONDecodeError as err:
            raise ValueError(f"{key}: {path} is not valid JSON: {err}") from None
    if not isinstance(entries, list):
        raise ValueError(f"{key}: {path} must hold a JSON list (one entry per image)")
    if all(isinstance(entry, int) and not isinstance(entry, bool) for entry in entries):
        return np.asarray(entries, dtype=np.int64)
    rows = []
    for index, entry in enumerate(entries):
        entry = [entry] if isinstance(entry, int) and not isinstance(entry, bool) else entry
        if not isinstance(entry, list) or not all(
                isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in entry):
            raise ValueError(f"{key}: {path}: entry {index} is {entry!r}; each entry must be a "
                             "class index or a list of class indices >= 0")
        rows.append(entry)
    width = max([len(row) for row in rows] + [1])
    padded = np.full((len(rows), width), -1, dtype=np.int64)
    for index, row in enumerate(rows):
        padded[index, :len(row)] = row
    return padded


def label_path(cfg, split: str, source_index: int) -> str:
    """The LABEL_PATHS entry of this source, or "" when there is none."""
    paths = cfg.DATA[split].LABEL_PATHS
    return paths[source_index] if source_index < len(paths) and paths[source_index] else ""


@register_datasource("disk_filelist")
class DiskFilelistSource:
    """DATA_PATHS entry: a .npy of image paths. LABEL_PATHS entry (optional), one row per image:
    a .npy of [N] integer labels (an int per image), of [N, C] rows (a label vector per image,
    e.g. VOC's 1 present / 0 absent / -1 difficult) or a .json list (see ``load_labels``);
    without it every label is -1. With DATA.<split>.MMAP_MODE both .npy files are
    memory-mapped rather than read whole. DATA.<split>.REMOVE_IMG_PATH_PREFIX /
    NEW_IMG_PATH_PREFIX: a listed path that starts with the first is read with the second in
    its place (a file list written on another machine)."""

    needs_path = True

    def __init__(self, cfg, split: str, path: str, source_index: int):
        mmap = bool(cfg.DATA[split].MMAP_MODE)
        self.remove_prefix = str(cfg.DATA[split].get("REMOVE_IMG_PATH_PREFIX") or "")
        self.new_prefix = str(cfg.DATA[split].get("NEW_IMG_PATH_PREFIX") or "")
        self.image_paths = _load_npy(path, f"config.DATA.{split}.DATA_PATHS[{source_index}]", mmap)
        labels_file = label_path(cfg, split, source_index)
        if labels_file:
            key = f"config.DATA.{split}.LABEL_PATHS[{source_index}]"
            self.label_array = load_labels(labels_file, key, mmap)
            if len(self.label_array) != len(self.image_paths):
                raise ValueError(
                    f"{key}: {labels_file} holds {len(self.label_array)} labels but {path} lists "
                    f"{len(self.image_paths)} images"
                )
        else:
            self.label_array = None

    def __len__(self) -> int:
        return len(self.image_paths)

    def labels(self):
        return None if self.label_array is None else np.asarray(self.label_array)

    def __getitem__(self, index: int):
        if self.label_array is None:
            label = -1
        elif self.label_array.ndim == 2:
            label = np.array(self.label_array[index])  # a copy: never a view of the map
        else:
            label = int(self.label_array[index])
        return load_rgb_image(self.image_path(index)), label

    def image_path(self, index: int) -> str:
        """The listed path of image ``index``, its prefix rewritten."""
        path = str(self.image_paths[index])
        if self.remove_prefix and path.startswith(self.remove_prefix):
            path = self.new_prefix + path[len(self.remove_prefix):]
        return path
