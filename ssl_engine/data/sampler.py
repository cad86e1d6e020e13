"""A distributed sampler that can start in the middle of an epoch."""
import math
from typing import Iterator, Optional

import torch
from torch.utils.data import Sampler

from ssl_engine.utils.distributed import get_rank, get_world_size


class StatefulDistributedSampler(Sampler[int]):
    """Every rank draws the same permutation of ``range(dataset_size)`` (seeded with
    ``seed + epoch``), padded with its own start to a multiple of the world size (or, with
    ``drop_last``, cut to one); rank r takes ``indices[r::world_size]``. So batch t of the ranks
    together is batch t of one process whose batch is world_size times larger.

    ``set_start_iter(i)`` skips this rank's first ``i * batch_size`` indices, to resume an epoch.
    ``rank`` and ``world_size`` default to those of the process group.  With ``with_epoch``
    it yields ``(epoch, index)`` pairs: the epoch reaches the dataset with every index, so
    persistent loader workers (which keep their copy of the dataset) augment for the right epoch.
    """

    def __init__(
        self,
        dataset_size: int,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        with_epoch: bool = False,
    ):
        self.dataset_size = int(dataset_size)
        self.batch_size = int(batch_size)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.rank = get_rank() if rank is None else int(rank)
        self.world_size = get_world_size() if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside a world of {self.world_size}")
        if drop_last:
            self.num_samples = self.dataset_size // self.world_size
        else:
            self.num_samples = math.ceil(self.dataset_size / self.world_size)
        self.epoch = 0
        self.start_iter = 0
        self.with_epoch = with_epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def set_start_iter(self, start_iter: int) -> None:
        self.start_iter = int(start_iter)

    def rank_indices(self) -> list:
        """All of this rank's indices for the current epoch (before skipping start_iter batches)."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            indices = torch.randperm(self.dataset_size, generator=generator).tolist()
        else:
            indices = list(range(self.dataset_size))
        total = self.num_samples * self.world_size
        if total > len(indices):
            repeats = math.ceil((total - len(indices)) / len(indices))
            indices += (indices * repeats)[: total - len(indices)]
        return indices[:total][self.rank :: self.world_size]

    def __iter__(self) -> Iterator:
        indices = self.rank_indices()[self.start_iter * self.batch_size :]
        if self.with_epoch:
            return iter([(self.epoch, index) for index in indices])
        return iter(indices)

    def __len__(self) -> int:
        return max(self.num_samples - self.start_iter * self.batch_size, 0)
