#!/usr/bin/env python
"""Overhead of the engine's train loop over a bare PyTorch loop, measured side by side.

Both loops train the same model (same initial weights), loss and optimizer settings on the
same pre-made batches, in this one process. The engine loop is the trainer's phase loop:
the registered ``standard_train_step`` (hook calls, NaN check, meters, classy optimizer with
its lr schedule) plus the default hooks (progress log and metrics.json every LOG_FREQUENCY
iterations, checkpoint hook). The bare loop is forward, loss, zero_grad, backward, step.
Rounds alternate between the two so that machine load affects both alike; the ratio of the
median time per step is printed, and that of the best round, which is the steadier figure
on a loaded machine (target: at most 1.05 on CPU).

    python benchmarks/train_step_overhead.py [--steps 20] [--rounds 5] [--batch 32]
"""
import argparse
import copy
import statistics
import tempfile
import time

import torch

from ssl_engine.config import load_config
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.trainer import SelfSupervisionTrainer


def make_engine_task(batch: int, image: int, out_dir: str, steps: int = 20):
    _, cfg = load_config([
        "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={out_dir}",
        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={batch}",
        "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.25",
        "config.MODEL.HEAD.PARAMS=[[mlp, {dims: [128, 128, 32], use_relu: true}]]",
        "config.LOSS.simclr_info_nce_loss.buffer_params.embedding_dim=32",
        "config.OPTIMIZER.param_schedulers.lr.name=constant",
        "config.OPTIMIZER.param_schedulers.lr.value=0.05",
        "config.OPTIMIZER.regularize_bn=true",
        "config.LOG_FREQUENCY=10",
        f"config.DATA.TRAIN.SYNTHETIC.IMAGE_SIZE={image}",
        f"config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES={batch * steps}",
        "config.DATA.NUM_DATALOADER_WORKERS=0",
    ])
    trainer = SelfSupervisionTrainer(cfg, f"file://{out_dir}/rendezvous",
                                     hooks=default_hook_generator(cfg))
    task = trainer.task
    task.prepare()
    task.on_start()
    task.advance_phase()
    task.on_phase_start()
    return trainer, cfg


def make_batches(task, count: int):
    """``count`` batches of the task's loader (the same epoch again when it has fewer)."""
    loader_iter = task.data_iterator
    batches = []
    while len(batches) < count:
        try:
            batches.append(next(loader_iter))
        except StopIteration:
            task.phase_idx -= 1  # same epoch again, to have enough batches
            task.train_phase_idx -= 1
            task.advance_phase()
            loader_iter = task.data_iterator
    return batches


def time_engine(trainer, batches) -> float:
    """Seconds per step of the trainer's phase loop over ``batches``."""
    task = trainer.task
    task.data_iterator = iter(batches)
    task.iteration_num_in_phase = 0
    task.num_iters_in_phase = len(batches)
    start = time.perf_counter()
    trainer.run_phase(task)
    return (time.perf_counter() - start) / len(batches)


def time_bare(model, loss_fn, optimizer, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        output = model(batch["input"])
        loss = loss_fn(output, batch["target"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / len(batches)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=32)
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    own_group = not torch.distributed.is_initialized()
    with tempfile.TemporaryDirectory() as out_dir:
        trainer, cfg = make_engine_task(args.batch, args.image, out_dir, args.steps)
        task = trainer.task
        batches = make_batches(task, args.steps)
        model = copy.deepcopy(task.base_model)
        loss_fn = copy.deepcopy(task.loss)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=cfg.OPTIMIZER.momentum,
                                    weight_decay=cfg.OPTIMIZER.weight_decay)
        model.train()
        time_bare(model, loss_fn, optimizer, batches[:3])  # warm-up both paths
        time_engine(trainer, batches[:3])
        bare, engine = [], []
        for _ in range(args.rounds):
            bare.append(time_bare(model, loss_fn, optimizer, batches))
            engine.append(time_engine(trainer, batches))
        trainer.task.release_loaders()
        if own_group:
            torch.distributed.destroy_process_group()

    bare_ms, engine_ms = statistics.median(bare) * 1e3, statistics.median(engine) * 1e3
    print(f"model: resnet18 x0.25, SimCLR, batch {args.batch} x 2 views of "
          f"{args.image}x{args.image}, {args.steps} steps x {args.rounds} rounds, "
          f"{torch.get_num_threads()} threads")
    print(f"{'loop':<8}{'median ms/step':>16}{'min ms/step':>14}")
    print(f"{'bare':<8}{bare_ms:>16.2f}{min(bare) * 1e3:>14.2f}")
    print(f"{'engine':<8}{engine_ms:>16.2f}{min(engine) * 1e3:>14.2f}")
    print(f"engine/bare ratio: median {engine_ms / bare_ms:.3f}, "
          f"best round {min(engine) / min(bare):.3f}  (target <= 1.05)")


if __name__ == "__main__":
    main()
