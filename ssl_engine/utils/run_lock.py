"""One run per checkpoint folder: a lock file held for the life of a run.

``CHECKPOINT.DIR/.run.lock`` holds JSON ``{host, pid, started}`` of the launching process. It
is created atomically (``O_CREAT | O_EXCL``), so of two launches only one gets it; the other
is refused, naming the holder. While the run lives, a thread touches the file every
HEARTBEAT_S seconds. A lock is stale, and taken over with a warning, when its process is gone:
on this host, when its pid no longer exists; on any host, when its heartbeat is older than
STALE_AFTER_S (a process killed on another node of a cluster leaves no other trace).
"""
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Optional

from ssl_engine.utils.io import os_error_text

logger = logging.getLogger(__name__)

LOCK_NAME = ".run.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0


class RunLockError(RuntimeError):
    """The folder is in use by another run that is alive."""


def lock_path(folder) -> Path:
    return Path(folder) / LOCK_NAME


def _this_host() -> str:
    return socket.gethostname()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def read_holder(folder) -> Optional[dict]:
    """The holder recorded in the folder's lock, with ``age`` (seconds since its last
    heartbeat) added; None when the folder is not locked. A lock that cannot be read (being
    written, or damaged) has host and pid None."""
    return _read_lock_file(lock_path(folder))


def _read_lock_file(path: Path) -> Optional[dict]:
    try:
        age = time.time() - path.stat().st_mtime
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError):  # no lock (a file where its folder would be)
        return None
    except IsADirectoryError:
        raise RunLockError(f"{path} is a folder, not the lock file of a run: remove it (the "
                           "engine creates that file to keep two runs out of one folder)") from None
    try:
        holder = json.loads(text)
    except ValueError:
        holder = None
    if not isinstance(holder, dict):
        holder = {}
    return {"host": holder.get("host"), "pid": holder.get("pid"),
            "started": holder.get("started"), "age": age}


def is_stale(holder: dict) -> bool:
    """Whether the process that wrote ``holder`` is gone (see the module's doc)."""
    if holder["age"] > STALE_AFTER_S:
        return True
    if holder["host"] == _this_host() and isinstance(holder["pid"], int):
        return not _pid_alive(holder["pid"])
    return False


def describe(holder: dict) -> str:
    if holder["pid"] is None:
        return "a run whose lock file cannot be read"
    return (f"pid {holder['pid']} on host {holder['host']} (started {holder['started']}, "
            f"last sign of life {holder['age']:.0f} s ago)")


def refusal(folder, holder: dict) -> RunLockError:
    path = lock_path(folder)
    if holder["host"] is None:
        takeover = (f"the next launch takes an unreadable lock over {STALE_AFTER_S:.0f} s after "
                    "it was last written")
    else:
        takeover = (f"the next launch takes its lock over (on host {holder['host']} at once, "
                    f"from another host {STALE_AFTER_S:.0f} s after its last sign of life)")
    return RunLockError(
        f"config.CHECKPOINT.DIR={folder} is in use by another run: {describe(holder)}. Two runs "
        f"in one folder overwrite each other's checkpoints: wait for that run to end, or pick "
        f"another DIR. If that run is gone, {takeover}, or delete {path}"
    )


def check_unlocked(folder) -> None:
    """Raise RunLockError if a live run holds ``folder`` (a stale lock is not an obstacle)."""
    holder = read_holder(folder)
    if holder is not None and not is_stale(holder):
        raise refusal(folder, holder)


class RunLock:
    """The lock of ``folder`` for a ``with`` block: acquired on entry (RunLockError if a live
    run holds it), heartbeat while held, released on exit (only if still ours)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.path = lock_path(folder)
        self.record = {"host": _this_host(), "pid": os.getpid(),
                       "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ acquiring
    def _create(self) -> bool:
        """Create the lock file with our record; False if it already exists."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            json.dump(self.record, handle)
            handle.flush()
            os.fsync(handle.fileno())
        return True

    def _take_over(self, holder: dict) -> None:
        """Remove the stale lock ``holder`` describes, unless another launch replaced it
        meanwhile (it is moved aside first, and put back if it is no longer that one)."""
        aside = self.path.with_name(f"{LOCK_NAME}.stale.{self.record['pid']}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another launch took it over first: try again
        moved = _read_lock_file(aside) or {}
        if (moved.get("host"), moved.get("pid"), moved.get("started")) != (
                holder["host"], holder["pid"], holder["started"]):
            try:  # a fresh lock of another launch: put it back
                os.link(aside, self.path)
            except FileExistsError:
                pass
            aside.unlink(missing_ok=True)
            return
        aside.unlink(missing_ok=True)
        logger.warning("took over the lock of %s: the run of %s is gone", self.folder,
                       describe(holder))

    def acquire(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RunLockError(f"config.CHECKPOINT.DIR={self.folder} cannot be created: "
                               f"{os_error_text(err)}") from None
        for _ in range(5):
            if self._create():
                self._start_heartbeat()
                return
            holder = read_holder(self.folder)
            if holder is None:
                continue  # released meanwhile
            if not is_stale(holder):
                raise refusal(self.folder, holder)
            self._take_over(holder)
        raise RunLockError(f"could not take the lock {self.path}: other launches keep "
                           "taking it; launch one run at a time")

    # ------------------------------------------------------------------ holding
    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="run-lock")
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError as err:  # a file-system hiccup: the next beat tries again
                logger.warning("could not refresh the run lock %s: %s", self.path, err)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        holder = read_holder(self.folder)
        if holder and (holder["host"], holder["pid"]) == (self.record["host"], self.record["pid"]):
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "RunLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
