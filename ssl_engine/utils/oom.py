"""Telling a process killed for lack of memory from one killed otherwise.

The kernel's out-of-memory killer ends a process with SIGKILL, as ``kill -9`` does: the exit
status alone cannot tell them apart. The evidence read here, in order:

- the kernel's log (``/dev/kmsg``): "Out of memory: Killed process <pid> (...) ... anon-rss:...",
  or "Memory cgroup out of memory: Killed process <pid> ..." for a container's limit; it names
  the process and what it held when killed;
- the memory cgroup's count of out-of-memory kills (cgroup v2 ``memory.events``, v1
  ``memory.oom_control``), compared with its value before the run: it rose while the run
  was alive, but names no process.

With neither, nothing is claimed. This module imports nothing heavy: the command-line tool
starts its watch (``watch_parent``) before it imports torch.
"""
import os
import re
import select
import sys
from pathlib import Path
from typing import Optional

_KILLED = re.compile(r"(Memory cgroup out of memory|Out of memory)[^:]*: Killed process (\d+) "
                     r"\(([^)]*)\).*?anon-rss:(\d+)kB, file-rss:(\d+)kB, shmem-rss:(\d+)kB")


def kernel_oom_record(pid: int) -> Optional[dict]:
    """The kernel log's record of the out-of-memory kill of ``pid``: {"rss_bytes", "cgroup"}
    (``cgroup``: killed at a container's limit rather than the machine's), or None (no such
    record, or the kernel log cannot be read)."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    found = None
    try:
        while True:
            try:
                record = os.read(fd, 8192).decode("utf-8", "replace")
            except BlockingIOError:  # read to the end
                break
            except OSError:  # EPIPE: records overwritten while reading; go on
                continue
            match = _KILLED.search(record)
            if match and int(match.group(2)) == pid:
                rss_kb = sum(int(match.group(i)) for i in (4, 5, 6))
                found = {"rss_bytes": rss_kb * 1024,
                         "cgroup": match.group(1).startswith("Memory cgroup")}
    finally:
        os.close(fd)
    return found


def _memory_cgroup() -> Optional[Path]:
    """This process's memory cgroup folder (v2 unified, or v1's memory controller)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "memory":
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    for line in lines:
        if line.startswith("0::"):
            return Path("/sys/fs/cgroup") / line[3:].lstrip("/")
    return None


def cgroup_oom_kills() -> Optional[int]:
    """How many processes this process's memory cgroup has had killed for lack of memory
    (None where no cgroup counts them)."""
    folder = _memory_cgroup()
    if folder is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (folder / name).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    return None


def oom_evidence(pid: int, kills_before: Optional[int]) -> Optional[str]:
    """What says that ``pid`` (ended by SIGKILL) was killed for lack of memory, as words for a
    message; None when nothing does."""
    record = kernel_oom_record(pid)
    if record is not None:
        where = "this container's memory limit" if record["cgroup"] else "the machine's memory"
        return (f"it held {record['rss_bytes'] / 2**30:.2f} GiB when the kernel killed it for "
                f"lack of memory ({where} ran out; the kernel log's out-of-memory record)")
    kills = cgroup_oom_kills()
    if kills is not None and kills_before is not None and kills > kills_before:
        return ("this container's count of processes killed for lack of memory rose while the "
                "run was alive (its memory cgroup's oom_kill)")
    return None


def lower_memory_hint() -> str:
    """What to lower when a run ran out of memory."""
    return ("lower config.DATA.TRAIN.BATCHSIZE_PER_REPLICA, use fewer or smaller crops "
            "(config.DATA.TRAIN.TRANSFORMS) or fewer data-loader workers "
            "(config.DATA.NUM_DATALOADER_WORKERS); checkpoints already written are intact: "
            "then run again with config.CHECKPOINT.AUTO_RESUME=true")


class ParentWatch:
    """The parent's side of ``watch_parent``: ``finished()`` before a normal exit."""

    def __init__(self, write_fd: Optional[int]):
        self.write_fd = write_fd

    def finished(self) -> None:
        if self.write_fd is not None:
            try:
                os.write(self.write_fd, b"finished")
                os.close(self.write_fd)
            except OSError:
                pass
            self.write_fd = None


def watch_parent() -> ParentWatch:
    """Fork a small watcher of this process: if this process ends without calling
    ``finished()`` and the evidence (``oom_evidence``) says it was killed for lack of memory,
    the watcher writes one ``error:`` line saying so on stderr. Call it before importing
    torch (the watcher is a copy of this process as it is then). Where fork is unavailable,
    watches nothing."""
    if not hasattr(os, "fork"):
        return ParentWatch(None)
    kills_before = cgroup_oom_kills()
    read_fd, write_fd = os.pipe()
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() != 0:
        os.close(read_fd)
        return ParentWatch(write_fd)
    os.close(write_fd)
    code = 0
    try:
        os.setsid()  # a terminal's Ctrl-C goes to the run, not to its watcher
        received = b""
        while True:  # until the parent says it finished, or its end of the pipe closes
            select.select([read_fd], [], [])
            chunk = os.read(read_fd, 64)
            if not chunk:
                break
            received += chunk
            if b"finished" in received:  # its loader workers may still hold the pipe
                break
        if b"finished" not in received:
            evidence = oom_evidence(parent, kills_before)
            if evidence is not None:
                print(f"error: the run (pid {parent}) ran out of memory: {evidence}; "
                      f"{lower_memory_hint()}", file=sys.stderr, flush=True)
    except BaseException:  # the watcher never fails the run
        code = 0
    finally:
        os._exit(code)
