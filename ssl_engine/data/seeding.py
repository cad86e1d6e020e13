"""Per-sample random streams: the augmentation of sample i in epoch e depends on (seed, e, i)."""
import contextlib
import random

import numpy as np
import torch


def sample_seed(seed_value: int, epoch: int, index: int) -> int:
    """A 32-bit seed mixed from the three non-negative integers."""
    return int(np.random.SeedSequence([seed_value, epoch, index]).generate_state(1)[0])


@contextlib.contextmanager
def seeded_rngs(seed: int, keep_all: bool = True):
    """Seed the CPU torch, numpy and python global generators with ``seed`` for the block, then
    put back the states they had before (the caller's random stream is left untouched).
    ``keep_all=False`` puts back torch's state only: for a data-loading worker, where nothing
    draws from numpy's or python's global generators between two samples (the collators seed
    their own), and copying numpy's state out and back (about 70 us) is most of the cost."""
    torch_state = torch.get_rng_state()
    numpy_state = np.random.get_state() if keep_all else None
    python_state = random.getstate() if keep_all else None
    torch.default_generator.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        if keep_all:
            np.random.set_state(numpy_state)
            random.setstate(python_state)
