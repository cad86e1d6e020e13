"""Counter-based random draws for whole batches (DATA.<split>.BATCHED_READS).

Each row of a batch (one view of one sample) gets a 64-bit key mixed from (SEED_VALUE, epoch,
sample index, view); its k-th uniform number is SplitMix64's output for the state
``key + k * golden ratio``. A draw is therefore a pure function of those four integers and of
its place in the row's stream, like the per-sample seeded generators of the per-sample path
(data/seeding.py), but a whole batch is drawn with a few vectorised numpy operations instead of
re-seeding three global generators per sample. The numbers differ from the per-sample path's.
"""
import numpy as np
import torch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 2.0 ** -53


def mix64(values: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on a uint64 array (arithmetic modulo 2**64)."""
    z = values.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= _MUL1
    z ^= z >> np.uint64(27)
    z *= _MUL2
    z ^= z >> np.uint64(31)
    return z


def row_keys(seed: int, epochs, indices, view: int) -> np.ndarray:
    """One key per row: (seed, epoch, index, view) absorbed one after the other."""
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size and indices.min() < 0:
        raise ValueError("sample indices must be non-negative")
    key = np.full(indices.shape, np.uint64(int(seed) % 2 ** 64), dtype=np.uint64)
    for part in (np.broadcast_to(np.asarray(epochs, dtype=np.int64), indices.shape), indices,
                 np.full(indices.shape, int(view), dtype=np.int64)):
        key = mix64(key + _GOLDEN) ^ part.astype(np.uint64)
    return mix64(key)


class CounterDraws:
    """Uniform numbers in [0, 1) for the rows of ``keys``: ``uniform(k)`` is the next ``k``
    numbers of every row's stream, as a float64 [rows, k] tensor."""

    def __init__(self, keys: np.ndarray):
        self.keys = np.asarray(keys, dtype=np.uint64)
        self.used = 0

    def __len__(self) -> int:
        return len(self.keys)

    def uniform(self, k: int = 1, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        counters = np.arange(self.used + 1, self.used + k + 1, dtype=np.uint64) * _GOLDEN
        self.used += k
        bits = mix64(self.keys[:, None] + counters[None, :]) >> np.uint64(11)
        unit = torch.from_numpy(bits.astype(np.float64) * _TO_UNIT)
        return unit if (low, high) == (0.0, 1.0) else low + (high - low) * unit

    def below(self, p: float) -> torch.Tensor:
        """1.0 where the row's next number is under ``p``, else 0.0 ([rows] float64)."""
        return (self.uniform(1)[:, 0] < p).double()

    def integers(self, high: torch.Tensor) -> torch.Tensor:
        """One integer in [0, high) per row (``high``: [rows], at least 1), as float64."""
        return torch.floor(self.uniform(1)[:, 0] * high)

    def permutations(self, n: int) -> torch.Tensor:
        """A uniformly random order of 0..n-1 per row ([rows, n] float64)."""
        return torch.argsort(self.uniform(n), dim=1).double()
