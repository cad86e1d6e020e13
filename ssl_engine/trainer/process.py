"""What a rank does for its process before any work: pick the device, size the thread pools,
set the host allocator, join torch.distributed and seed the generators. Called by the trainer
(``SelfSupervisionTrainer``) and by the extraction workflow (``ssl_engine.extraction``).
A process started by the launcher first ties its life to the launcher's (``die_with_launcher``).
"""
import ctypes
import datetime
import logging
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing import resource_tracker
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist

from ssl_engine.utils import rng
from ssl_engine.utils.cpu_budget import configure_threads
from ssl_engine.utils.distributed import elastic_attempt_store, export_nccl_settings
from ssl_engine.utils.host_memory import reuse_freed_memory
from ssl_engine.utils.process_watch import wait_for
from ssl_engine.utils.run_lock import process_alive

logger = logging.getLogger(__name__)


PR_SET_PDEATHSIG = 1  # linux/prctl.h
ORPHAN_NOTE_S = 0.5  # how long an orphan tries to say why it ends before it does


def die_with_launcher(launcher: Tuple[int, Optional[int]], local_rank: int) -> None:
    """End this process, and the processes it starts (data-loader workers), when the launcher
    ``launcher`` = (pid, start time, see ``run_lock.process_start``) that started it ends,
    however it ends (``kill -9``, the out-of-memory killer): a run whose launcher is gone must
    not go on writing into a folder that a relaunch takes over.

    Two ways, as early as this process runs: the kernel's parent-death signal (SIGKILL when the
    parent ends; the parent is the launcher with the spawn start method, the forkserver
    otherwise, which lives as long as the processes it forked), and a thread that waits for the
    launcher itself to end (on a pidfd, or polling without one), then kills the processes this
    one started and this process. A launcher already gone when this is called (before the signal
    was set) ends this process at once."""
    pid, start = launcher
    _set_parent_death_signal(signal.SIGKILL)
    if not process_alive(pid, start):
        _end_orphan(pid, local_rank)
    threading.Thread(target=_watch_launcher, args=(pid, start, local_rank), daemon=True,
                     name="launcher-watch").start()


def _set_parent_death_signal(signum: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the watching thread alone
        pass


def _watch_launcher(pid: int, start: Optional[int], local_rank: int) -> None:
    wait_for(pid, start)  # the launcher, not a later process given its pid
    _end_orphan(pid, local_rank)


def _descendants(pid: int) -> List[int]:
    """The pids of the processes ``pid`` started, and of those they started (data-loader
    workers, and the forkserver that starts them), from /proc; its direct children from
    multiprocessing where /proc does not list children."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        try:
            children = [int(child) for task in Path(f"/proc/{parent}/task").iterdir()
                        for child in (task / "children").read_text().split()]
        except (OSError, ValueError):
            if parent != pid:
                continue
            children = [child.pid for child in multiprocessing.active_children()]
        found.extend(children)
        queue.extend(children)
    return found


def _end_orphan(launcher_pid: int, local_rank: int) -> None:
    """Kill the processes this one started, say why on stderr (if that does not block), and
    kill this process (no clean-up: as if killed together with its launcher). The resource
    tracker is spared: it ends by itself once they are all gone, removing the shared memory
    and semaphores they left."""
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    for child in _descendants(os.getpid()):
        if child != tracker:
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass
    note = (f"process {local_rank} of the run (pid {os.getpid()}) ends: its launcher (pid "
            f"{launcher_pid}) is gone\n").encode()
    writer = threading.Thread(target=_write_stderr, args=(note,), daemon=True)
    writer.start()
    writer.join(ORPHAN_NOTE_S)
    os.kill(os.getpid(), signal.SIGKILL)


def _write_stderr(data: bytes) -> None:
    try:
        os.write(2, data)
    except OSError:  # nobody reads it any more
        pass


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


# A rank started by a forkserver starts its data-loading workers the same way, from a server of
# its own: that server imports the data modules once, so each worker forks with them loaded
# instead of importing torch and the engine itself (measured on 2 cores with 2 workers: 20 s
# -> 6.5 s to the first batch; benchmarks/imagenet_file_count.py).
WORKER_SERVER_PRELOAD = ["ssl_engine.data"]


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
    multiprocessing.set_forkserver_preload(WORKER_SERVER_PRELOAD)
    return RankProcess(local_rank, rank, world_size, device)
