"""Activation checkpointing (MODEL.ACTIVATION_CHECKPOINTING): a segment of the trunk keeps
only its input for the backward pass and runs its forward again there, trading compute for
the memory of its intermediate activations.

The second forward must not count as a second batch for the norm layers: their running
statistics are put back after it, so a checkpointed run trains to the same weights *and*
buffers as one without.
"""
import contextlib
from typing import Callable, List, Sequence

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint


@contextlib.contextmanager
def norm_statistics_kept(module: nn.Module):
    """Restore the running statistics of ``module``'s batch-norm layers on exit."""
    buffers = [buffer for layer in module.modules() if isinstance(layer, _BatchNorm)
               for buffer in layer.buffers()]
    saved = [buffer.clone() for buffer in buffers]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in zip(buffers, saved):
                buffer.copy_(value)


def split_evenly(items: Sequence, parts: int) -> List[Sequence]:
    """``items`` cut into ``min(parts, len(items))`` contiguous runs of near-equal length."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    runs, start = [], 0
    for index in range(parts):
        end = start + size + (index < extra)
        runs.append(items[start:end])
        start = end
    return runs


def checkpointed_segments(blocks: Sequence[nn.Module], splits: int) -> Callable:
    """A function running ``blocks`` in order as ``splits`` checkpointed segments."""
    segments = [nn.Sequential(*run) for run in split_evenly(list(blocks), splits)]

    def run(x: torch.Tensor) -> torch.Tensor:
        for segment in segments:
            x = checkpoint(
                segment, x, use_reentrant=False,
                context_fn=lambda segment=segment: (contextlib.nullcontext(),
                                                    norm_statistics_kept(segment)),
            )
        return x

    return run


def checkpointing_splits(model_cfg) -> int:
    """NUM_ACTIVATION_CHECKPOINTING_SPLITS when MODEL.ACTIVATION_CHECKPOINTING is on, else 0."""
    cfg = model_cfg.get("ACTIVATION_CHECKPOINTING") or {}
    if not cfg.get("USE_ACTIVATION_CHECKPOINTING", False):
        return 0
    splits = cfg.get("NUM_ACTIVATION_CHECKPOINTING_SPLITS", 2)
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1:
        raise ValueError("MODEL.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS must "
                         f"be an integer >= 1, got {splits!r}")
    return splits
