"""The lock of a checkpoint folder: one live run at a time, stale locks taken over."""
import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from ssl_engine.utils import run_lock
from ssl_engine.utils.run_lock import LOCK_NAME, RunLock, RunLockError, check_unlocked


def write_lock(folder, host, pid, age=0.0):
    path = folder / LOCK_NAME
    path.write_text(json.dumps({"host": host, "pid": pid, "started": "earlier"}))
    past = time.time() - age
    os.utime(path, (past, past))
    return path


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_names_its_holder_and_is_released(tmp_path):
    with RunLock(tmp_path):
        record = json.loads((tmp_path / LOCK_NAME).read_text())
        assert record["host"] == socket.gethostname() and record["pid"] == os.getpid()
        assert record["started"]
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_second_lock_of_a_live_run_is_refused_naming_it(tmp_path):
    with RunLock(tmp_path):
        expected = f"is in use by another run: pid {os.getpid()} on host {socket.gethostname()}"
        with pytest.raises(RunLockError, match=expected):
            check_unlocked(tmp_path)
        with pytest.raises(RunLockError, match=expected):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / LOCK_NAME).exists()  # the refused one did not remove the lock


def test_released_on_error(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with RunLock(tmp_path):
            1 / 0
    assert not (tmp_path / LOCK_NAME).exists()


def test_lock_of_a_dead_process_on_this_host_is_taken_over(tmp_path, caplog):
    pid = dead_pid()
    write_lock(tmp_path, socket.gethostname(), pid)
    check_unlocked(tmp_path)  # not an obstacle
    with caplog.at_level(logging.WARNING, logger="ssl_engine.utils.run_lock"):
        with RunLock(tmp_path):
            assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert f"took over the lock of {tmp_path}: the run of pid {pid} on host" in caplog.text
    assert not any(p.name.startswith(LOCK_NAME + ".") for p in tmp_path.iterdir())


def test_lock_of_another_host_is_stale_only_without_heartbeat(tmp_path):
    write_lock(tmp_path, "node-17", 4242, age=10)
    with pytest.raises(RunLockError, match="pid 4242 on host node-17"):
        RunLock(tmp_path).acquire()
    write_lock(tmp_path, "node-17", 4242, age=run_lock.STALE_AFTER_S + 10)
    with RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_heartbeat_keeps_the_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    with RunLock(tmp_path):
        old = time.time() - 1000
        os.utime(tmp_path / LOCK_NAME, (old, old))
        time.sleep(0.3)
        assert run_lock.read_holder(tmp_path)["age"] < 10


def test_release_leaves_a_lock_that_is_no_longer_ours(tmp_path):
    lock = RunLock(tmp_path)
    lock.acquire()
    write_lock(tmp_path, "node-3", 77)  # replaced meanwhile (deleted by hand, relaunched)
    lock.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["host"] == "node-3"
