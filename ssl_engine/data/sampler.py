"""A distributed sampler that can start anywhere in an epoch, also after a change of the
number of processes or of the batch size."""
import math
from typing import Iterator, Optional

import torch
from torch.utils.data import Sampler

from ssl_engine.utils.distributed import get_rank, get_world_size


class StatefulDistributedSampler(Sampler[int]):
    """Every rank draws the same order of ``range(dataset_size)`` for an epoch (a permutation
    seeded with ``seed + epoch``, or the identity without ``shuffle``): the epoch's *global
    order*. Rank r takes every world_size-th index of it, from its r-th on, so batch t of the
    ranks together is batch t of one process whose batch is world_size times larger, and after
    any number of batches the ranks together have consumed a prefix of the global order.

    The position in an epoch is that prefix's length, ``start_sample``: a sampler built with
    another world size or batch size and set to the same ``start_sample`` continues the same
    global order from the same sample, skipping and repeating nothing. What is left of the
    order is padded with the order's own start to a multiple of the world size (every rank gets
    as many samples), or with ``drop_last`` cut to one.  ``set_start_iter(i)`` is the position
    after ``i`` batches of this world and batch size.

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
        self.epoch = 0
        self.start_sample = 0
        self.with_epoch = with_epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def set_start_sample(self, start_sample: int) -> None:
        """Continue the epoch after the first ``start_sample`` indices of its global order."""
        if start_sample < 0:
            raise ValueError(f"start_sample must be at least 0, got {start_sample}")
        self.start_sample = int(start_sample)

    def set_start_iter(self, start_iter: int) -> None:
        """Continue the epoch after ``start_iter`` batches of every rank."""
        self.set_start_sample(int(start_iter) * self.batch_size * self.world_size)

    @property
    def num_samples(self) -> int:
        """This rank's samples left in the epoch from ``start_sample``."""
        left = max(self.dataset_size - self.start_sample, 0)
        return left // self.world_size if self.drop_last else math.ceil(left / self.world_size)

    def global_order(self) -> list:
        """The epoch's order of the dataset's indices, the same on every rank."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            return torch.randperm(self.dataset_size, generator=generator).tolist()
        return list(range(self.dataset_size))

    def rank_indices(self) -> list:
        """This rank's indices for the rest of the current epoch (from ``start_sample``)."""
        order = self.global_order()
        rest = order[self.start_sample:]
        total = self.num_samples * self.world_size
        if total > len(rest):  # padding: the order's start, repeated as often as needed
            repeats = math.ceil((total - len(rest)) / len(order))
            rest += (order * repeats)[: total - len(rest)]
        return rest[:total][self.rank :: self.world_size]

    def samples_consumed(self, batches: int) -> int:
        """The position in the epoch's global order once every rank has taken ``batches``
        batches from ``start_sample`` (padding is not counted: at most the dataset size)."""
        taken = min(int(batches) * self.batch_size, self.num_samples) * self.world_size
        return min(self.start_sample + taken, max(self.dataset_size, self.start_sample))

    def __iter__(self) -> Iterator:
        indices = self.rank_indices()
        if self.with_epoch:
            return iter([(self.epoch, index) for index in indices])
        return iter(indices)

    def __len__(self) -> int:
        return self.num_samples
