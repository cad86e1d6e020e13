"""What a rank does for its process before any work: pick the device, size the thread pools,
set the host allocator, join torch.distributed and seed the generators. Called by the trainer
(``SelfSupervisionTrainer``) and by the extraction workflow (``ssl_engine.extraction``)."""
import datetime
import logging
import os
from typing import NamedTuple

import torch
import torch.distributed as dist

from ssl_engine.utils import rng
from ssl_engine.utils.cpu_budget import configure_threads
from ssl_engine.utils.distributed import elastic_attempt_store, export_nccl_settings
from ssl_engine.utils.host_memory import reuse_freed_memory

logger = logging.getLogger(__name__)


class RankProcess(NamedTuple):
    """Where this process runs, as ``setup_process`` set it up."""
    local_rank: int
    rank: int
    world_size: int
    device: torch.device


def machine_ranks():
    """(local_rank, global_rank, world_size) from the environment the launcher set."""
    return (
        int(os.environ.get("LOCAL_RANK", 0)),
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
    )


def select_device(cfg, local_rank: int) -> torch.device:
    """The GPU of ``local_rank`` (made the current one) with MACHINE.DEVICE=gpu, else the CPU."""
    if cfg.MACHINE.DEVICE == "gpu":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def setup_distributed(cfg, dist_run_id: str, rank: int, world_size: int) -> None:
    """Join the process group (DISTRIBUTED.BACKEND, TIMEOUT_MINUTES) at ``dist_run_id``
    ("tcp://host:port", "file://path" or "env://"), unless this process is in one already."""
    if dist.is_initialized():
        return
    backend = cfg.DISTRIBUTED.BACKEND
    export_nccl_settings(cfg, backend, log_note=rank == 0)
    logger.info("init process group: backend=%s rank=%d world=%d init=%s",
                backend, rank, world_size, dist_run_id)
    minutes = float(cfg.DISTRIBUTED.get("TIMEOUT_MINUTES", 30))
    timeout = datetime.timedelta(minutes=minutes)
    store = elastic_attempt_store(world_size, timeout) if dist_run_id == "env://" else None
    dist.init_process_group(backend=backend, init_method=None if store else dist_run_id,
                            store=store, rank=rank, world_size=world_size, timeout=timeout)


def setup_process(cfg, dist_run_id: str) -> RankProcess:
    """Set this rank's process up: device, threads (logged by rank 0), the host allocator
    (MACHINE.REUSE_FREED_MEMORY), torch.distributed, and the seeds (SEED_VALUE + rank)."""
    local_rank, rank, world_size = machine_ranks()
    device = select_device(cfg, local_rank)
    resources = configure_threads(cfg)
    if rank == 0:
        logger.info("cores: %s", resources)
    if cfg.MACHINE.get("REUSE_FREED_MEMORY", True) and not reuse_freed_memory():
        logger.debug("MACHINE.REUSE_FREED_MEMORY: the C library is not glibc; "
                     "its allocator's defaults stay")
    setup_distributed(cfg, dist_run_id, rank, world_size)
    rng.set_seeds(cfg.SEED_VALUE + rank)
    return RankProcess(local_rank, rank, world_size, device)
