"""Regions of interest of images on disk (VISSL's ``disk_roi_annotations``): one sample per
annotated box, the image cropped to it (e.g. the person boxes of Open Images' MIAP, for the
fairness benchmarks)."""
import json
import os
from typing import Any, Dict, List

import numpy as np

from ssl_engine.data.datasources.image_io import load_rgb_image
from ssl_engine.data.registry import register_datasource

FORMAT = ('a JSON list with one entry per region, {"path": <image file>, "bbox": [left, top, '
          'right, bottom]} in pixels (an optional "label": a class index)')


def load_annotations(path: str, key: str) -> List[Dict[str, Any]]:
    """The regions listed in the annotation file ``path``, checked (ValueError naming ``key``)."""
    try:
        with open(path) as handle:
            entries = json.load(handle)
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{key}: cannot read the annotation file {path}: {err}") from None
    if not isinstance(entries, list):
        raise ValueError(f"{key}: {path} must hold {FORMAT}")
    for index, entry in enumerate(entries):
        box = entry.get("bbox") if isinstance(entry, dict) else None
        if (not isinstance(entry, dict) or not isinstance(entry.get("path"), str)
                or not isinstance(box, list) or len(box) != 4
                or not all(isinstance(v, (int, float)) for v in box)
                or not (box[0] < box[2] and box[1] < box[3])):
            raise ValueError(f"{key}: {path}: entry {index} is {entry!r}; the file must hold "
                             f"{FORMAT}, with left < right and top < bottom")
    return entries


@register_datasource("disk_roi_annotations")
class DiskROIAnnotationsSource:
    """DATA_PATHS entry: the annotation file (see ``FORMAT``).  Sample i is the image of entry
    i cropped to its box (PIL's crop: parts of the box outside the image are black); a relative
    image path is read from the annotation file's folder.  The label is the entry's "label", or
    -1 (LABEL_TYPE zero or sample_index give others).  DATA.<split>.REMOVE_IMG_PATH_PREFIX /
    NEW_IMG_PATH_PREFIX rewrite the image paths as for disk_filelist."""

    needs_path = True

    @staticmethod
    def check_path(cfg, split: str, path: str, source_index: int) -> None:
        load_annotations(path, f"config.DATA.{split}.DATA_PATHS[{source_index}]")

    def __init__(self, cfg, split: str, path: str, source_index: int):
        self.entries = load_annotations(path, f"config.DATA.{split}.DATA_PATHS[{source_index}]")
        self.folder = os.path.dirname(os.path.abspath(path))
        self.remove_prefix = str(cfg.DATA[split].get("REMOVE_IMG_PATH_PREFIX") or "")
        self.new_prefix = str(cfg.DATA[split].get("NEW_IMG_PATH_PREFIX") or "")

    def __len__(self) -> int:
        return len(self.entries)

    def labels(self):
        return np.asarray([int(entry.get("label", -1)) for entry in self.entries])

    def image_path(self, index: int) -> str:
        path = self.entries[index]["path"]
        if self.remove_prefix and path.startswith(self.remove_prefix):
            path = self.new_prefix + path[len(self.remove_prefix):]
        return os.path.join(self.folder, path)  # an absolute path stays as it is

    def __getitem__(self, index: int):
        entry = self.entries[index]
        image = load_rgb_image(self.image_path(index))
        return image.crop(tuple(float(v) for v in entry["bbox"])), int(entry.get("label", -1))
