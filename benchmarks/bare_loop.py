"""What the plain-PyTorch reference loops of benchmarks/train_speed.py share
(bare_simclr_loop.py, bare_mae_loop.py, bare_dino_loop.py): their common options, the
engine's synthetic images, and the timed loop that prints ``iter <i> <ms>`` per iteration
(data loading included).  Nothing but torch, numpy and PIL imported."""
import argparse
import time
from typing import Callable, Optional

import numpy as np
import torch
from PIL import Image


def parse_arguments(doc: str, argv=None, add: Optional[Callable] = None) -> argparse.Namespace:
    """``--iters --batch --workers --bf16``, plus what ``add(parser)`` adds."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--iters", type=int, default=25)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 autocast of the forward")
    if add is not None:
        add(parser)
    return parser.parse_args(argv)


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
    milliseconds, the wait for its batch included."""
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True,
                                         num_workers=args.workers, drop_last=True)
    start = time.perf_counter()
    for iteration, batch in enumerate(loader, 1):
        step(batch)
        now = time.perf_counter()
        print(f"iter {iteration} {(now - start) * 1e3:.1f}", flush=True)
        start = now
