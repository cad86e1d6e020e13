#!/usr/bin/env python
"""Write the bundled digits as image files, in the two layouts the engine reads from disk.

    python extra_scripts/export_digits.py /data/digits

makes, for the fixed train/test split of the ``digits`` data source:

    /data/digits/<split>/<class>/<index>.png          (config.DATA.<SPLIT>.DATA_SOURCES=[disk_folder])
    /data/digits/<split>_images.npy, <split>_labels.npy   (disk_filelist: paths and labels)

so that a config can be tried on real files, e.g.
``config.DATA.TRAIN.DATA_SOURCES=[disk_folder] config.DATA.TRAIN.DATA_PATHS=[/data/digits/train]``.
"""
import argparse
from pathlib import Path

import numpy as np

from ssl_engine.data.datasources.digits import digits_split


def export_digits(out_dir: Path) -> dict:
    """Write both layouts under ``out_dir``; return {split: number of images}."""
    from PIL import Image

    images, targets, splits = digits_split()
    counts = {}
    for split, indices in splits.items():
        name = split.lower()
        paths = []
        for index in indices:
            path = out_dir / name / str(int(targets[index])) / f"{int(index):04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[index]).convert("RGB").save(path)
            paths.append(str(path.resolve()))
        np.save(out_dir / f"{name}_images.npy", np.array(paths))
        np.save(out_dir / f"{name}_labels.npy", targets[indices].astype(np.int64))
        counts[name] = len(paths)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="folder to write into (created)")
    args = parser.parse_args()
    for split, count in export_digits(args.out_dir).items():
        print(f"{split}: {count} images in {args.out_dir / split} and {split}_images.npy")


if __name__ == "__main__":
    main()
