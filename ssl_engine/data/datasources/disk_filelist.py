"""Images listed in a .npy file of paths, with labels from an optional .npy of integers."""
import numpy as np

from ssl_engine.data.datasources.image_io import load_rgb_image
from ssl_engine.data.registry import register_datasource


def _load_npy(path: str, key: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
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
    labels of the same length; without it every label is -1."""

    needs_path = True

    def __init__(self, cfg, split: str, path: str, source_index: int):
        listed = _load_npy(path, f"config.DATA.{split}.DATA_PATHS[{source_index}]")
        self.image_paths = [str(p) for p in listed]
        labels_file = label_path(cfg, split, source_index)
        if labels_file:
            key = f"config.DATA.{split}.LABEL_PATHS[{source_index}]"
            self.labels = [int(v) for v in _load_npy(labels_file, key)]
            if len(self.labels) != len(self.image_paths):
                raise ValueError(
                    f"{key}: {labels_file} holds {len(self.labels)} labels but {path} lists "
                    f"{len(self.image_paths)} images"
                )
        else:
            self.labels = [-1] * len(self.image_paths)

    def __len__(self) -> int:
        return len(self.image_paths)

    def __getitem__(self, index: int):
        return load_rgb_image(self.image_paths[index]), self.labels[index]
