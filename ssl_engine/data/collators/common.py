"""Pieces shared by the collators: per-view metadata in view-major order."""
from typing import Dict, List

import torch

from ssl_engine.data.labels import stack_labels


def num_views(samples: List[dict]) -> int:
    """The number of views of every sample (ValueError if they differ)."""
    counts = {len(sample["data"]) for sample in samples}
    if len(counts) != 1:
        raise ValueError(f"samples of one batch have different numbers of views: {sorted(counts)}")
    return counts.pop()


def view_major(samples: List[dict], views: List[int]) -> List[torch.Tensor]:
    """The tensors of ``views`` in view-major order: all samples' view v, then the next view."""
    return [sample["data"][v] for v in views for sample in samples]


def view_major_meta(samples: List[dict], views: List[int]) -> Dict[str, torch.Tensor]:
    """target, data_idx and data_valid of ``views``, one row per (view, sample), view-major.
    The target is [rows] int64 for class indices, [rows, C] for label vectors of C values."""
    rows = [(s, v) for v in views for s in samples]
    return {
        "target": stack_labels([s["label"][v] for s, v in rows], [s["data_idx"] for s, _ in rows]),
        "data_idx": torch.tensor([s["data_idx"] for s, _ in rows], dtype=torch.long),
        "data_valid": torch.tensor([s["data_valid"] for s, _ in rows], dtype=torch.bool),
    }
