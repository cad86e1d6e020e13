#!/usr/bin/env python
"""The engine against bare PyTorch loops on one GPU, in one table (benchmarks/gpu_suite.sh).

Workloads (the engine's side as benchmarks/train_speed.py builds it, the bare side its loop):
- ``simclr_r50``: SimCLR, ResNet-50, 2 views of 224 of synthetic images, augmented on the CPU
  by the loader's workers (benchmarks/bare_simclr_loop.py);
  ``engine, device aug``: the same with DATA.TRAIN.DEVICE_AUGMENTATION (the photometric tail
  batched on the device), compared with the same bare loop (augmenting on the CPU);
- ``dino_vit_s16``: DINO multi-crop ViT-S/16, 2 x 224 + 10 x 96 crops, the shipped recipe
  (benchmarks/bare_dino_loop.py);
- ``mae_vit_b16``: MAE ViT-B/16, 75% of the patches masked (benchmarks/bare_mae_loop.py).

Each in float32 and in bfloat16 autocast (ResNet: with channels_last, both sides), bare and
engine, one after the other in this process (the engine as ``launch_distributed`` runs it with
one process; no start-up is timed). Columns: median ms per iteration after ``--warmup``
iterations (data loading included; the bare loop reads its clock after
``torch.cuda.synchronize()``, the engine after its log line read the step's values back), its
ratio to the bare loop of the same precision, images/s, MFU (the FLOPs of one iteration as the
engine's FlopCounterMode counted them, over the time and the GPU's dense peak of
ssl_engine/utils/peak_flops.py; the bare loop's with the engine's count of the same
workload), the share of the iteration spent waiting for the batch, and the peak GPU memory
allocated (``torch.cuda.max_memory_allocated``). ``--budget`` seconds: workloads that would
start after it are skipped. ``--tiny``: tiny images and networks, for the CPU smoke test.

    python benchmarks/gpu_suite.py [--device gpu|cpu] [--tiny] [--iters 12] [--warmup 4]
        [--workers 8] [--budget 420] [--workloads simclr_r50 dino_vit_s16 mae_vit_b16]
"""
import argparse
import contextlib
import gc
import importlib
import io
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import torch

import ssl_engine.losses  # noqa: F401  (the losses' derived settings and key rules)
import ssl_engine.models  # noqa: F401
import train_speed
from ssl_engine.config import load_config
from ssl_engine.engines.launcher import launch_distributed
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.utils.peak_flops import peak_tflops

# workload -> (train_speed's workload, bare loop module, its arguments, images per step)
WORKLOADS = {
    "simclr_r50": ("resnet50", "bare_simclr_loop", ["--depth=50"], 64),
    "dino_vit_s16": ("dino_vit_s16", "bare_dino_loop", ["--vit=s16"], 64),
    "mae_vit_b16": ("mae_vit_b16", "bare_mae_loop", ["--vit=b16"], 64),
}
# --tiny: the bare loops' and the engine's small sizes (the engine's applied to its config)
TINY_BARE = {"simclr_r50": ["--depth=18", "--size=32"],
             "dino_vit_s16": ["--vit=tiny", "--sizes", "32", "16", "--local-crops=2",
                              "--out-dim=64"],
             "mae_vit_b16": ["--vit=tiny", "--image-size=32"]}
# DATA.TRAIN.DEVICE_AUGMENTATION (another data option of the engine): its row where it exists
DEVICE_AUG = "config.DATA.TRAIN.DEVICE_AUGMENTATION=true"
PRECISIONS = {"fp32": ([], []), "bf16": (["--bf16"], [train_speed.AMP])}
CHANNELS_LAST = (["--channels-last"], [train_speed.CL])  # the ResNet's bf16 rows


@dataclass
class Row:
    workload: str
    side: str  # "bare", "engine" or "engine, device aug"
    precision: str
    times_ms: List[float] = field(default_factory=list)
    data_ms: List[float] = field(default_factory=list)
    peak_mib: Optional[float] = None
    flops: Optional[float] = None  # per iteration (the engine's count)
    error: str = ""

    @property
    def ms(self) -> float:
        return statistics.median(self.times_ms) if self.times_ms else float("nan")

    @property
    def data_share(self) -> float:
        return sum(self.data_ms) / sum(self.times_ms) if self.times_ms else float("nan")


def device_has_device_augmentation() -> bool:
    """Whether the engine has DATA.TRAIN.DEVICE_AUGMENTATION (added by another change)."""
    _, cfg = load_config(["config=benchmark/simclr_resnet50_synthetic"])
    return "DEVICE_AUGMENTATION" in cfg.DATA.TRAIN


@contextlib.contextmanager
def measured(row: Row, device: torch.device):
    """Peak GPU memory of what runs inside; an error is kept in the row, not raised."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    try:
        yield
    except Exception as error:  # one failing row must not lose the others
        row.error = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
    if device.type == "cuda":
        row.peak_mib = torch.cuda.max_memory_allocated(device) / 2**20


def run_bare(args, workload: str, precision: str, row: Row) -> None:
    _, module, extra, batch = WORKLOADS[workload]
    flags = PRECISIONS[precision][0]
    if precision == "bf16" and workload == "simclr_r50":
        flags = flags + CHANNELS_LAST[0]
    sizes = TINY_BARE[workload] if args.tiny else extra
    argv = [f"--iters={args.iters}", f"--batch={args.batch or batch}", f"--workers={args.workers}",
            f"--device={args.device}", *sizes, *flags]
    out = io.StringIO()
    with measured(row, args.torch_device), contextlib.redirect_stdout(out):
        importlib.import_module(module).main(argv)
    for line in out.getvalue().splitlines():
        if line.startswith("iter "):
            _, iteration, ms, _, data = line.split()
            if int(iteration) > args.warmup:
                row.times_ms.append(float(ms))
                row.data_ms.append(float(data))


def tiny_config(cfg) -> None:
    """Small crops and networks for the CPU smoke test, edited into the composed config."""
    for transform in cfg.DATA.TRAIN.TRANSFORMS:
        if "size" in transform:
            transform["size"] = 32
        if "size_crops" in transform:
            transform["size_crops"] = [32, 16]
        if transform.get("name") == "RandomPatchMasking":
            transform["patch_size"] = 8
    trunk = cfg.MODEL.TRUNK
    trunk.RESNETS.DEPTH, trunk.RESNETS.WIDTH_MULTIPLIER = 18, 0.25
    vit = trunk.VISION_TRANSFORMERS
    vit.update({"name": None, "IMAGE_SIZE": 32, "PATCH_SIZE": 8, "NUM_LAYERS": 2,
                "NUM_HEADS": 2, "HIDDEN_DIM": 32, "MLP_DIM": 64})
    head = cfg.MODEL.HEAD.PARAMS[0][1]
    width = 32 if trunk.NAME == "vision_transformer" else 128
    if "dims" in head:
        head["dims"][0] = width
    else:
        head["in_dim"] = width
    if "mae_loss" in cfg.LOSS:  # its patches: the decoder's
        cfg.LOSS.mae_loss["patch_size"] = 8
    for key, small in (("patch_size", 8), ("decoder_dim", 32), ("depth", 1), ("num_heads", 2),
                       ("hidden_dim", 64), ("bottleneck_dim", 16)):
        if key in head and key != "dims":
            head[key] = small


def engine_overrides(args, workload: str, precision: str, device_aug: bool) -> List[str]:
    """train_speed's command line of the workload, as overrides for ``load_config``."""
    name, _, _, batch = WORKLOADS[workload]
    speed = argparse.Namespace(workload=name, batch=args.batch or batch, iters=args.iters,
                               workers=args.workers, device=args.device)
    extra = list(PRECISIONS[precision][1])
    if precision == "bf16" and workload == "simclr_r50":
        extra += CHANNELS_LAST[1]
    command = train_speed.engine_command(speed, extra + ([DEVICE_AUG] if device_aug else []),
                                         Path("unused"))
    # no synchronisation per part of the step: the suite times whole iterations
    return [item for item in command[2:] if "SYNCHRONIZE_GPU" not in item
            and not item.startswith("config.CHECKPOINT.DIR=")]


def run_engine(args, workload: str, precision: str, row: Row, device_aug: bool) -> None:
    with tempfile.TemporaryDirectory() as folder, measured(row, args.torch_device):
        overrides = engine_overrides(args, workload, precision, device_aug)
        engine_name, cfg = load_config([*overrides, f"config.CHECKPOINT.DIR={folder}",
                                        "config.CHECKPOINT.CHECKPOINT_FREQUENCY=1000"])
        if args.tiny:
            tiny_config(cfg)
        check_before_launch(engine_name, cfg)
        launch_distributed(cfg, engine_name)
        rows = [json.loads(line) for line in (Path(folder) / "metrics.json").open()]
        steps = [r for r in rows if r.get("phase") == "train" and "iteration_seconds" in r]
        for record in steps[args.warmup:]:
            row.times_ms.append(1e3 * record["iteration_seconds"])
            row.data_ms.append(1e3 * record["data_time"])
        counted = [r["flops_per_iteration"] for r in rows if "flops_per_iteration" in r]
        row.flops = counted[0] if counted else None


def table(rows: List[Row], args) -> str:
    """The suite's table: one line per row, bare and engine of each workload and precision."""
    bare = {(r.workload, r.precision): r for r in rows if r.side == "bare"}
    flops = {(r.workload, r.precision): r.flops for r in rows if r.flops}
    dtypes = {"fp32": None, "bf16": torch.bfloat16}
    lines = [f"{'workload':<14}{'side':<20}{'prec':<6}{'ms/iter':>9}{'ratio':>7}{'img/s':>9}"
             f"{'MFU':>8}{'data':>7}{'peak MiB':>10}"]
    for row in rows:
        if row.error:
            lines.append(f"{row.workload:<14}{row.side:<20}{row.precision:<6} failed: {row.error}")
            continue
        reference = bare.get((row.workload, row.precision))
        ratio = row.ms / reference.ms if reference and reference.times_ms else float("nan")
        batch = args.batch or WORKLOADS[row.workload][3]
        peak = peak_tflops(args.torch_device, dtypes[row.precision])
        count = flops.get((row.workload, row.precision))
        mfu = (f"{100 * count / (row.ms / 1e3) / (peak * 1e12):.1f}%" if peak and count
               else "-")
        memory = f"{row.peak_mib:.0f}" if row.peak_mib is not None else "-"
        lines.append(f"{row.workload:<14}{row.side:<20}{row.precision:<6}{row.ms:>9.1f}"
                     f"{ratio:>7.2f}{batch / (row.ms / 1e3):>9.1f}{mfu:>8}"
                     f"{100 * row.data_share:>6.1f}%{memory:>10}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: the CPU smoke test")
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None, help="images per step (default: "
                        "64 each)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--budget", type=float, default=420.0, help="seconds")
    parser.add_argument("--out", default=None, help="also write the table to this file")
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS),
                        choices=list(WORKLOADS))
    args = parser.parse_args(argv)
    args.torch_device = torch.device("cuda" if args.device == "gpu" else "cpu")
    start, rows = time.perf_counter(), []
    with_device_aug = device_has_device_augmentation()
    for workload in args.workloads:
        if time.perf_counter() - start > args.budget:
            print(f"{workload}: skipped, the {args.budget:.0f} s budget is spent", flush=True)
            continue
        for precision in PRECISIONS:
            sides = ["bare", "engine"] + (["engine, device aug"]
                                          if workload == "simclr_r50" and with_device_aug else [])
            for side in sides:
                row = Row(workload, side, precision)
                began = time.perf_counter()
                if side == "bare":
                    run_bare(args, workload, precision, row)
                else:
                    run_engine(args, workload, precision, row, side.endswith("device aug"))
                rows.append(row)
                print(f"{workload} {side} {precision}: {row.ms:.1f} ms/iter "
                      f"({time.perf_counter() - began:.0f} s){' ' + row.error if row.error else ''}",
                      flush=True)
    device = torch.cuda.get_device_name() if args.torch_device.type == "cuda" else "CPU"
    text = (f"{device}, torch {torch.__version__}: median of {args.iters - args.warmup} "
            f"iterations after {args.warmup}, {args.workers} loading workers; ratio: to the bare "
            f"loop of the same precision; data: share of the iteration waiting for the batch; "
            f"total {time.perf_counter() - start:.0f} s\n{table(rows, args)}")
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 1 if any(row.error for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
