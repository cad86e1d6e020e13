#!/usr/bin/env python
"""What a multi-crop batch costs: the model's forward and backward on a 2 x 224 + 6 x 96
batch (the trunk runs once per resolution, the heads once on the concatenation) beside the
sum of the two resolution groups run alone, and beside running the trunk once per crop.

Interleaved rounds on random images; median milliseconds per forward + backward.

    python benchmarks/multicrop_speed.py [--depth 50] [--batch 4] [--rounds 5]
        [--global-crops 2] [--local-crops 6] [--global-size 224] [--local-size 96] [--bf16]
"""
import argparse
import statistics
import time

import torch

import ssl_engine.losses  # noqa: F401  (the losses' derived settings and key rules)
from ssl_engine.config import load_config
from ssl_engine.models import build_model


def timed(model, inputs, amp: bool) -> float:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        outputs = model(inputs)
    sum(output.float().sum() for output in outputs).backward()
    model.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=50)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--global-crops", type=int, default=2)
    parser.add_argument("--local-crops", type=int, default=6)
    parser.add_argument("--global-size", type=int, default=224, help="pixels of a global crop")
    parser.add_argument("--local-size", type=int, default=96, help="pixels of a local crop")
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast of the model")
    args = parser.parse_args(argv)
    _, cfg = load_config(["config=pretrain/swav/swav_resnet50", "config.MACHINE.DEVICE=cpu",
                          "config.DISTRIBUTED.BACKEND=gloo",
                          f"config.MODEL.TRUNK.RESNETS.DEPTH={args.depth}",
                          "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=false"])
    width = 2048 if args.depth >= 50 else 512
    cfg.MODEL.HEAD.PARAMS = [["swav_head", {"dims": [width, 2048, 128], "use_bn": True,
                                            "num_clusters": [3000]}]]
    torch.manual_seed(0)
    model = build_model(cfg.MODEL).train()
    b = args.batch
    big = torch.randn(args.global_crops * b, 3, args.global_size, args.global_size)
    small = torch.randn(args.local_crops * b, 3, args.local_size, args.local_size)
    per_crop = list(big.split(b)) + list(small.split(b))
    big_alone, small_alone = f"{args.global_size} group alone", f"{args.local_size} group alone"
    variants = {
        "multi-crop batch (trunk once per resolution)": lambda: timed(model, [big, small],
                                                                      args.bf16),
        big_alone: lambda: timed(model, big, args.bf16),
        small_alone: lambda: timed(model, small, args.bf16),
        "trunk once per crop": lambda: timed(model, per_crop, args.bf16),
    }
    for run in variants.values():  # warm-up
        run()
    times = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, run in variants.items():
            times[name].append(run())
    medians = {name: statistics.median(values) for name, values in times.items()}
    groups = medians[big_alone] + medians[small_alone]
    print(f"ResNet-{args.depth}, {args.global_crops}x{args.global_size} + "
          f"{args.local_crops}x{args.local_size} crops of "
          f"{b} images, {'bf16' if args.bf16 else 'fp32'}, {torch.get_num_threads()} threads, "
          f"median of {args.rounds} rounds (forward + backward)")
    for name, value in medians.items():
        print(f"{name:<48}{value:>9.0f} ms")
    print(f"{'sum of the two groups alone':<48}{groups:>9.0f} ms")
    print(f"multi-crop batch / sum of its groups: {medians[next(iter(medians))] / groups:.2f}")


if __name__ == "__main__":
    main()
