"""Deterministic random images, for smoke tests and benchmarks without data on disk."""
import numpy as np
from PIL import Image

from ssl_engine.data.registry import register_datasource
from ssl_engine.data.subset import check_split_size

_SPLIT_STREAM = {"TRAIN": 0, "TEST": 1}


@register_datasource("synthetic")
class SyntheticImageSource:
    """``NUM_SAMPLES`` uniform-noise RGB images of ``IMAGE_SIZE``; image i depends only on
    (split, i); its label is ``i % NUM_CLASSES``. The path is ignored."""

    needs_path = False

    @staticmethod
    def check_path(cfg, split: str, path: str, source_index: int) -> None:
        """Before launch: the split holds at least one image."""
        check_split_size(int(cfg.DATA[split].SYNTHETIC.NUM_SAMPLES), cfg.DATA[split], split,
                         f"config.DATA.{split}.SYNTHETIC.NUM_SAMPLES="
                         f"{cfg.DATA[split].SYNTHETIC.NUM_SAMPLES}")

    def __init__(self, cfg, split: str, path: str, source_index: int):
        settings = cfg.DATA[split].SYNTHETIC
        self.num_samples = int(settings.NUM_SAMPLES)
        self.image_size = int(settings.IMAGE_SIZE)
        self.num_classes = int(settings.NUM_CLASSES)
        self.stream = _SPLIT_STREAM[split]

    def __len__(self) -> int:
        return self.num_samples

    def labels(self):
        return [index % self.num_classes for index in range(self.num_samples)]

    def __getitem__(self, index: int):
        rng = np.random.default_rng([self.stream, index])
        pixels = rng.integers(0, 256, size=(self.image_size, self.image_size, 3), dtype=np.uint8)
        return Image.fromarray(pixels), index % self.num_classes
