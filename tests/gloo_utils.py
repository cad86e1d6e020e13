"""Spawning test ranks on a gloo process group, set up again on a fresh store when gloo's local
TCP set-up itself fails (a peer's connection closed or refused while the ranks connect, seen
once under a loaded parallel suite); a rank's own error, an assertion included, is raised."""
from pathlib import Path
from typing import Callable, Tuple

import torch.multiprocessing as mp

TRANSPORT_FAULTS = ("connectFullMesh", "Connection closed by peer", "Connection reset by peer",
                    "Connection refused")


def is_transport_fault(message: str) -> bool:
    """Whether a rank's error is gloo failing to connect the ranks, not the test's code."""
    return any(fault in message for fault in TRANSPORT_FAULTS)


def spawn_ranks(fn: Callable, nprocs: int, folder: Path, args_for: Callable[[str], Tuple],
                attempts: int = 3) -> None:
    """``mp.spawn(fn, args=args_for(init_file))`` with a new ``init_file`` under ``folder`` for
    each attempt (a file store is not reusable after a failed set-up)."""
    for attempt in range(attempts):
        init_file = str(Path(folder) / f"gloo_init{attempt}")
        try:
            mp.spawn(fn, args=args_for(init_file), nprocs=nprocs, join=True)
            return
        except mp.ProcessRaisedException as error:
            if attempt + 1 == attempts or not is_transport_fault(str(error)):
                raise
