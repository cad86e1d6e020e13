#!/usr/bin/env python
"""Memory per process of the scaling options, side by side in one run, on the SimCLR ResNet-50
model (pretrain/simclr/simclr_resnet50, SGD with momentum):

1. Bytes each of 2 gloo processes holds in parameters, gradients and optimizer state after
   one training step, with DDP (a full replica each), ZeRO (OPTIMIZER.use_zero: the optimizer
   state sharded) and FSDP (self_supervision_fsdp_task: all three sharded).
2. Peak memory of one training step of one process (forward + backward) with and without
   MODEL.ACTIVATION_CHECKPOINTING, each in a fresh process: the peak resident memory during
   the step above the resident memory before it, sampled every millisecond.

Ends with one line per target (ZeRO optimizer state <= 0.55x DDP's; FSDP parameters +
gradients + optimizer state <= 0.55x DDP's; activation checkpointing peak <= 0.7x without),
saying OK or MISSED with the measured ratio.

    python benchmarks/scale_memory.py [--batch 2] [--image-size 64]
        [--ckpt-batch 16] [--ckpt-image-size 128] [--splits 2] [--ckpt-rounds 2]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CONFIG = ["config=pretrain/simclr/simclr_resnet50", "config.MACHINE.DEVICE=cpu",
          "config.DISTRIBUTED.BACKEND=gloo", "config.OPTIMIZER.use_larc=false",
          "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=false",
          "config.MODEL.AMP_PARAMS.USE_AMP=false", "config.MODEL.CHANNELS_LAST=false"]
MODES = ("ddp", "zero", "fsdp")


def local_bytes(tensors) -> int:
    total = 0
    for tensor in tensors:
        if tensor is None or not torch.is_tensor(tensor):
            continue
        tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += tensor.numel() * tensor.element_size()
    return total


def optimizer_state_bytes(optimizer) -> int:
    from ssl_engine.optimizers.ssl_optimizer import sharded_optimizer

    torch_optimizer = optimizer.classy_optimizer.optimizer
    oss = sharded_optimizer(torch_optimizer)
    state = (oss.optim if oss is not None else torch_optimizer).state
    return local_bytes(value for entry in state.values() for value in entry.values())


def step(model, optimizer, batch: int, size: int) -> None:
    images = torch.randn(2 * batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    outputs = model(images)
    sum(output.float().square().mean() for output in outputs).backward()
    optimizer.step(where=0.0)


def ranks_main(rank: int, world: int, port: int, args, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch.nn.parallel import DistributedDataParallel

    import ssl_engine.losses  # noqa: F401  (the losses' derived settings and key rules)
    from ssl_engine.config import load_config
    from ssl_engine.models import build_model
    from ssl_engine.optimizers import build_optimizer
    from ssl_engine.trainer.fsdp_task import shard_model

    _, cfg = load_config(CONFIG)
    for mode in MODES:
        torch.manual_seed(0)
        model = build_model(cfg.MODEL).train()
        if mode == "fsdp":
            wrapped = shard_model(model)
        else:
            wrapped = DistributedDataParallel(model)
        optimizer_cfg = dict(cfg.OPTIMIZER, use_zero=mode == "zero")
        optimizer = build_optimizer(optimizer_cfg, model)
        step(wrapped, optimizer, args.batch, args.image_size)
        row = {"params": local_bytes(model.parameters()),
               "grads": local_bytes(p.grad for p in model.parameters()),
               "optimizer": optimizer_state_bytes(optimizer)}
        gathered = [None] * world
        dist.all_gather_object(gathered, row)
        if rank == 0:  # the largest rank's share
            results[mode] = {key: max(r[key] for r in gathered) for key in row}
        del wrapped, model, optimizer
    # both ranks done with every collective before either tears the group down (a rank that
    # destroyed it while the other still used it ended once with gloo's 'terminate called')
    dist.barrier()
    dist.destroy_process_group()


def checkpointing_peak(use: bool, args) -> int:
    """Peak resident bytes of one step above the bytes before it, in a fresh process."""
    code = f"""
import json, threading, time, torch
import ssl_engine.losses  # the losses' derived settings and key rules
from ssl_engine.config import load_config
from ssl_engine.models import build_model
torch.set_num_threads(2)
_, cfg = load_config({CONFIG!r} + [
    "config.MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING={str(use).lower()}",
    "config.MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS={args.splits}"])
torch.manual_seed(0)
model = build_model(cfg.MODEL).train()
images = torch.randn({2 * args.ckpt_batch}, 3, {args.ckpt_image_size}, {args.ckpt_image_size})
page = __import__("os").sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
base = rss(); peak = [base]; done = [False]
def sample():
    while not done[0]:
        peak[0] = max(peak[0], rss()); time.sleep(0.001)
thread = threading.Thread(target=sample); thread.start()
sum(o.square().mean() for o in model(images)).backward()
done[0] = True; thread.join()
print(json.dumps({{"peak": peak[0] - base}}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode != 0:  # the child's own error, not only its exit status
        raise RuntimeError(f"checkpointing={use} child failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["peak"]


def mib(value: int) -> str:
    return f"{value / 2 ** 20:8.1f} MiB"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=2, help="images per rank (2 views each)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--ckpt-batch", type=int, default=16)
    parser.add_argument("--ckpt-image-size", type=int, default=128)
    parser.add_argument("--splits", type=int, default=2)
    parser.add_argument("--ckpt-rounds", type=int, default=2,
                        help="fresh processes each with and without checkpointing (lowest peak)")
    parser.add_argument("--port", type=int, default=29561)
    args = parser.parse_args(argv)

    results = mp.Manager().dict()
    mp.spawn(ranks_main, args=(2, args.port, args, results), nprocs=2)
    print("bytes per rank after one step, 2 gloo processes, ResNet-50 + SimCLR head, SGD "
          "with momentum")
    print(f"{'':6s} {'parameters':>14s} {'gradients':>14s} {'optimizer':>14s} {'total':>14s}")
    totals = {}
    for mode in MODES:
        row = results[mode]
        totals[mode] = sum(row.values())
        print(f"{mode:6s} {mib(row['params']):>14s} {mib(row['grads']):>14s} "
              f"{mib(row['optimizer']):>14s} {mib(totals[mode]):>14s}")

    peaks = {}
    for use in (False, True) * args.ckpt_rounds:  # interleaved; the lowest run of each
        peaks[use] = min(peaks.get(use, float("inf")), checkpointing_peak(use, args))
    print(f"\npeak of one step (forward + backward), 1 process, batch {2 * args.ckpt_batch} of "
          f"{args.ckpt_image_size}px: without checkpointing {mib(peaks[False])}, with "
          f"({args.splits} segments per stage) {mib(peaks[True])}")

    targets = [
        ("ZeRO optimizer state per rank <= 0.55x DDP's",
         results["zero"]["optimizer"] / results["ddp"]["optimizer"], 0.55),
        ("FSDP parameters + gradients + optimizer state per rank <= 0.55x DDP's",
         totals["fsdp"] / totals["ddp"], 0.55),
        ("activation checkpointing peak <= 0.7x without", peaks[True] / peaks[False], 0.7),
    ]
    print()
    for name, ratio, limit in targets:
        print(f"{'OK' if ratio <= limit else 'MISSED':6s} {name}: {ratio:.3f}x")


if __name__ == "__main__":
    main()
