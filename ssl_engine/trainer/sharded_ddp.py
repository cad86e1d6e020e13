"""ZeRO stage 2 (``MODEL.SHARDED_DDP_SETUP.USE_SDP``): fairscale's ShardedDataParallel in place
of DDP, over the OSS optimizer of ``OPTIMIZER.use_zero`` (which USE_SDP turns on).

Each gradient is reduced (summed, then divided by the world size) to the one rank that owns
its optimizer state, instead of all-reduced to every rank; after the backward pass the other
ranks drop it or keep a stale copy.  Gradients small enough share reduce buckets
(``reduce_buffer_size`` elements per bucket and destination rank): their ``param.grad`` are
views into the bucket, created at the first training forward pass.  They must stay so: a
gradient set to None (torch's ``Optimizer.zero_grad()`` by default) comes back as a fresh
tensor the bucket does not see, and its owner would step with its own, unreduced gradient.
So the optimizer zeroes the gradients in place under ShardedDataParallel.

What reads every rank's gradients (clipping their global norm, float16's overflow check) or
drops gradients (MODEL.TEMP_FROZEN_PARAMS_ITER_MAP) does not work on these partial
gradients, and is refused before launch.
"""
import logging

import torch

from ssl_engine.config import ConfigError
from ssl_engine.trainer.amp import amp_dtype
from ssl_engine.utils.distributed import broadcast_buffers

logger = logging.getLogger(__name__)

KEY = "config.MODEL.SHARDED_DDP_SETUP"


def uses_sharded_ddp(cfg) -> bool:
    """Whether MODEL.SHARDED_DDP_SETUP.USE_SDP is on."""
    return bool((cfg.MODEL.get("SHARDED_DDP_SETUP") or {}).get("USE_SDP", False))


def check_sharded_ddp_config(cfg) -> None:
    """Refuse, before launch, what cannot run with USE_SDP (see the module's docstring)."""
    if not uses_sharded_ddp(cfg):
        return

    device_type = "cuda" if cfg.MACHINE.DEVICE == "gpu" else "cpu"
    why = None
    if (cfg.MODEL.get("GRAD_CLIP") or {}).get("USE_GRAD_CLIP", False):
        why = ("config.MODEL.GRAD_CLIP.USE_GRAD_CLIP=true: each rank holds the reduced "
               "gradients of its own share of the parameters only, so their global norm is "
               "not computed yet")
    elif cfg.MODEL.get("TEMP_FROZEN_PARAMS_ITER_MAP"):
        why = ("config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP: dropping gradients would detach "
               "them from ShardedDataParallel's reduce buckets")
    elif amp_dtype(cfg.MODEL.AMP_PARAMS, device_type) == torch.float16:
        why = ("float16 AMP (config.MODEL.AMP_PARAMS): its loss scaler would check each rank's "
               "partial gradients for overflow; use AMP_ARGS.dtype=bfloat16")
    if why:
        raise ConfigError(f"{KEY}.USE_SDP=true does not work with {why}; or leave USE_SDP off "
                          "and keep OPTIMIZER.use_zero=true (optimizer state sharded, gradients "
                          "all-reduced)")
    size = cfg.MODEL.SHARDED_DDP_SETUP.get("reduce_buffer_size", -1)
    if isinstance(size, bool) or not isinstance(size, int) or size < -1:
        raise ConfigError(f"{KEY}.reduce_buffer_size must be an integer: -1 (fairscale's "
                          f"default, 2**23), 0 (no buckets) or a number of elements; got {size!r}")


def wrap_sharded_ddp(model: torch.nn.Module, optimizer, cfg) -> torch.nn.Module:
    """``model`` wrapped in ShardedDataParallel over ``optimizer`` (an SSLOptimizer whose
    state OSS shards); the optimizer then zeroes gradients in place.  Every rank gets rank 0's
    weights, as with DDP."""
    from fairscale.nn.data_parallel import ShardedDataParallel

    oss = optimizer.sharded
    if oss is None:
        raise RuntimeError(f"{KEY}.USE_SDP needs the optimizer sharded by OPTIMIZER.use_zero")
    size = int(cfg.MODEL.SHARDED_DDP_SETUP.reduce_buffer_size)
    kwargs = {"reduce_buffer_size": size} if size >= 0 else {}
    optimizer.zero_grads_in_place = True  # the bucket views must survive zero_grad
    wrapped = ShardedDataParallel(model, oss, broadcast_buffers=broadcast_buffers(cfg),
                                  **kwargs)
    logger.info("USE_SDP: each gradient reduced to the rank owning its optimizer state, "
                "in buckets of up to %d values", wrapped._buffer_max_size)
    return wrapped
