"""Images listed in a .npy file of paths, with labels from an optional .npy of integers."""
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


def label_path(cfg, split: str, source_index: int) -> str:
    """The LABEL_PATHS entry of this source, or "" when there is none."""
    paths = cfg.DATA[split].LABEL_PATHS
    return paths[source_index] if source_index < len(paths) and paths[source_index] else ""


@register_datasource("disk_filelist")
class DiskFilelistSource:
    """DATA_PATHS entry: a .npy of image paths. LABEL_PATHS entry (optional): a .npy of integer
    labels of the same length; without it every label is -1. With DATA.<split>.MMAP_MODE both
    files are memory-mapped rather than read whole."""

    needs_path = True

    def __init__(self, cfg, split: str, path: str, source_index: int):
        mmap = bool(cfg.DATA[split].MMAP_MODE)
        self.image_paths = _load_npy(path, f"config.DATA.{split}.DATA_PATHS[{source_index}]", mmap)
        labels_file = label_path(cfg, split, source_index)
        if labels_file:
            key = f"config.DATA.{split}.LABEL_PATHS[{source_index}]"
            self.label_array = _load_npy(labels_file, key, mmap)
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
        label = -1 if self.label_array is None else int(self.label_array[index])
        return load_rgb_image(str(self.image_paths[index])), label
