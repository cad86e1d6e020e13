#!/usr/bin/env python
"""Cost per image of the SSL augmentations on one core, for the choice of implementation.

Each transform runs on the same synthetic 224x224 RGB images (PIL), one thread, rounds
interleaved; printed: median microseconds per image.  The Gaussian blur compares VISSL's
``ImgPilGaussianBlur`` (PIL's own Gaussian filter, a box-blur approximation), torchvision's
``GaussianBlur`` (a convolution, on the PIL image and on a tensor) and the engine's
``GaussianBlur`` (torchvision's, blurring PIL images by PIL's kernel filter for kernels of 3
and 5 pixels), with SimCLR's sigma range (0.1-2.0) and a kernel of 10% of the image (odd, at
least 3).

    python benchmarks/transforms_speed.py [--images 64] [--rounds 5] [--size 224]
"""
import argparse
import statistics
import time

import numpy as np
import torch
import torchvision.transforms as T
from PIL import Image

from ssl_engine.data.transforms.color_distortion import ImgPilColorDistortion
from ssl_engine.data.transforms.fast_blur import GaussianBlur
from ssl_engine.data.transforms.gaussian_blur import ImgPilGaussianBlur


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8))
              for _ in range(args.images)]
    tensors = [T.functional.to_tensor(image) for image in images]
    kernel = max(3, (args.size // 10) | 1)
    cases = {
        "ImgPilColorDistortion(1.0), PIL": (ImgPilColorDistortion(1.0), images),
        "ImgPilGaussianBlur(p=1), PIL filter": (ImgPilGaussianBlur(p=1.0), images),
        f"torchvision GaussianBlur({kernel}), PIL in": (T.GaussianBlur(kernel, (0.1, 2.0)), images),
        f"torchvision GaussianBlur({kernel}), tensor in": (T.GaussianBlur(kernel, (0.1, 2.0)),
                                                          tensors),
        f"engine GaussianBlur({kernel}), PIL in": (GaussianBlur(kernel, (0.1, 2.0)), images),
        f"RandomResizedCrop({args.size}), PIL": (T.RandomResizedCrop(args.size), images),
        "ToTensor": (T.ToTensor(), images),
    }
    timings = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, (transform, inputs) in cases.items():
            start = time.perf_counter()
            for item in inputs:
                transform(item)
            timings[name].append((time.perf_counter() - start) / len(inputs) * 1e6)
    print(f"{args.images} images of {args.size}x{args.size}, 1 thread, median of {args.rounds} "
          "rounds")
    print(f"{'transform':<48}{'us/image':>10}")
    for name, values in timings.items():
        print(f"{name:<48}{statistics.median(values):>10.0f}")


if __name__ == "__main__":
    main()
