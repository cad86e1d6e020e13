#!/usr/bin/env python
"""Training speed of the engine's speed options beside a bare PyTorch loop, end to end.

Every variant is a fresh process started from the command line, so start-up and data loading
are part of what is measured; the variants run one after the other in rounds (every variant
once per round), so that a change of machine load hits all of them alike.

Workloads:
- ``resnet50``: SimCLR, ResNet-50, 2 views of 224x224 of synthetic images, batch 8
  (configs/config/benchmark/simclr_resnet50_synthetic.yaml), against
  benchmarks/bare_simclr_loop.py (torchvision's ResNet-50, eager, same images and
  augmentations) in float32 ("bare fp32") and in bfloat16 autocast with channels_last ("bare
  bf16 + channels_last", the reference of the engine's variants that use bfloat16).
- ``resnet18``: the same with a ResNet-18 trunk (a shorter step, so start-up differences
  stand out).
- ``mae_vit_b16`` / ``mae_vit_s16``: MAE, a ViT-B/16 (or ViT-S/16) encoder on the 49 visible
  patches of 224x224 synthetic crops, a decoder of 8 blocks of width 512, batch 8
  (configs/config/benchmark/mae_vit_synthetic.yaml), against benchmarks/bare_mae_loop.py
  (timm's VisionTransformer and Blocks, eager) in float32 and in bfloat16 autocast (its
  "bare bf16 + channels_last" row: channels_last is not applied to a ViT).
- ``dino_vit_s16`` / ``dino_vit_b16``: DINO multi-crop, the shipped recipe
  configs/config/pretrain/dino/dino_vit_s16.yaml (ViT-S/16; ViT-B/16 by overrides of width,
  heads and head input) on synthetic 256x256 images: 2 global crops of 224 and 10 local crops
  of 96 per image, the DINO head of 65536 outputs, the teacher by EMA, batch 8 (one process
  on the CPU, the recipe's fp16 AMP replaced by the variant's precision), against
  benchmarks/bare_dino_loop.py (timm's VisionTransformer, the head and loss written out,
  eager) in float32 and in bfloat16 autocast.
- ``quickstart``: the SimCLR quickstart (half-width ResNet-18 on 16x16 digits, batch 128),
  its speed settings switched off for the fp32 variant; no bare loop builds that model, so its
  ratios are to the engine in fp32 eager.

The bare loops and the engine load data with the same number of worker processes: the
engine's own choice (``NUM_DATALOADER_WORKERS=auto``) unless ``--workers`` sets both (on a GPU
8 unless ``--workers`` says otherwise).

``--device gpu``: one process on the current GPU.  The engine runs with
``MACHINE.DEVICE=gpu`` and one process (nccl), its "bf16 autocast" variants with
``AMP_ARGS.dtype=bfloat16`` (a GPU's default is float16); the bare loops put model and
batches on the GPU (pinned batches, copies that do not block) and read the clock after
``torch.cuda.synchronize()``.  The engine's per-iteration times come from its log records
(LOG_FREQUENCY=1): each record is written after the step's metrics are read back from the
GPU, which waits for all of the step's queued work, so they are synchronised alike; the
engine runs with HOOKS.PERF_STATS.SYNCHRONIZE_GPU=true, so that its parts count the GPU's
work (five waits a step, which the engine's ms/iteration include and the bare loop's do not).

Per variant: the median time per iteration after the first ``--warmup`` iterations (data
loading included) over every round, its ratio to the bare loop of the same precision and to
bare fp32, and the start-up time (launch to the first iteration's log line; the first
iteration included); then, per engine variant, the step's parts from HOOKS.PERF_STATS (the
last round's metrics.json) and the share of the step spent outside the model: data (the wait
for the batch), loss, optimizer (clipping, update, schedules) and other, over the total.  The
hooks part is not counted in it: with a teacher (DINO) it holds the teacher's forward pass
and its EMA update, model work, beside logging and the other hooks' bookkeeping.

    python benchmarks/train_speed.py
        [--workload resnet50|resnet18|mae_vit_b16|mae_vit_s16|dino_vit_s16|dino_vit_b16|quickstart]
        [--rounds 2] [--iters 20]
        [--workers N] [--device cpu|gpu] [--variants ...] [config.A.B=v ...]
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
BF16 = "+config.MODEL.AMP_PARAMS.AMP_ARGS.dtype=bfloat16"  # on a GPU (its default: float16)
DEPTHS = {"resnet50": 50, "resnet18": 18}  # the SimCLR workloads with a bare loop
# the ViT workloads: their bare loop and its --vit
VITS = {"mae_vit_b16": ("bare_mae_loop.py", "b16"), "mae_vit_s16": ("bare_mae_loop.py", "s16"),
        "dino_vit_s16": ("bare_dino_loop.py", "s16"), "dino_vit_b16": ("bare_dino_loop.py", "b16")}
VIT_S16 = ["config.MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=384",
           "config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=6",
           "config.MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=1536",
           "config.MODEL.HEAD.PARAMS=[[mae_decoder,{in_dim:384,patch_size:16,decoder_dim:512,"
           "depth:8,num_heads:16}]]"]
DINO_B16 = ["config.MODEL.TRUNK.VISION_TRANSFORMERS.HIDDEN_DIM=768",
            "config.MODEL.TRUNK.VISION_TRANSFORMERS.NUM_HEADS=12",
            "config.MODEL.TRUNK.VISION_TRANSFORMERS.MLP_DIM=3072",
            "config.MODEL.HEAD.PARAMS=[[dino_head,{in_dim:768,num_clusters:[65536],"
            "normalize_last_layer:false,num_layers:3,hidden_dim:2048,bottleneck_dim:256}]]"]
# the step's parts outside the model (the hooks part holds a teacher's forward pass)
OUTSIDE_MODEL = ("data", "loss", "optimizer", "other")
BARE = {"bare fp32": [], "bare bf16 + channels_last": ["--bf16", "--channels-last"]}
VARIANTS = {
    "engine fp32": [],
    "engine fp32, malloc defaults": ["config.MACHINE.REUSE_FREED_MEMORY=false"],
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


def reference_of(name: str) -> str:
    """The bare loop a variant is compared with: the one of its precision."""
    if name.startswith("bare"):
        return name
    return "bare bf16 + channels_last" if AMP in VARIANTS[name] else "bare fp32"


def run_bare(args, name: str):
    if args.workload in VITS:  # a ViT: bfloat16 without channels_last
        flags = ["--bf16"] if "--bf16" in BARE[name] else []
        script, vit = VITS[args.workload]
        command = [sys.executable, f"benchmarks/{script}", f"--iters={args.iters}",
                   f"--batch={args.batch}", f"--workers={args.bare_workers}", f"--vit={vit}",
                   f"--device={args.device}", *flags]
    else:
        command = [sys.executable, "benchmarks/bare_simclr_loop.py", f"--iters={args.iters}",
                   f"--batch={args.batch}", f"--workers={args.bare_workers}",
                   f"--depth={DEPTHS[args.workload]}", f"--device={args.device}", *BARE[name]]
    startup, lines = timed_process(command, "iter 1 ")
    times = [float(line.split()[2]) for line in lines if line.startswith("iter ")]
    return startup, times


def quickstart_steps() -> tuple:
    """(images per step, steps per epoch) of the SimCLR quickstart, from its config and data."""
    import ssl_engine.losses  # noqa: F401  (the losses' derived settings and key rules)
    import ssl_engine.models  # noqa: F401  (the trunks')
    from ssl_engine.config import load_config
    from ssl_engine.data import build_dataset

    _, cfg = load_config(["config=quickstart/simclr_digits"])
    batch = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    return batch, len(build_dataset(cfg, "TRAIN")) // batch


def engine_command(args, overrides, folder: Path):
    if args.workload.startswith("dino"):
        base = ["config=pretrain/dino/dino_vit_s16", "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
                'config.DATA.TRAIN.DATA_PATHS=[""]', "config.DATA.TRAIN.SYNTHETIC.IMAGE_SIZE=256",
                f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch}",
                f"config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES={args.batch * args.iters}",
                "config.DISTRIBUTED.NUM_NODES=1", "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
                "config.MODEL.AMP_PARAMS.USE_AMP=false", "config.OPTIMIZER.num_epochs=1",
                *(DINO_B16 if args.workload == "dino_vit_b16" else [])]
    elif args.workload in VITS:
        base = ["config=benchmark/mae_vit_synthetic",
                f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch}",
                f"config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES={args.batch * args.iters}",
                *(VIT_S16 if args.workload == "mae_vit_s16" else [])]
    elif args.workload in DEPTHS:
        base = ["config=benchmark/simclr_resnet50_synthetic",
                f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={args.batch}",
                f"config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES={args.batch * args.iters}"]
        if args.workload == "resnet18":
            base += ["config.MODEL.TRUNK.RESNETS.DEPTH=18",
                     "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[512,2048,128],use_relu:true}]]"]
    else:
        # the recipe runs bf16 + channels_last: start every variant from fp32 eager
        base = ["config=quickstart/simclr_digits", "config.HOOKS.FEATURE_REPORT.ENABLED=false",
                "config.HOOKS.ONLINE_LINEAR_PROBE.ENABLED=false",
                "config.MODEL.AMP_PARAMS.USE_AMP=false", "config.MODEL.CHANNELS_LAST=false",
                f"config.OPTIMIZER.num_epochs={-(-args.iters // args.steps_per_epoch)}"]
    if args.workers is not None:
        base.append(f"config.DATA.NUM_DATALOADER_WORKERS={args.workers}")
    on_gpu = args.device == "gpu"
    base += [f"config.MACHINE.DEVICE={args.device}",
             f"config.DISTRIBUTED.BACKEND={'nccl' if on_gpu else 'gloo'}"]
    if on_gpu:  # each part of the step counts the GPU's work queued in it
        base.append("config.HOOKS.PERF_STATS.SYNCHRONIZE_GPU=true")
    if on_gpu and AMP in overrides:  # the variant's bfloat16, not the GPU's float16 default
        overrides = [*overrides, BF16]
    return [sys.executable, "tools/run_distributed_engines.py", *base,
            f"config.CHECKPOINT.DIR={folder}", "config.CHECKPOINT.AUTO_RESUME=false",
            "config.CHECKPOINT.CHECKPOINT_FREQUENCY=1000", "config.LOG_FREQUENCY=1",
            "config.HOOKS.RUN_REPORT.ENABLED=false", *overrides]  # the steps, not the report


def run_engine(args, overrides, folder: Path):
    startup, _ = timed_process(engine_command(args, overrides, folder), "| iter 1 (")
    records = [json.loads(line) for line in (folder / "metrics.json").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") == "train" and "images_per_sec" in r]
    # one record per iteration: images of the step / images per second of its window
    times = [1e3 * args.images_per_step / r["images_per_sec"] for r in steps][:args.iters]
    parts = [r["step_time_ms"] for r in records if r.get("scope") == "run"]
    return startup, times, parts[-1] if parts else {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=[*DEPTHS, *VITS, "quickstart"],
                        default="resnet50")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None,
                        help="data-loading workers of every variant (default: the engine's "
                        "auto choice for this machine, given to the bare loops too; 8 on gpu)")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                        help="gpu: one process on the current GPU, both sides")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("overrides", nargs="*", help="config.A.B=v for every engine variant")
    args = parser.parse_args(argv)
    if args.device == "gpu" and args.workers is None:
        args.workers = 8
    args.bare_workers = args.workers if args.workers is not None else auto_workers()
    args.images_per_step, args.steps_per_epoch = (
        (args.batch, args.iters) if args.workload in {**DEPTHS, **VITS}
        else quickstart_steps())
    bare = [name for name in BARE if args.workload in {**DEPTHS, **VITS} and
            any(reference_of(variant) == name for variant in args.variants)]
    names = bare + args.variants
    times = {name: [] for name in names}
    startups = {name: [] for name in names}
    parts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_index in range(args.rounds):
            for index, name in enumerate(names):
                if name in BARE:
                    startup, per_iter = run_bare(args, name)
                else:
                    startup, per_iter, parts[name] = run_engine(
                        args, [*args.overrides, *VARIANTS[name]],
                        Path(tmp) / f"run{round_index}_{index}")
                times[name] += per_iter[args.warmup:]
                startups[name].append(startup)
                print(f"round {round_index + 1}: {name}: median "
                      f"{statistics.median(per_iter[args.warmup:]):.0f} ms/iter, start-up "
                      f"{startup:.1f} s", flush=True)
    workers = (f"{args.workers}" if args.workers is not None
               else f"auto ({args.bare_workers} on this machine)")
    print(f"\n{args.workload} on {args.device}: median ms/iteration after {args.warmup} "
          "warm-up iterations, "
          f"{args.rounds} round(s) of {args.iters} iterations; data-loading workers: {workers} "
          "for every variant")
    ms = {name: statistics.median(times[name]) for name in names}
    if bare:
        print(f"{'variant':<32}{'ms/iter':>9}{'ratio to bare':>15}{'to bare fp32':>14}"
              f"{'start-up s':>12}")
        for name in names:
            reference = reference_of(name)
            to_fp32 = f"{ms[name] / ms['bare fp32']:>14.2f}" if "bare fp32" in ms else f"{'-':>14}"
            print(f"{name:<32}{ms[name]:>9.0f}{ms[name] / ms[reference]:>15.2f}{to_fp32}"
                  f"{statistics.median(startups[name]):>12.1f}")
    else:  # no bare loop builds the quickstart's model: ratios to the first engine variant
        reference = names[0]
        print(f"{'variant':<32}{'ms/iter':>9}{'ratio to ' + reference:>26}{'start-up s':>12}")
        for name in names:
            print(f"{name:<32}{ms[name]:>9.0f}{ms[name] / ms[reference]:>26.2f}"
                  f"{statistics.median(startups[name]):>12.1f}")
    if parts:
        print("\nthe engine's step, mean ms per training iteration of the last round "
              "(HOOKS.PERF_STATS; the first iterations included); outside the model: "
              f"{' + '.join(OUTSIDE_MODEL)} over the total (hooks apart: a teacher's forward "
              "pass and EMA update run in them)")
        for name, means in parts.items():
            outside = sum(means.get(part, 0.0) for part in OUTSIDE_MODEL)
            print(f"{name:<32}" + ", ".join(f"{part} {value:.0f}" for part, value in means.items())
                  + f"; outside the model {100 * outside / means['total']:.1f}%, hooks "
                  f"{100 * means.get('hooks', 0.0) / means['total']:.1f}%")
    return 0


def auto_workers() -> int:
    """The engine's NUM_DATALOADER_WORKERS=auto for one CPU process on this machine."""
    from ssl_engine.utils.cpu_budget import auto_workers as workers_for, cores_per_process

    return workers_for(cores_per_process(1), "cpu")


if __name__ == "__main__":
    sys.exit(main())
