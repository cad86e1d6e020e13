"""Ending a process when another one ends, however that one ends (``kill -9``, the
out-of-memory killer): ``end_with(pid)`` starts a thread that waits for ``pid`` and then
SIGKILLs this process. Data-loader workers use it to end with the rank that started them:
their parent is a forkserver where the rank was started by one, so neither the kernel's
parent-death signal nor torch's own check of the parent sees the rank end."""
import os
import select
import signal
import threading
import time
from typing import Optional

from ssl_engine.utils.run_lock import process_alive

POLL_S = 0.5  # how often ``pid`` is looked at where it cannot be waited on (no pidfd)


def wait_for(pid: int, start: Optional[int] = None) -> None:
    """Return once process ``pid`` (the one started at ``start`` when given, not a later one
    that reuses its pid: ``run_lock.process_start``) has ended: waits on a pidfd, or polls
    where there is none."""
    try:
        handle = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfd (another system, an old kernel): poll
        while process_alive(pid, start):
            time.sleep(POLL_S)
        return
    try:
        if process_alive(pid, start):
            select.select([handle], [], [])  # readable once ``pid`` has ended
    finally:
        os.close(handle)


def _end_after(pid: int) -> None:
    wait_for(pid)
    os.kill(os.getpid(), signal.SIGKILL)


def end_with(pid: int) -> None:
    """SIGKILL this process as soon as ``pid`` has ended (at once if it has already)."""
    threading.Thread(target=_end_after, args=(pid,), daemon=True,
                     name=f"end-with-{pid}").start()
