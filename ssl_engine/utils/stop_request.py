"""A clean stop on SIGTERM or SIGINT (Ctrl-C), the signals clusters end jobs with.

The first signal is only noted. The training loop asks a ``StopRequest`` at each of its stop
points (after a train step, and at the end of a phase) whether to stop there; when it does,
the hooks of that point run knowing it (``task.stopping``: the checkpoint hook saves), the run
raises ``RunStopped`` and the process exits with 128 + the signal's number (143 for SIGTERM,
130 for SIGINT). A second signal ends the process at once: while a stop is pending the signals
have their default action again, which works even in the middle of a collective.

Several processes must stop at the same point, or one would wait in a collective the others
never enter. Every process learns of the request: each gets the signal itself (SLURM, torchrun
and a terminal's Ctrl-C signal every process), or the launcher that started them notes it in a
value they share (``launcher_stop_signals``). The first process to see the request at a stop
point proposes the next stop point through the process group's store, and the others take that
proposal. Within training the processes are never a full stop point apart (each train step and
each phase end holds a collective), so every process sees the request before it passes the
proposed point. This costs nothing per step until a signal arrives. Test phases hold no
collective at each step, so their steps are not stop points: a test phase runs to its end.
"""
import contextlib
import logging
import signal
import threading
from typing import Callable, Optional

import torch.distributed as dist

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STORE_KEY = "ssl_engine/stop_at"

_received: Optional[int] = None  # the first stop signal this process got
_shared = None  # the launcher's shared value (a signal number, 0 while none), in its processes


class RunStopped(Exception):
    """The run stopped cleanly on a signal; ``signum`` is that signal's number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def requested_signal() -> Optional[int]:
    """The signal that asked this process (or its launcher) to stop, or None."""
    if _received is not None:
        return _received
    if _shared is not None and _shared.value:
        return _shared.value
    return None


def _note(signum, frame) -> None:
    global _received
    _received = signum
    for sig in STOP_SIGNALS:  # a second signal: the default action, at once
        signal.signal(sig, signal.SIG_DFL)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def _stop_handler(handler):
    """``handler`` for SIGTERM and SIGINT while the block runs, the previous ones after it.
    Outside the main thread signals cannot be caught: nothing changes."""
    if not _in_main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)


@contextlib.contextmanager
def stop_signals(shared=None):
    """While the block runs, a first SIGTERM or SIGINT is noted for the training loop instead
    of ending the process; ``shared`` is the launcher's shared value, set when the launcher got
    the signal. Outside the main thread signals cannot be caught: nothing changes."""
    global _received, _shared
    _received, _shared = None, shared
    try:
        with _stop_handler(_note):
            yield
    finally:
        _received, _shared = None, None


def launcher_stop_signals(shared, abort: Callable[[int], None]):
    """In a launcher that started the run's processes (a context manager): a first SIGTERM or
    SIGINT is written to ``shared`` (a value its processes read at their stop points); a second
    one calls ``abort(signum)``."""
    def handler(signum, frame):
        if shared.value:
            abort(signum)
        else:
            shared.value = signum

    return _stop_handler(handler)


def ignore_interrupts(worker_id: int = 0) -> None:
    """For data-loader workers (their ``worker_init_fn``): a terminal's Ctrl-C reaches every
    process of the job, and a worker that ended on it would fail the step its process is
    finishing. SIGTERM keeps its default action: torch and multiprocessing end workers with it
    (a worker that ignored it could hang its process's exit)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _agreed_point(proposal: int) -> int:
    """The stop point of every process: the first proposal written to the group's store."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return proposal - 1  # alone: stop at the point where the request was seen
    store = dist.distributed_c10d._get_default_store()
    return int(store.compare_set(_STORE_KEY, "", str(proposal)))


class StopRequest:
    """Counts the stop points of a training loop and says at which one to stop."""

    def __init__(self):
        self.point = 0
        self.stop_at: Optional[int] = None

    def due(self) -> bool:
        """Called at each stop point (the same ones in every process): whether to stop here."""
        self.point += 1
        if self.stop_at is None:
            signum = requested_signal()
            if signum is None:
                return False
            self.stop_at = _agreed_point(self.point + 1)
            logger.info("%s received: the run stops after the current step (a second signal "
                        "stops it at once, saving nothing)", signal_name(signum))
        return self.point >= self.stop_at

    @property
    def signum(self) -> int:
        return requested_signal() or signal.SIGTERM

    def stopped(self, message: str) -> RunStopped:
        return RunStopped(message, self.signum)

