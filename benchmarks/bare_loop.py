"""What the plain-PyTorch reference loops of benchmarks/train_speed.py share
(bare_simclr_loop.py, bare_mae_loop.py, bare_dino_loop.py): their common options, the
engine's synthetic images, and the timed loop that prints ``iter <i> <ms>`` per iteration
(data loading included), then ``data <ms>``, the wait for the batch.  ``--device gpu``: the model and the batches on the current CUDA
device (batches pinned by the loader, copied without blocking), and every iteration's clock
read after ``torch.cuda.synchronize()``.  Nothing but torch, numpy and PIL imported."""
import argparse
import time
from typing import Callable, Optional

import numpy as np
import torch
from PIL import Image


def parse_arguments(doc: str, argv=None, add: Optional[Callable] = None) -> argparse.Namespace:
    """``--iters --batch --workers --bf16 --device``, plus what ``add(parser)`` adds;
    ``args.device`` becomes the torch.device."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--iters", type=int, default=25)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast of the forward")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    if add is not None:
        add(parser)
    args = parser.parse_args(argv)
    args.device = torch.device("cuda" if args.device == "gpu" else "cpu")
    return args


def to_device(batch, device: torch.device):
    """``batch`` (a tensor, or a tuple or list of them) on ``device``; from pinned memory the
    copy to a GPU does not block."""
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(item, device) for item in batch)
    return batch.to(device, non_blocking=device.type == "cuda")


def synchronize(device: torch.device) -> None:
    """Waits for the GPU's queued work (nothing on a CPU), before a clock is read."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SyntheticImages(torch.utils.data.Dataset):
    """Image i: uniform noise from ``default_rng([0, i])`` (the engine's synthetic source),
    given to ``augment`` (which returns one view, or a tuple or list of views)."""

    def __init__(self, count: int, size: int, augment: Callable):
        self.count, self.size, self.augment = count, size, augment

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        rng = np.random.default_rng([0, index])
        image = Image.fromarray(rng.integers(0, 256, (self.size, self.size, 3), dtype=np.uint8))
        return self.augment(image)


def timed_loop(args: argparse.Namespace, dataset: torch.utils.data.Dataset,
               step: Callable) -> None:
    """``step(batch)`` on every batch of ``dataset`` (``args.batch`` images, shuffled, the last
    partial batch dropped, ``args.workers`` loading processes); prints each iteration's
    milliseconds, the wait for its batch included.  ``step`` gets the batch on
    ``args.device``; on a GPU each iteration ends when the GPU has finished its work."""
    on_gpu = args.device.type == "cuda"
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True,
                                         num_workers=args.workers, drop_last=True,
                                         pin_memory=on_gpu)
    synchronize(args.device)
    start = time.perf_counter()
    batches = iter(loader)
    for iteration in range(1, len(loader) + 1):
        batch = next(batches)
        waited = time.perf_counter() - start
        step(to_device(batch, args.device))
        synchronize(args.device)
        now = time.perf_counter()
        print(f"iter {iteration} {(now - start) * 1e3:.1f} data {waited * 1e3:.1f}", flush=True)
        start = now
