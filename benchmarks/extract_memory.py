#!/usr/bin/env python
"""Feature extraction memory and speed: peak memory must not grow with the features written.

Extracts a 2048-wide "heads" layer (a ResNet-18 of width 0.125 on 16x16 synthetic images, then
an mlp head [64, 2048]) for N = 2,000 and N = 40,000 images, each in a fresh subprocess running
the extract_features engine with 1 process (rows renamed into place) and with 2 processes
(rows merged by rank 0), and reads the peak resident memory of the busiest process (ru_maxrss,
which counts memory-mapped pages too). Then, in one process, compares extraction throughput
with a bare ``torch.no_grad()`` forward loop over the same batches.

    python benchmarks/extract_memory.py      # about 1-2 minutes on 2 CPU cores
    python benchmarks/extract_memory.py [--sizes 2000 40000] [--procs 1 2]
        [--throughput-size 10000] [--repeats 3]

Targets: peak growth / feature-bytes growth <= 0.10; extraction / bare forward >= 0.9.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (2_000, 40_000)
PROCS = (1, 2)
THROUGHPUT_SIZE = 10_000
REPEATS = 3
THREADS = 1  # torch threads per child: timings stay stable on a shared 2-core machine
WIDTH = 2048
OVERRIDES = [
    "config=feature_extraction/extract_resnet_digits",
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.SYNTHETIC.IMAGE_SIZE=16",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=256",
    "config.DATA.TRAIN.TRANSFORMS=[{name:ToTensor}]",
    "config.EXTRACT_FEATURES.SPLITS=[TRAIN]",
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.125",
    f"config.MODEL.HEAD.PARAMS=[[mlp,{{dims:[64,{WIDTH}]}}]]",
    "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=false",
    "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[]",
]


def config(num_samples: int, folder: str, procs: int = 1):
    import ssl_engine.losses  # noqa: F401  (the losses' derived settings and key rules)
    import ssl_engine.models  # noqa: F401  (the trunks')
    from ssl_engine.config import load_config

    _, cfg = load_config(OVERRIDES + [f"config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES={num_samples}",
                                      f"config.CHECKPOINT.DIR={folder}",
                                      f"config.DISTRIBUTED.NUM_PROC_PER_NODE={procs}",
                                      "config.DISTRIBUTED.INIT_METHOD=file"])
    return cfg


def peak_rss_bytes(who=resource.RUSAGE_SELF) -> int:
    return resource.getrusage(who).ru_maxrss * 1024  # Linux reports KiB


def child_extract(num_samples: int, folder: str, procs: int) -> None:
    """Run the extract_features engine (in this process, or in ``procs`` spawned ones); print
    the largest peak RSS of those processes as JSON."""
    import numpy as np

    from ssl_engine.engines.launcher import launch_distributed

    from ssl_engine.engines.prelaunch import check_before_launch
    from ssl_engine.utils.logger import setup_logging

    cfg = config(num_samples, folder, procs)
    check_before_launch("extract_features", cfg)
    start = time.perf_counter()
    launch_distributed(cfg, "extract_features")
    seconds = time.perf_counter() - start
    setup_logging(None, 1)  # quiet
    features = np.load(Path(folder) / "train_heads_features.npy", mmap_mode="r")
    assert features.shape == (num_samples, WIDTH), features.shape
    peak = max(peak_rss_bytes(), peak_rss_bytes(resource.RUSAGE_CHILDREN))
    print(json.dumps({"peak": peak, "seconds": seconds}))


def child_throughput(num_samples: int, folder: str, repeats: int) -> None:
    """Extraction vs a bare forward loop over the same batches (loaded beforehand, so data
    loading is left out of both) and the same model, alternated ``repeats`` times; best of
    each."""
    import torch

    from ssl_engine.config import AttrDict
    from ssl_engine.data import build_dataloader, build_dataset
    from ssl_engine.models import build_model
    from ssl_engine.extraction.write_splits import extract_split
    from ssl_engine.utils.logger import setup_logging

    setup_logging(None, 1)  # quiet
    cfg = config(num_samples, folder)
    Path(folder).mkdir(parents=True)
    torch.manual_seed(0)
    model = build_model(cfg.MODEL).eval()
    dataset = build_dataset(cfg, "TRAIN")
    split_cfg = AttrDict(dict(cfg.DATA.TRAIN, DROP_LAST=False))
    batches = list(build_dataloader(dataset, split_cfg, num_workers=0, pin_memory=False,
                                    epoch=0, shuffle=False))
    cpu = torch.device("cpu")

    def bare() -> None:
        with torch.no_grad():
            for batch in batches:
                model.extract_layers(batch["input"])

    def extraction() -> None:
        extract_split(model.extract_layers, batches, ["heads"], Path(folder), "TRAIN",
                      num_samples, num_samples, cpu)

    bare()  # warm-up
    times = {"bare": [], "extract": []}
    for _ in range(repeats):
        for name, fn in (("bare", bare), ("extract", extraction)):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    print(json.dumps({name: min(values) for name, values in times.items()}))


def run_child(*args) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS))
    result = subprocess.run([sys.executable, __file__, *map(str, args)], capture_output=True,
                            text=True, env=env)
    if result.returncode != 0:  # the child's own error, not only its exit status
        raise RuntimeError(f"child {args} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=SIZES, metavar=("SMALL", "LARGE"),
                        help="images extracted by the two runs compared")
    parser.add_argument("--procs", type=int, nargs="+", default=PROCS,
                        help="numbers of processes to extract with")
    parser.add_argument("--throughput-size", type=int, default=THROUGHPUT_SIZE)
    parser.add_argument("--repeats", type=int, default=REPEATS,
                        help="alternated rounds of the throughput comparison")
    parser.add_argument("--child-extract", nargs=3, metavar=("N", "DIR", "PROCS"))
    parser.add_argument("--child-throughput", nargs=3, metavar=("N", "DIR", "REPEATS"))
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.child_extract:
        child_extract(int(args.child_extract[0]), args.child_extract[1], int(args.child_extract[2]))
    elif args.child_throughput:
        child_throughput(int(args.child_throughput[0]), args.child_throughput[1],
                         int(args.child_throughput[2]))
    else:
        compare(args.sizes, args.procs, args.throughput_size, args.repeats)


def compare(sizes, procs_list, throughput_size: int, repeats: int) -> None:
    """Peak memory of extracting ``sizes`` images with each number of processes, then the
    throughput comparison; each in a fresh subprocess. Prints the tables."""
    mib = 2**20
    small_n, large_n = sizes
    feature_growth = (large_n - small_n) * WIDTH * 4
    peaks = {}
    with tempfile.TemporaryDirectory() as tmp:
        for procs in procs_list:
            for size in sizes:
                peaks[procs, size] = run_child("--child-extract", size, f"{tmp}/p{procs}n{size}",
                                               procs)
        speed = run_child("--child-throughput", throughput_size, f"{tmp}/speed", repeats)

    print(f"extraction of a {WIDTH}-wide layer ({THREADS} torch thread per process), "
          "a fresh subprocess per run")
    print(f"{'procs':>5} {'N':>8} {'features MiB':>13} {'peak RSS MiB':>13} {'time s':>7} "
          f"{'growth MiB':>11} {'ratio':>6}")
    for procs in procs_list:
        small, large = peaks[procs, small_n], peaks[procs, large_n]
        growth = large["peak"] - small["peak"]
        ratio = growth / feature_growth
        for size, run in zip(sizes, (small, large)):
            tail = f"{growth / mib:>11.1f} {ratio:>6.3f}" if size == large_n else ""
            print(f"{procs:>5} {size:>8,} {size * WIDTH * 4 / mib:>13.1f} "
                  f"{run['peak'] / mib:>13.1f} {run['seconds']:>7.1f} {tail}")
    worst = max((peaks[p, large_n]["peak"] - peaks[p, small_n]["peak"]) for p in procs_list)
    worst_ratio = worst / feature_growth
    print(f"ratio = peak growth / feature-bytes growth; worst {worst_ratio:.3f} (target <= 0.10) "
          f"{'OK' if worst_ratio <= 0.10 else 'MISSED'}")

    bare, extract = speed["bare"], speed["extract"]
    throughput = bare / extract
    print(f"\nthroughput, N = {throughput_size:,} images in batches of 256 loaded beforehand, "
          f"one process (best of {repeats} each)")
    print(f"{'bare no_grad forward':<22} {bare:>7.2f} s {throughput_size / bare:>9,.0f} img/s")
    print(f"{'extraction to disk':<22} {extract:>7.2f} s {throughput_size / extract:>9,.0f} img/s")
    print(f"extraction / bare = {throughput:.3f} (target >= 0.9) "
          f"{'OK' if throughput >= 0.9 else 'MISSED'}; extraction adds "
          f"{(extract - bare) / throughput_size * 1e6:.1f} us per image ({WIDTH * 4 // 1024} KiB "
          "written per image)")


if __name__ == "__main__":
    main()
