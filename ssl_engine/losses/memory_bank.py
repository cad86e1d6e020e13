"""A memory bank of one embedding per training sample (NPID, PIRL, DeepCluster v2), indexed by
the sample's position in the training set (``DATA.TRAIN.LABEL_TYPE: sample_index``), and the
same on every rank: every rank writes the rows of the whole global batch."""
import math

import torch

from ssl_engine.utils.distributed import gather_from_all

MEMORY_SEED = 0  # the initial memory is the same on every rank and in every run

# splitmix64's constants as signed 64-bit integers (torch's int64 multiplication wraps)
_GOLDEN = -7046029254386353131   # 0x9E3779B97F4A7C15
_MIX1 = -4658895280553007687     # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685     # 0x94D049BB133111EB


def random_memory(size: int, dim: int, normalize: bool) -> torch.Tensor:
    """[size, dim] uniform in +-1/sqrt(dim/3) (unit variance per row), l2-normalised rows
    with ``normalize``; the same for every rank and run."""
    bound = 1.0 / math.sqrt(dim / 3)
    generator = torch.Generator().manual_seed(MEMORY_SEED)
    memory = torch.rand(size, dim, generator=generator) * (2 * bound) - bound
    return torch.nn.functional.normalize(memory, dim=1) if normalize else memory


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def hashed_indices(keys: torch.Tensor, count: int, high: int, salt: int) -> torch.Tensor:
    """[len(keys), count] pseudo-random integers in [0, high), a function of (key, salt, column)
    only (splitmix64's finaliser): a sample's draws do not depend on which rank holds it, its
    place in the batch, or the random state, so a resumed run and any number of processes
    draw the same."""
    x = keys.long()[:, None] * count + torch.arange(count, device=keys.device)[None, :]
    x = (x + torch.full_like(x, int(salt)) * _GOLDEN) * _GOLDEN  # wraps as uint64 would
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    x = x ^ _shift_right(x, 31)
    return _shift_right(x, 1).remainder(high)


def gather_rows(embedding: torch.Tensor, index: torch.Tensor):
    """Every rank's ``embedding`` rows (detached) and sample indices, rank after rank."""
    return gather_from_all(embedding.detach()), gather_from_all(index.long())
