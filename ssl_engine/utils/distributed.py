"""Small helpers over torch.distributed that also work when no process group exists."""
import datetime
import logging
import os
from typing import Dict, List, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def get_world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_primary() -> bool:
    return get_rank() == 0


def elastic_attempt_store(world_size: int,
                          timeout: datetime.timedelta) -> Optional["dist.Store"]:
    """Under torchrun with the agent's store: a client of that store whose keys are prefixed
    with the restart attempt (TORCHELASTIC_RESTART_COUNT), else None (env:// is then used as
    is).  The agent's store outlives the worker groups it restarts, and a process group sets
    up its connections through keys with fixed names: without the prefix, a restarted group
    reads the addresses of the group that died and its set-up fails (connection refused) or
    hangs until the timeout."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"ssl_engine/attempt_{attempt}", store)


def nccl_settings(cfg) -> Dict[str, str]:
    """The NCCL environment variables asked for by DISTRIBUTED.NCCL_DEBUG (true: NCCL_DEBUG=INFO,
    NCCL's set-up logged) and DISTRIBUTED.NCCL_SOCKET_NTHREADS (a non-empty value is exported
    as is)."""
    found = {}
    if cfg.DISTRIBUTED.get("NCCL_DEBUG", False):
        found["NCCL_DEBUG"] = "INFO"
    threads = cfg.DISTRIBUTED.get("NCCL_SOCKET_NTHREADS", "")
    if threads not in ("", None):
        found["NCCL_SOCKET_NTHREADS"] = str(threads)
    return found


def export_nccl_settings(cfg, backend: str, log_note: bool = True) -> Dict[str, str]:
    """Put :func:`nccl_settings` in this process's environment, before its process group is
    set up (NCCL reads them when its communicators are created); returns what was set.
    ``log_note`` logs one line naming them (on gloo: that they have no effect)."""
    settings = nccl_settings(cfg)
    os.environ.update(settings)
    if settings and log_note:
        names = ", ".join(f"{key}={value}" for key, value in settings.items())
        if backend == "nccl":
            logger.info("NCCL environment: %s", names)
        else:
            logger.info("%s (config.DISTRIBUTED.NCCL_DEBUG / NCCL_SOCKET_NTHREADS): no effect "
                        "on the %s backend", names, backend)
    return settings


def broadcast_buffers(cfg) -> bool:
    """DISTRIBUTED.BROADCAST_BUFFERS: whether rank 0's buffers (batch-norm statistics) are
    sent to every rank at the start of a forward pass (VISSL's default: true)."""
    return bool(cfg.DISTRIBUTED.get("BROADCAST_BUFFERS", True))


class BufferBroadcast:
    """A forward pre-hook giving every rank rank 0's buffers, when DDP's wrapper is not there
    to do it (FSDP): before a forward pass that follows one run with gradients (and before
    the first), as DDP's ``broadcast_buffers`` does.  One broadcast per dtype and device."""

    def __init__(self, module: torch.nn.Module):
        self.groups: Dict[tuple, List[torch.Tensor]] = {}
        for buffer in module.buffers():
            self.groups.setdefault((buffer.dtype, buffer.device), []).append(buffer)
        self.pending = True  # the previous forward pass ran with gradients

    def __call__(self, module, args) -> None:
        if self.pending:
            self.broadcast()
        self.pending = torch.is_grad_enabled()

    @torch.no_grad()
    def broadcast(self) -> None:
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        for tensors in self.groups.values():
            flat = _flatten_dense_tensors(tensors)
            dist.broadcast(flat, src=0)
            for tensor, value in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                tensor.copy_(value)


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum of ``tensor`` over ranks (a new tensor; the input is left untouched)."""
    out = tensor.detach().clone()
    if is_distributed():
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out


def all_reduce_mean(tensor: torch.Tensor) -> torch.Tensor:
    return all_reduce_sum(tensor) / get_world_size()


class _GatherWithGrad(torch.autograd.Function):
    """All-gather whose backward sends every rank the summed gradient of its own slice.

    Rank ``r`` receives d(sum_k L_k)/d(x_r): the losses of all ranks depend on its rows.
    Data-parallel training then averages parameter gradients over ranks, which yields the
    gradient of the mean loss, the same as one process on the global batch.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor):
        gathered = [torch.empty_like(tensor) for _ in range(get_world_size())]
        dist.all_gather(gathered, tensor.contiguous())
        return tuple(gathered)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        stacked = torch.stack(grads).contiguous()
        dist.all_reduce(stacked, op=dist.ReduceOp.SUM)
        return stacked[get_rank()]


def gather_from_all(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate ``tensor`` from every rank along dim 0, in rank order, keeping gradients.

    All ranks must pass tensors of the same shape.
    """
    if get_world_size() == 1:
        return tensor
    if tensor.requires_grad:
        parts: List[torch.Tensor] = list(_GatherWithGrad.apply(tensor))
    else:
        parts = [torch.empty_like(tensor) for _ in range(get_world_size())]
        dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim=0)


def broadcast_object(obj, src: int = 0):
    """``obj`` from rank ``src`` on every rank."""
    if not is_distributed():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src)
    return holder[0]


class _AllReduceSumWithGrad(torch.autograd.Function):
    """Sum over ranks whose backward sums the gradients of every rank's use of the result.

    Every rank's loss depends on the reduced tensor, so d(sum_k L_k)/d(x_r) is the sum over
    ranks of dL_k/dy: the same all-reduce again.  Data-parallel averaging of the parameter
    gradients then gives the gradient of the mean loss (no 1/world_size error).
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, group=None):
        ctx.group = group
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        out = grad.clone().contiguous()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=ctx.group)
        return out, None


def all_reduce_sum_with_grad(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Sum of ``tensor`` over the ranks of ``group`` (default: all), differentiable."""
    if get_world_size() == 1:
        return tensor
    return _AllReduceSumWithGrad.apply(tensor, group)
