"""The data loader of one phase: sampler position, collator and worker settings."""
import torch
from torch.utils.data import DataLoader

from ssl_engine.data.collators import build_collator
from ssl_engine.data.sampler import StatefulDistributedSampler


def build_dataloader(
    dataset,
    split_cfg,
    num_workers: int,
    pin_memory: bool,
    epoch: int,
    start_iter: int = 0,
    seed: int = 0,
    shuffle: bool = True,
) -> DataLoader:
    """A loader over this rank's share of ``dataset`` for ``epoch``, starting at batch
    ``start_iter``. ``split_cfg`` is cfg.DATA.TRAIN or cfg.DATA.TEST.

    The loader has its own generator (seeded with ``seed + epoch``), so creating its iterator does
    not draw from the caller's global random state; workers are not persistent, so each epoch's
    workers see the dataset's new epoch.
    """
    dataset.set_epoch(epoch)
    sampler = StatefulDistributedSampler(
        len(dataset),
        split_cfg.BATCHSIZE_PER_REPLICA,
        shuffle=shuffle,
        seed=seed,
        drop_last=split_cfg.DROP_LAST,
    )
    sampler.set_epoch(epoch)
    sampler.set_start_iter(start_iter)
    return DataLoader(
        dataset,
        batch_size=split_cfg.BATCHSIZE_PER_REPLICA,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.accelerator.is_available(),
        collate_fn=build_collator(split_cfg.COLLATE_FUNCTION, split_cfg.COLLATE_FUNCTION_PARAMS),
        drop_last=split_cfg.DROP_LAST,
        persistent_workers=False,
        generator=torch.Generator().manual_seed(seed + epoch),
    )
