"""scikit-learn's bundled 8x8 handwritten digits (1797 images), with a fixed stratified split."""
import functools

import numpy as np
from PIL import Image

from ssl_engine.data.registry import register_datasource

TEST_FRACTION = 0.3
SPLIT_SEED = 0


@functools.lru_cache(maxsize=1)
def digits_split():
    """(uint8 images [1797, 8, 8], targets, {"TRAIN": sorted indices, "TEST": sorted indices})."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype(np.uint8)
    train, test = train_test_split(
        np.arange(len(digits.target)),
        test_size=TEST_FRACTION,
        stratify=digits.target,
        random_state=SPLIT_SEED,
    )
    return images, digits.target, {"TRAIN": np.sort(train), "TEST": np.sort(test)}


@register_datasource("digits")
class DigitsSource:
    """TRAIN: 1257 images, TEST: 540; grey values 0..16 scaled to 0..255, as RGB 8x8 images.
    The path is ignored."""

    needs_path = False

    def __init__(self, cfg, split: str, path: str, source_index: int):
        self.images, self.targets, splits = digits_split()
        self.indices = splits[split]

    def __len__(self) -> int:
        return len(self.indices)

    def labels(self):
        return self.targets[self.indices]

    def __getitem__(self, index: int):
        original = self.indices[index]
        grey = self.images[original]
        return Image.fromarray(np.stack([grey] * 3, axis=-1)), int(self.targets[original])
