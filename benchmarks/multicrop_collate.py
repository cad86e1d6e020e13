#!/usr/bin/env python
"""What a multi-crop batch costs the loader on the device path (DATA.TRAIN.DEVICE_CROPS): the
collator's batch of each image once (what the workers ship) beside the same samples stacked
as ``total_num_crops`` copies (multicrop_collator's view-major stack of every view, with the
same parameters: what they would ship if every view were a copy). By default DINO's 2 x 224
and 6 x 96 views of 224-pixel images.

Interleaved rounds on random uint8 images; median milliseconds per batch and the MiB of its
``input``.

    python benchmarks/multicrop_collate.py [--batch 64] [--size 224] [--rounds 7]
"""
import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf

from ssl_engine.data.collators.multicrop import multicrop_collator
from ssl_engine.data.device_augmentation import (PARAMS_KEY, DeviceParamsCollator,
                                                 build_device_augmentation, rows_of_params)
from ssl_engine.data.transforms.chain import build_transforms

DINO_VIEWS = {"name": "ImgPilToMultiCrop", "total_num_crops": 8, "num_crops": [2, 6],
              "size_crops": [224, 96], "crop_scales": [[0.14, 1.0], [0.05, 0.14]]}


def samples_of(augmentation, batch: int, size: int):
    """``batch`` samples as the workers make them: one random image, every view's draws."""
    generator = torch.Generator().manual_seed(0)
    samples = []
    for index in range(batch):
        image = torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=generator)
        views, params = augmentation.draw(image)
        samples.append({"data": views, "label": [0] * len(views), "data_idx": index,
                        "data_valid": True, PARAMS_KEY: params})
    return samples


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224, help="pixels of the shipped images")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    split = OmegaConf.create({
        "DEVICE_AUGMENTATION": True, "DEVICE_CROPS": True,
        "COLLATE_FUNCTION": "multicrop_collator",
        "TRANSFORMS": [DINO_VIEWS, {"name": "RandomHorizontalFlip"}, {"name": "ToTensor"}]})
    chain = build_transforms(split.TRANSFORMS, "TRANSFORMS")
    _, augmentation = build_device_augmentation(chain, split, "config.DATA.TRAIN")
    samples = samples_of(augmentation, args.batch, args.size)

    def copies(samples):  # every view stacked, with the same drawn parameters and plans
        batch = multicrop_collator(samples)
        batch[PARAMS_KEY] = augmentation.row_groups(rows_of_params(samples), len(samples))
        return batch

    variants = {"each image once (shipped)": DeviceParamsCollator(multicrop_collator,
                                                                   augmentation),
                f"{augmentation.views} copies of each image": copies}
    times = {name: [] for name in variants}
    mib = {}
    for _ in range(args.rounds):
        for name, collate in variants.items():
            start = time.perf_counter()
            batch = collate(samples)
            times[name].append((time.perf_counter() - start) * 1e3)
            mib[name] = sum(t.numel() * t.element_size() for t in batch["input"]) / 2 ** 20
    print(f"batch {args.batch} of {args.size}-pixel images, {augmentation.views} views each")
    print(f"{'collated as':<28} {'ms':>7} {'input MiB':>10}")
    result = {}
    for name in variants:
        result[name] = (statistics.median(times[name]), mib[name])
        print(f"{name:<28} {result[name][0]:7.1f} {mib[name]:10.1f}")
    (once_ms, once_mib), (copies_ms, copies_mib) = result.values()
    print(f"copies / once: {copies_ms / once_ms:.2f}x the time, {copies_mib / once_mib:.1f}x "
          f"the bytes")
    return result


if __name__ == "__main__":
    main()
