#!/usr/bin/env python
"""Training speed of the engine's speed options beside a bare PyTorch loop, end to end.

Every variant is a fresh process started from the command line, so start-up and data loading
are part of what is measured; the variants run one after the other in rounds (every variant
once per round), so that a change of machine load hits all of them alike.

Workloads:
- ``resnet50``: SimCLR, ResNet-50, 2 views of 224x224 of synthetic images, batch 8
  (configs/config/benchmark/simclr_resnet50_synthetic.yaml), against
  benchmarks/bare_simclr_loop.py (torchvision's ResNet-50, fp32 eager, same images and
  augmentations).
- ``resnet18``: the same with a ResNet-18 trunk (a shorter step, so start-up differences
  stand out).
- ``quickstart``: the SimCLR quickstart (half-width ResNet-18 on 16x16 digits, batch 128),
  its speed settings switched off for the fp32 variant; no bare loop builds that model, so its
  ratios are to the engine in fp32 eager.

Per variant: the median time per iteration after the first ``--warmup`` iterations (data
loading included) over every round, its ratio to the reference, and the start-up time (launch
to the first iteration's log line; the first iteration included).

    python benchmarks/train_speed.py [--workload resnet50|resnet18|quickstart] [--rounds 2] [--iters 20]
        [--variants ...] [config.A.B=v ...]
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AMP = "config.MODEL.AMP_PARAMS.USE_AMP=true"
CL = "config.MODEL.CHANNELS_LAST=true"
COMPILE = "config.MODEL.COMPILE.USE_COMPILE=true"
DEPTHS = {"resnet50": 50, "resnet18": 18}  # the workloads with a bare loop
VARIANTS = {
    "engine fp32": [],
    "channels_last": [CL],
    "bf16 autocast": [AMP],
    "compile": [COMPILE],
    "bf16 + channels_last": [AMP, CL],
    "bf16 + channels_last + compile": [AMP, CL, COMPILE],
}


def timed_process(command, first_line: str):
    """Run ``command``; returns (seconds until a line containing ``first_line`` appeared, its
    output lines)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO)
    startup, lines = None, []
    for line in proc.stdout:
        lines.append(line)
        if startup is None and first_line in line:
            startup = time.perf_counter() - start
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{''.join(lines[-20:])}")
    return startup, lines


def run_bare(args):
    command = [sys.executable, "benchmarks/bare_simclr_loop.py", f"--iters={args.iters}",
               f"--batch={args.batch}", f"--workers={args.bare_workers}",
               f"--depth={DEPTHS[args.workload]}"]
    startup, lines = timed_process(command, "iter 1 ")
    times = [float(line.split()[2]) for line in lines if line.startswith("iter ")]
    return startup, times


def quickstart_steps() -> tuple:
    """(images per step, steps per epoch) of the SimCLR quickstart, from its config and data."""
    from ssl_engine.config import load_config
    from ssl_engine.data import build_dataset

    _, cfg = load_config(["config=quickstart/simclr_digits"])
    batch = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    return batch, len(build_dataset(cfg, "TRAIN")) // batch


def engine_command(args, overrides, folder: Path):
    if args.workload in DEPTHS:
        base = ["config=benchmark/simclr_resnet50_synthetic",
                f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch}",
                f"config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES={args.batch * args.iters}"]
        if args.workload == "resnet18":
            base += ["config.MODEL.TRUNK.RESNETS.DEPTH=18",
                     "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[512,2048,128],use_relu:true}]]"]
    else:
        # the recipe runs bf16 + channels_last: start every variant from fp32 eager
        base = ["config=quickstart/simclr_digits", "config.HOOKS.FEATURE_REPORT.ENABLED=false",
                "config.MODEL.AMP_PARAMS.USE_AMP=false", "config.MODEL.CHANNELS_LAST=false",
                f"config.OPTIMIZER.num_epochs={-(-args.iters // args.steps_per_epoch)}"]
    return [sys.executable, "tools/run_distributed_engines.py", *base,
            f"config.CHECKPOINT.DIR={folder}", "config.CHECKPOINT.AUTO_RESUME=false",
            "config.CHECKPOINT.CHECKPOINT_FREQUENCY=1000", "config.LOG_FREQUENCY=1", *overrides]


def run_engine(args, overrides, folder: Path):
    startup, _ = timed_process(engine_command(args, overrides, folder), "| iter 1 (")
    records = [json.loads(line) for line in (folder / "metrics.json").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") == "train"]
    # one record per iteration: images of the step / images per second of its window
    times = [1e3 * args.images_per_step / r["images_per_sec"] for r in steps][:args.iters]
    return startup, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=[*DEPTHS, "quickstart"], default="resnet50")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--bare-workers", type=int, default=0,
                        help="data workers of the bare loop (the engine's auto choice on 2 cores)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("overrides", nargs="*", help="config.A.B=v for every engine variant")
    args = parser.parse_args()
    args.images_per_step, args.steps_per_epoch = (
        (args.batch, args.iters) if args.workload in DEPTHS else quickstart_steps())
    names = (["bare fp32"] if args.workload in DEPTHS else []) + args.variants
    times = {name: [] for name in names}
    startups = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for index, name in enumerate(names):
                if name == "bare fp32":
                    startup, per_iter = run_bare(args)
                else:
                    startup, per_iter = run_engine(args, [*args.overrides, *VARIANTS[name]],
                                                   Path(tmp) / f"run{round_index}_{index}")
                times[name] += per_iter[args.warmup:]
                startups[name].append(startup)
                print(f"round {round_index + 1}: {name}: median "
                      f"{statistics.median(per_iter[args.warmup:]):.0f} ms/iter, start-up "
                      f"{startup:.1f} s", flush=True)
    reference = names[0]
    ref_ms = statistics.median(times[reference])
    print(f"\n{args.workload}: median ms/iteration after {args.warmup} warm-up iterations, "
          f"{args.rounds} rounds of {args.iters} iterations; ratio to {reference}")
    print(f"{'variant':<32}{'ms/iter':>9}{'ratio':>8}{'start-up s':>12}")
    for name in names:
        ms = statistics.median(times[name])
        print(f"{name:<32}{ms:>9.0f}{ms / ref_ms:>8.2f}{statistics.median(startups[name]):>12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
