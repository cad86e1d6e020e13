"""Per-sample random streams: the augmentation of sample i in epoch e depends on (seed, e, i)."""
import contextlib
import random

import numpy as np
import torch


def sample_seed(seed_value: int, epoch: int, index: int) -> int:
    """A 32-bit seed mixed from the three non-negative integers."""
    return int(np.random.SeedSequence([seed_value, epoch, index]).generate_state(1)[0])


@contextlib.contextmanager
def seeded_rngs(seed: int):
    """Seed the CPU torch, numpy and python global generators with ``seed`` for the block, then
    put back the states they had before (the caller's random stream is left untouched)."""
    torch_state = torch.get_rng_state()
    numpy_state = np.random.get_state()
    python_state = random.getstate()
    torch.default_generator.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        np.random.set_state(numpy_state)
        random.setstate(python_state)
