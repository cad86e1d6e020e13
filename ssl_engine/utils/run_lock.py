"""One run per checkpoint folder: a lock file held for the life of a run.

``CHECKPOINT.DIR/.run.lock`` holds JSON ``{host, pid, started, start, processes}``: the
launching process (``start``: its start time in the kernel's clock ticks, which tells it from a
later process given the same pid) and the ``[pid, start]`` of each process it started. It is
written whole under a temporary name and linked into place, so of two launches only one gets
it and no launch ever sees it half-written; the other is refused, naming the holder. While the
run lives, a thread touches the file every HEARTBEAT_S seconds. A lock is stale, and taken over
with a warning, when its run is gone: on this host, when none of its processes exists any more
(a zombie counts as gone); from another host, when its heartbeat is older than STALE_AFTER_S (a
process killed on another node of a cluster leaves no other trace). An empty or unreadable
lock, which only a launch that failed while writing it leaves (a full disk), is stale.
"""
import errno
import json
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ssl_engine.utils.io import errno_text, os_error_text

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


def _proc_stat(pid: int) -> Optional[List[str]]:
    """The fields of /proc/<pid>/stat after the command name (state first), or None where
    there is no such file (the process is gone, or the system has no /proc)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return text[text.rfind(")") + 2:].split()


def process_start(pid: int) -> Optional[int]:
    """When process ``pid`` started, in clock ticks since boot (None without /proc): with its
    pid, it names one process, not a later one that got the same pid."""
    fields = _proc_stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_alive(pid: int, start: Optional[int] = None) -> bool:
    """Whether process ``pid`` runs, and is the one that started at ``start`` when given. A
    zombie (ended, not yet reaped by its parent) is not alive."""
    if not _pid_alive(pid):
        return False
    fields = _proc_stat(pid)
    if fields is None:  # no /proc here (or it ended just now): the pid's existence decides
        return True
    if fields[0] in ("Z", "X"):
        return False
    return start is None or len(fields) <= 19 or int(fields[19]) == start


def read_holder(folder) -> Optional[dict]:
    """The holder recorded in the folder's lock, with ``age`` (seconds since its last
    heartbeat) added; None when the folder is not locked. A lock that cannot be read (empty,
    damaged) has host and pid None."""
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
    pid = holder.get("pid")
    return {"host": holder.get("host"), "pid": pid if isinstance(pid, int) else None,
            "started": holder.get("started"), "start": _int_or_none(holder.get("start")),
            "processes": _process_list(holder.get("processes")), "age": age}


def _int_or_none(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _process_list(value) -> List[Tuple[int, Optional[int]]]:
    """The ``[pid, start]`` pairs of a lock's ``processes`` (what is not one is left out)."""
    pairs = []
    for item in value if isinstance(value, list) else []:
        if isinstance(item, list) and len(item) == 2 and _int_or_none(item[0]) is not None:
            pairs.append((item[0], _int_or_none(item[1])))
    return pairs


def _live_processes(holder: dict) -> List[int]:
    """The pids of ``holder``'s run (its launcher first) that still run on this host."""
    everyone = [(holder["pid"], holder["start"]), *holder["processes"]]
    return [pid for pid, start in everyone if process_alive(pid, start)]


def is_stale(holder: dict) -> bool:
    """Whether the run that wrote ``holder`` is gone (see the module's doc)."""
    if holder["pid"] is None:  # empty or unreadable: left by a launch that failed to write it
        return True
    if holder["host"] == _this_host():
        if not _live_processes(holder):
            return True
        # without start times (a lock of an earlier version, a system without /proc) a pid
        # may be a later process's: a silent lock is stale, as on another host
        return holder["start"] is None and holder["age"] > STALE_AFTER_S
    return holder["age"] > STALE_AFTER_S


def describe(holder: dict) -> str:
    if holder["pid"] is None:
        return "a run whose lock file cannot be read"
    text = (f"pid {holder['pid']} on host {holder['host']} (started {holder['started']}, "
            f"last sign of life {holder['age']:.0f} s ago)")
    if holder["host"] == _this_host() and holder["processes"]:
        live = _live_processes(holder)
        if live and live[0] != holder["pid"]:
            text += (f"; that launcher is gone, but process(es) {', '.join(map(str, live))} "
                     "of its run still run")
    return text


def refusal(folder, holder: dict) -> RunLockError:
    path = lock_path(folder)
    if holder["host"] is None:
        takeover = (f"the next launch takes a lock that names no host over {STALE_AFTER_S:.0f} "
                    "s after it was last written")
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
                       "started": time.strftime("%Y-%m-%d %H:%M:%S %z"),
                       "start": process_start(os.getpid()), "processes": []}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ acquiring
    def _write_record(self, path: Path, flags: int = os.O_TRUNC) -> None:
        """Write our record to ``path`` (flushed to disk); on failure nothing is left there."""
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | flags, 0o644)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(self.record, handle)
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException:
            path.unlink(missing_ok=True)
            raise

    def _temporary(self) -> Path:
        return self.path.with_name(f"{LOCK_NAME}.new.{self.record['pid']}")

    def _create(self) -> bool:
        """Create the lock file with our record, whole (written under a temporary name, then
        linked to the lock's); False if it already exists. OSError if it cannot be written."""
        temporary = self._temporary()
        self._write_record(temporary)
        try:
            os.link(temporary, self.path)
        except FileExistsError:
            return False
        except OSError as err:  # a file system without hard links: create it in place
            if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            try:
                self._write_record(self.path, os.O_EXCL)
            except FileExistsError:
                return False
        finally:
            temporary.unlink(missing_ok=True)
        return True

    def _unwritable(self, err: OSError) -> RunLockError:
        try:
            free = f"{shutil.disk_usage(self.folder).free / 2**20:.1f} MB free on its disk"
        except OSError:
            free = "its free space unknown"
        return RunLockError(
            f"config.CHECKPOINT.DIR={self.folder}: the run's lock file {LOCK_NAME} could not be "
            f"written: {errno_text(err)}, {free}. Free space there (or pick another DIR) and "
            "launch again")

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
        if holder["pid"] is None:
            logger.warning("took over the lock of %s: its lock file was empty or unreadable, as "
                           "a launch that failed while writing it leaves it", self.folder)
        else:
            logger.warning("took over the lock of %s: the run of %s is gone", self.folder,
                           describe(holder))

    def acquire(self) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RunLockError(f"config.CHECKPOINT.DIR={self.folder} cannot be created: "
                               f"{os_error_text(err)}") from None
        for _ in range(5):
            try:
                created = self._create()
            except OSError as err:
                raise self._unwritable(err) from None
            if created:
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
    def add_processes(self, pids: Sequence[int]) -> None:
        """Record the processes this run started (``pids``, on this host) in the lock: the run
        counts as alive while any of them is, should this process end before them. If the lock
        is no longer ours, or cannot be rewritten, it is left as it is (with a warning)."""
        holder = read_holder(self.folder)
        if not holder or (holder["host"], holder["pid"]) != (self.record["host"],
                                                              self.record["pid"]):
            return
        self.record["processes"] = [[pid, process_start(pid)] for pid in pids]
        temporary = self._temporary()
        try:
            self._write_record(temporary)
            os.replace(temporary, self.path)
        except OSError as err:
            temporary.unlink(missing_ok=True)
            logger.warning("could not record the processes of the run in its lock %s: %s",
                           self.path, errno_text(err))

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
