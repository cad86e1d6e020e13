"""Features of the labelled TRAIN and TEST splits for evaluations run inside a training run.

Both splits are read with the TEST split's transforms (first view of each sample), the default
collator, standard labels, no shuffling and no dropped samples. Every rank computes the
features of its share of the data (the distributed sampler's, padded with repeats); the shares
are all-gathered batch by batch and rank 0 puts them in dataset order, keeping one row per
``data_idx``. Other ranks get None. Used by the kNN and feature-report hooks during training
(the extraction of whole splits to files is ``ssl_engine.extraction``, above the hooks).
"""
import contextlib
import copy
from typing import Dict, Iterator, NamedTuple, Optional

import torch
from torch import nn
from torch.utils.data import Dataset

from ssl_engine.data import build_dataloader, build_dataset
from ssl_engine.data.paths import SPLITS
from ssl_engine.evaluation.feature_batches import FeaturesFn, feature_batches
from ssl_engine.utils import rng
from ssl_engine.utils.cpu_budget import loader_workers
from ssl_engine.utils.distributed import gather_from_all, is_primary


class LabelledFeatures(NamedTuple):
    features: Dict[str, torch.Tensor]  # name -> [N, D], row i is sample i of the split
    targets: torch.Tensor  # [N]


def eval_data_config(cfg):
    """A copy of ``cfg`` whose TRAIN and TEST splits are read as the TEST split is for
    evaluation: TEST's transforms and batch size, the default collator, standard labels."""
    cfg = copy.deepcopy(cfg)
    test = cfg.DATA.TEST
    for split in SPLITS:
        cfg.DATA[split].update(TRANSFORMS=copy.deepcopy(test.TRANSFORMS),
                               BATCHSIZE_PER_REPLICA=test.BATCHSIZE_PER_REPLICA,
                               COLLATE_FUNCTION="default", COLLATE_FUNCTION_PARAMS={},
                               LABEL_TYPE="standard", DROP_LAST=False)
    return cfg


class FirstView(Dataset):
    """``dataset`` with only the first view of every sample (SSL test transforms often
    replicate each image into several views)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, idx: int):
        sample = self.dataset[idx]
        return {**sample, "data": sample["data"][:1], "label": sample["label"][:1]}


class EvalSplits:
    """The TRAIN and TEST datasets of ``eval_data_config(cfg)`` (or those of ``splits``), first
    views only."""

    def __init__(self, cfg, splits=SPLITS):
        self.cfg = eval_data_config(cfg)
        self.datasets = {split: FirstView(build_dataset(self.cfg, split)) for split in splits}

    def features(self, features_fn: FeaturesFn, device: torch.device
                 ) -> Optional[Dict[str, LabelledFeatures]]:
        """``{"TRAIN": ..., "TEST": ...}`` on rank 0, None elsewhere (collective)."""
        result = {split: self.split_features(features_fn, split, device) for split in SPLITS}
        return result if is_primary() else None

    def split_features(self, features_fn: FeaturesFn, split: str, device: torch.device
                       ) -> Optional[LabelledFeatures]:
        """Features of every sample of ``split`` in index order on rank 0, None elsewhere
        (a collective call: every rank must take part)."""
        dataset, data_cfg = self.datasets[split], self.cfg.DATA
        loader = build_dataloader(dataset, data_cfg[split],
                                  num_workers=loader_workers(self.cfg),
                                  pin_memory=data_cfg.PIN_MEMORY and device.type == "cuda",
                                  epoch=0, shuffle=False)
        parts = []
        for features, targets, data_idx in feature_batches(features_fn, loader, device):
            gathered = [_gather(t, device) for t in (*features.values(), targets, data_idx)]
            if is_primary():
                parts.append((dict(zip(features, gathered[:-2])), gathered[-2], gathered[-1]))
        if not is_primary():
            return None
        return _in_dataset_order(parts, len(dataset))


def _in_dataset_order(parts, size: int) -> LabelledFeatures:
    """One row per dataset index, in index order, from batches ``(features, targets, idx)``
    that cover every index at least once."""
    indices = torch.cat([p[2] for p in parts])
    covered = torch.zeros(size, dtype=torch.bool)
    covered[indices] = True
    if not covered.all():  # the sampler covers the dataset; anything else is a bug
        raise RuntimeError(f"features of {int((~covered).sum())} samples are missing")
    first = _first_occurrence(indices, size)
    features = {name: torch.cat([p[0][name] for p in parts])[first] for name in parts[0][0]}
    return LabelledFeatures(features, torch.cat([p[1] for p in parts])[first])


def _gather(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` of every rank concatenated, on the CPU (gathered on ``device``, as NCCL needs)."""
    return gather_from_all(tensor.to(device)).cpu()


def _first_occurrence(indices: torch.Tensor, size: int) -> torch.Tensor:
    """For each dataset index 0..size-1, the position of its first row in ``indices``."""
    positions = torch.arange(len(indices))
    first = torch.full((size,), len(indices), dtype=torch.long)
    return first.scatter_reduce(0, indices, positions, reduce="amin")


@contextlib.contextmanager
def evaluation_mode(*models: nn.Module) -> Iterator[None]:
    """Put ``models`` in eval mode for the block, then give every module back its own mode and
    the random generators their states, so training continues exactly as without the block."""
    rng_state = rng.get_rng_state()
    modes = [(module, module.training) for model in models for module in model.modules()]
    for model in models:
        model.eval()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode
        rng.set_rng_state(rng_state)
