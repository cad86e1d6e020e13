#!/usr/bin/env python
"""Cost per image of the SSL augmentations on one core, for the choice of implementation.

Each transform runs on the same synthetic 224x224 RGB images (PIL), one thread, rounds
interleaved; printed: median microseconds per image.  The Gaussian blur compares VISSL's
``ImgPilGaussianBlur`` (PIL's own Gaussian filter, a box-blur approximation), torchvision's
``GaussianBlur`` (a convolution, on the PIL image and on a tensor) and the engine's
``GaussianBlur`` (torchvision's, blurring PIL images by PIL's kernel filter for kernels of 3
and 5 pixels), with SimCLR's sigma range (0.1-2.0) and a kernel of 10% of the image (odd, at
least 3).

With ``--recipe``, instead: a loader worker's cost per image on the ImageNet SimCLR recipe
(decoding a 500x375 JPEG, 2 views of 224) today and with DATA.TRAIN.DEVICE_AUGMENTATION (the
workers decode, crop and flip and ship uint8 views with drawn parameters), their ratio, the
device half's cost per image on this CPU beside it, and the JPEG decoders compared
(benchmarks/worker_cost.py).

    python benchmarks/transforms_speed.py [--images 64] [--rounds 5] [--size 224]
    python benchmarks/transforms_speed.py --recipe [--images 32] [--rounds 5]
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

try:  # run as a script: benchmarks/ is on the path
    import worker_cost
except ImportError:  # imported as benchmarks.transforms_speed
    from benchmarks import worker_cost


def print_recipe(images: int, rounds: int) -> None:
    """The workers' cost with and without device augmentation, and the decoders."""
    costs = worker_cost.worker_costs(images, rounds)
    print(f"ImageNet SimCLR recipe (2 views of 224 from a 500x375 JPEG), 1 thread, median of "
          f"{rounds} rounds of {images} images, microseconds per image")
    print(f"{'CPU worker, today (PIL pipeline)':<52}{costs['today']:>10.0f}")
    print(f"{'CPU worker, DEVICE_AUGMENTATION=true':<52}{costs['option']:>10.0f}")
    print(f"{'ratio (at most 0.4 wanted)':<52}{costs['option'] / costs['today']:>10.2f}")
    print(f"{'device half on this CPU (batch of all views)':<52}{costs['device']:>10.0f}")
    print(f"\n{'JPEG decoder, 500x375':<44}{'us/image':>10}  pixels vs PIL")
    for name, micros, diff, shape in worker_cost.decoder_costs(rounds):
        same = f"max diff {diff}" if diff is not None else f"other size {shape[1]}x{shape[0]}"
        print(f"{name:<44}{micros:>10.0f}  {same}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--recipe", action="store_true",
                        help="the ImageNet SimCLR recipe's worker cost with and without "
                             "DATA.TRAIN.DEVICE_AUGMENTATION, and the JPEG decoders")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.recipe:
        print_recipe(args.images, args.rounds)
        return
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
