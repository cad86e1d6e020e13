"""Sinkhorn-Knopp over the global batch: soft assignments of samples to prototypes with equal
mass per prototype (SwAV, Caron et al. 2020).  Every sum over samples runs over all ranks, so
2 processes with B rows each get the assignments 1 process gets for the 2B rows."""
import math

import torch
import torch.distributed as dist

from ssl_engine.utils.distributed import all_reduce_sum, is_distributed


def _global_row_max(scores: torch.Tensor) -> torch.Tensor:
    """[..., K, 1]: each prototype's highest score over the global batch."""
    top = scores.max(dim=-1, keepdim=True).values.detach().clone()
    if is_distributed():
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return top


@torch.no_grad()
def distributed_sinkhorn(scores: torch.Tensor, epsilon: float = 0.05, num_iters: int = 3,
                         use_double_precision: bool = False) -> torch.Tensor:
    """Assignments ``Q`` [B, K] for this rank's ``scores`` [B, K] (samples x prototypes); for
    ``scores`` [..., B, K], each leading index balanced on its own (CAPI's per position).

    ``Q`` starts as ``exp(scores / epsilon)`` normalised to a total mass of 1 and is rescaled
    ``num_iters`` times so that every prototype gets mass 1/K and every sample of the global
    batch 1/B_global; the rows are returned normalised to sum to 1.  Each prototype's scores
    are shifted by their maximum over the global batch first: the first rescaling of the
    prototype's mass cancels the shift, and ``exp`` cannot overflow.
    """
    if epsilon <= 0:
        raise ValueError(f"sinkhorn: epsilon must be > 0, got {epsilon}")
    if num_iters < 1:
        raise ValueError(f"sinkhorn: num_iters must be >= 1, got {num_iters}")
    dtype = torch.float64 if use_double_precision else torch.float32
    scores = scores.detach().to(dtype).transpose(-1, -2)  # [..., K, B]
    logits = (scores - _global_row_max(scores)) / epsilon
    # both ways, the choice made on the device: reading the underflow flag back would make the
    # host wait for the device (the log-domain iterations cost about as much again, on [K, B])
    underflows = _underflows(logits)
    safe = _log_domain_sinkhorn(logits, num_iters)
    q = torch.exp(logits)
    num_prototypes = q.shape[-2]
    global_batch = all_reduce_sum(torch.full((), float(q.shape[-1]), dtype=dtype,
                                             device=q.device))
    q /= all_reduce_sum(q.sum(dim=(-2, -1), keepdim=True))
    for _ in range(num_iters):
        q /= all_reduce_sum(q.sum(dim=-1, keepdim=True))  # each prototype: total mass 1 ...
        q /= num_prototypes                               # ... then 1/K
        q /= q.sum(dim=-2, keepdim=True)                  # each sample: mass 1 ...
        q /= global_batch                                 # ... then 1/B_global
    return torch.where(underflows, safe, (q * global_batch).transpose(-1, -2))


def _underflows(logits: torch.Tensor) -> torch.Tensor:
    """Whether, on any rank, a sample's every ``exp(logit)`` [K, B] comes near the dtype's
    smallest normal number (a low epsilon and a sample far from every prototype's best):
    its column would sum to 0 and the division make the whole batch NaN. A boolean tensor on
    the device (not read back)."""
    floor = 0.5 * math.log(torch.finfo(logits.dtype).tiny)  # about -44 in float32
    flag = (logits.max(dim=-2).values < floor).any().to(logits.dtype).reshape(1)
    if is_distributed():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag[0] > 0


def _global_logsumexp_over_samples(log_q: torch.Tensor) -> torch.Tensor:
    """[..., K, 1]: ``log sum exp`` of each prototype's row over the global batch."""
    top = _global_row_max(log_q)
    return top + all_reduce_sum(torch.exp(log_q - top).sum(dim=-1, keepdim=True)).log()


def _log_domain_sinkhorn(logits: torch.Tensor, num_iters: int) -> torch.Tensor:
    """``distributed_sinkhorn``'s iterations on the logarithms of ``Q`` (``logits``
    [..., K, B]): the same assignments, none of them lost to underflow."""
    num_prototypes = logits.shape[-2]
    global_batch = all_reduce_sum(torch.full((), float(logits.shape[-1]), dtype=logits.dtype,
                                             device=logits.device))
    log_q = logits
    for _ in range(num_iters):
        log_q = log_q - _global_logsumexp_over_samples(log_q) - math.log(num_prototypes)
        log_q = log_q - torch.logsumexp(log_q, dim=-2, keepdim=True)  # each sample: mass 1
    return log_q.exp().transpose(-1, -2)
