"""Images listed in a .npy file of paths, with labels from an optional label file."""
import json
import os

import numpy as np

from ssl_engine.data.datasources.image_io import load_rgb_image
from ssl_engine.data.registry import register_datasource
from ssl_engine.data.subset import check_split_size


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


_FILELIST_FORM = ("disk_filelist reads a numpy .npy file holding a 1-D array of image paths, "
                  "written with np.save(path, np.array(list_of_paths))")


def _is_text(start: bytes) -> bool:
    try:
        return bool(start) and "\x00" not in start.decode("utf-8")
    except UnicodeDecodeError:
        return False


def _npy_shape_and_dtype(path: str, key: str):
    """(shape, dtype) from the header of the .npy file ``path``, without reading its array;
    ValueError naming ``key`` when ``path`` is a folder, an empty file or no .npy file."""
    if os.path.isdir(path):
        raise ValueError(f"{key}: {path} is a folder; {_FILELIST_FORM} (for a folder of class "
                         "folders of images use the disk_folder source)")
    with open(path, "rb") as handle:
        start = handle.read(len(np.lib.format.MAGIC_PREFIX))
        if start != np.lib.format.MAGIC_PREFIX:
            if not start:
                what = "is empty (0 bytes)"
            else:
                what = ("is a text file, not a .npy file" if _is_text(start) else
                        "is not a .npy file (it does not start with numpy's header)")
            hint = ("; a text file of one path per line converts with np.save('list.npy', "
                    "np.array(open('list.txt').read().splitlines()))" if _is_text(start) else "")
            raise ValueError(f"{key}: {path} {what}: {_FILELIST_FORM}{hint}")
        handle.seek(0)
        try:
            version = np.lib.format.read_magic(handle)
            read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                           (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read_header is None:  # a newer format version: numpy's loader reads it
                array = np.load(path, mmap_mode="r", allow_pickle=False)
                return array.shape, array.dtype
            shape, _, dtype = read_header(handle)
        except ValueError as err:
            raise ValueError(f"{key}: {path} is not a valid .npy file ({err}): "
                             f"{_FILELIST_FORM}") from None
    return shape, dtype


def check_filelist(cfg, split: str, path: str, source_index: int) -> None:
    """Before launch: ``path`` is a .npy file of a 1-D array of paths, not empty (nor emptied
    by DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES)."""
    key = f"config.DATA.{split}.DATA_PATHS[{source_index}]"
    shape, dtype = _npy_shape_and_dtype(path, key)
    if dtype.hasobject:
        raise ValueError(f"{key}: {path} holds Python objects, which only pickles can store, "
                         f"and pickled files are not read (loading one can run code): "
                         f"{_FILELIST_FORM}")
    if len(shape) != 1:
        raise ValueError(f"{key}: {path} holds an array of shape {shape}; {_FILELIST_FORM}")
    check_split_size(shape[0], cfg.DATA[split], split, f"the file list {key}={path}")


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
    check_path = staticmethod(check_filelist)

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
