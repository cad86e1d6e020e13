"""Batch norm over the batch of every process (MODEL.SYNC_BN_CONFIG), or over slices of each
process's batch (MODEL.BATCH_NORM_SPLITS).

``SYNC_BN_TYPE=pytorch`` converts to torch's ``SyncBatchNorm`` (GPUs only: it refuses CPU
tensors).  ``SYNC_BN_TYPE=all_reduce`` converts to ``GlobalBatchNorm``, which all-reduces the
statistics with a differentiable sum and so runs on any backend (gloo on a CPU, NCCL on GPUs).
With either, N processes with a batch of B normalise exactly like one process with N * B.
VISSL's configs write ``pytorch`` or ``apex`` for GPUs: composing a config for a CPU run reads
both as ``all_reduce`` (and ``apex`` as ``pytorch`` on GPUs), with a warning
(config/gpu_settings.py), so the checks here see what the run does.
"""
import logging
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ssl_engine.utils.distributed import all_reduce_sum_with_grad, get_world_size

logger = logging.getLogger(__name__)

SYNC_BN_TYPES = ("pytorch", "all_reduce", "apex")


class _NormOfAnyShape(_BatchNorm):
    """A batch norm for [N, C] and [N, C, ...] inputs alike, with ``nn.BatchNorm``'s
    running-statistics factor."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"{type(self).__name__} expects [N, C, ...] input, got "
                             f"{input.dim()}D")

    def _count_batch(self) -> float:
        """Count one more batch; the weight of its statistics in the running ones."""
        self.num_batches_tracked.add_(1)
        if self.momentum is None:  # cumulative moving average, as nn.BatchNorm
            return 1.0 / float(self.num_batches_tracked)
        return self.momentum


class GlobalBatchNorm(_NormOfAnyShape):
    """Batch norm whose training statistics are those of the union of every rank's batch.

    Mean and (biased) variance are computed in two passes from all-reduced sums, so the
    gradients reach every rank's inputs; running statistics get the unbiased variance, as in
    ``nn.BatchNorm``.  Works for [N, C] and [N, C, ...] inputs.  In eval mode, or without
    batch statistics, it is plain batch norm.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, process_group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or get_world_size() == 1:
            return super().forward(input)
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        local_count = input.numel() // input.shape[1]
        count = all_reduce_sum_with_grad(
            torch.tensor([float(local_count)], device=input.device), self.process_group)
        mean = all_reduce_sum_with_grad(input.sum(dims), self.process_group) / count
        centered = input - mean.reshape(shape)
        var = all_reduce_sum_with_grad((centered * centered).sum(dims), self.process_group) / count
        if self.training and self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), float(count))
        out = centered * torch.rsqrt(var + self.eps).reshape(shape)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out

    @torch.no_grad()
    def _update_running_stats(self, mean: torch.Tensor, var: torch.Tensor, count: float) -> None:
        factor = self._count_batch()
        unbiased = var * count / max(count - 1.0, 1.0)
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)


class SplitBatchNorm(_NormOfAnyShape):
    """Batch norm whose training batch is normalised in ``splits`` equal slices, each with its
    own statistics, as that many processes with one slice each would (MODEL.BATCH_NORM_SPLITS).
    The running statistics move once per batch, towards the slices' mean statistics.  In eval
    mode it is plain batch norm; the state-dict keys are ``nn.BatchNorm``'s."""

    def __init__(self, num_features: int, splits: int, eps: float = 1e-5,
                 momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.splits = int(splits)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        if not use_batch_stats or self.splits == 1:
            return super().forward(input)
        if input.shape[0] % self.splits:
            raise ValueError(f"config.MODEL.BATCH_NORM_SPLITS={self.splits} does not divide the "
                             f"batch of {input.shape[0]} rows reaching a batch norm")
        if not (self.training and self.track_running_stats):
            return torch.cat([F.batch_norm(part, None, None, self.weight, self.bias, True, 0.0,
                                           self.eps) for part in input.chunk(self.splits)])
        factor = self._count_batch()
        # each slice moves its own copy of the running statistics, as each rank would; the
        # copies' mean is one step towards the slices' mean statistics
        means = self.running_mean.repeat(self.splits, 1)
        variances = self.running_var.repeat(self.splits, 1)
        out = torch.cat([F.batch_norm(part, means[k], variances[k], self.weight, self.bias,
                                      True, factor, self.eps)
                         for k, part in enumerate(input.chunk(self.splits))])
        with torch.no_grad():
            self.running_mean.copy_(means.mean(0))
            self.running_var.copy_(variances.mean(0))
        return out

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, splits={self.splits}"


def _replace_batch_norms(module: nn.Module, kind: type, make) -> nn.Module:
    """``module`` with every batch norm that is not a ``kind`` replaced by ``make(bn)``, which
    takes over its parameters, statistics, mode and frozen flags (state-dict keys unchanged)."""
    if isinstance(module, _BatchNorm) and not isinstance(module, kind):
        converted = make(module)
        converted.load_state_dict(module.state_dict())
        converted.train(module.training)
        if module.affine:
            converted.weight.requires_grad_(module.weight.requires_grad)
            converted.bias.requires_grad_(module.bias.requires_grad)
        return converted
    for name, child in module.named_children():
        module.add_module(name, _replace_batch_norms(child, kind, make))
    return module


def convert_to_global_bn(module: nn.Module, process_group=None) -> nn.Module:
    """``module`` with every BatchNorm1d/2d/3d replaced by a GlobalBatchNorm."""
    return _replace_batch_norms(module, GlobalBatchNorm, lambda bn: GlobalBatchNorm(
        bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, process_group))


def convert_to_split_bn(module: nn.Module, splits: int) -> nn.Module:
    """``module`` with every batch norm replaced by a SplitBatchNorm of ``splits`` slices."""
    return _replace_batch_norms(module, SplitBatchNorm, lambda bn: SplitBatchNorm(
        bn.num_features, splits, bn.eps, bn.momentum, bn.affine, bn.track_running_stats))


def check_sync_bn_config(sync_cfg, device: str) -> None:
    """Refuse, before launch, settings that cannot run (raises ValueError)."""
    if not sync_cfg.CONVERT_BN_TO_SYNC_BN:
        return
    kind = sync_cfg.SYNC_BN_TYPE
    if kind == "apex":
        raise ValueError("config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE=apex is not supported (apex "
                         "is not installed with current torch): use pytorch on GPUs or "
                         "all_reduce on any device")
    if kind not in SYNC_BN_TYPES:
        raise ValueError(f"config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE must be pytorch or "
                         f"all_reduce, got '{kind}'")
    if kind == "pytorch" and device != "gpu":
        raise ValueError("config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE=pytorch needs GPUs (torch's "
                         "SyncBatchNorm refuses CPU tensors): use all_reduce on a CPU")
    if int(sync_cfg.GROUP_SIZE) < -1:
        raise ValueError(f"config.MODEL.SYNC_BN_CONFIG.GROUP_SIZE must be -1, 0 or a positive "
                         f"size, got {sync_cfg.GROUP_SIZE}")


def check_batch_norm_splits(cfg) -> None:
    """Refuse, before launch, MODEL.BATCH_NORM_SPLITS that cannot run (raises ValueError)."""
    splits = cfg.MODEL.BATCH_NORM_SPLITS
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1:
        raise ValueError(f"config.MODEL.BATCH_NORM_SPLITS must be an integer >= 1, got {splits!r}")
    if splits == 1:
        return
    if cfg.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN:
        raise ValueError("config.MODEL.BATCH_NORM_SPLITS > 1 normalises slices of each "
                         "process's batch, config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN "
                         "the batch of every process together: choose one")
    batch = cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA
    if batch % splits or batch // splits < 2:
        raise ValueError(f"config.MODEL.BATCH_NORM_SPLITS={splits} must divide "
                         f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={batch} into slices of at "
                         "least 2 images")


def _process_group(group_size: int, procs_per_node: int):
    """The group this rank synchronises with: None for all ranks (GROUP_SIZE 0, or a group
    as large as the world); -1 means the processes of one machine."""
    world = get_world_size()
    size = procs_per_node if group_size == -1 else group_size
    if size <= 0 or size >= world:
        return None
    if world % size:
        raise ValueError(f"config.MODEL.SYNC_BN_CONFIG.GROUP_SIZE={size} does not divide the "
                         f"{world} processes")
    group, _ = dist.new_subgroups(group_size=size)
    return group


def convert_sync_bn(model: nn.Module, cfg) -> nn.Module:
    """Apply MODEL.BATCH_NORM_SPLITS or MODEL.SYNC_BN_CONFIG to ``model`` (call after
    torch.distributed is set up, on every rank).  Nothing changes with one slice and one
    process or when conversion is off."""
    splits = int(cfg.MODEL.get("BATCH_NORM_SPLITS", 1))
    if splits > 1:
        logger.info("batch norm in %d slices of each process's batch", splits)
        return convert_to_split_bn(model, splits)
    sync_cfg = cfg.MODEL.SYNC_BN_CONFIG
    if not sync_cfg.CONVERT_BN_TO_SYNC_BN or get_world_size() == 1:
        return model
    check_sync_bn_config(sync_cfg, cfg.MACHINE.DEVICE)
    group = _process_group(int(sync_cfg.GROUP_SIZE), cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    logger.info("batch norm synchronised over %s (%s)",
                "all processes" if group is None else f"groups of {dist.get_world_size(group)}",
                sync_cfg.SYNC_BN_TYPE)
    if sync_cfg.SYNC_BN_TYPE == "pytorch":
        return nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
    return convert_to_global_bn(model, group)
