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


def test_the_lock_counts_the_run_alive_while_any_of_its_processes_is(tmp_path, caplog):
    """The launcher killed, a process it started still running: the folder stays refused,
    naming that process; once it is gone too, the lock is taken over."""
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = RunLock(tmp_path)
        lock.acquire()
        lock.add_processes([rank.pid])
        record = json.loads((tmp_path / LOCK_NAME).read_text())
        assert record["processes"] == [[rank.pid, run_lock.process_start(rank.pid)]]
        lock._stop.set()  # the launcher dies: no release, no heartbeat
        record["pid"] = dead_pid()
        (tmp_path / LOCK_NAME).write_text(json.dumps(record))
        past = time.time() - run_lock.STALE_AFTER_S - 10  # long silent: on this host no matter
        os.utime(tmp_path / LOCK_NAME, (past, past))
        with pytest.raises(RunLockError, match=f"that launcher is gone, but process\\(es\\) "
                                               f"{rank.pid} of its run still run"):
            check_unlocked(tmp_path)
    finally:
        rank.kill()
        rank.wait()
    with caplog.at_level(logging.WARNING, logger="ssl_engine.utils.run_lock"):
        with RunLock(tmp_path):
            assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert f"the run of pid {record['pid']} on host" in caplog.text


def test_a_pid_taken_by_a_later_process_or_a_zombie_is_not_the_run(tmp_path):
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # ended, not reaped
    deadline = time.time() + 30
    while run_lock.process_alive(zombie.pid) and time.time() < deadline:
        time.sleep(0.02)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": "earlier",
          "start": run_lock.process_start(os.getpid())}
    (tmp_path / LOCK_NAME).write_text(json.dumps(me))
    with pytest.raises(RunLockError):
        check_unlocked(tmp_path)
    for record in ({**me, "start": me["start"] - 1},  # this pid, but a process started later
                   {**me, "pid": zombie.pid, "start": None}):
        (tmp_path / LOCK_NAME).write_text(json.dumps(record))
        check_unlocked(tmp_path)  # stale
    zombie.wait()


@pytest.mark.parametrize("content", ["", "{not json", '{"host": "vm", "pi'])
def test_an_empty_or_unreadable_lock_is_taken_over_with_a_warning(tmp_path, caplog, content):
    (tmp_path / LOCK_NAME).write_text(content)
    check_unlocked(tmp_path)
    with caplog.at_level(logging.WARNING, logger="ssl_engine.utils.run_lock"):
        with RunLock(tmp_path):
            assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert (f"took over the lock of {tmp_path}: its lock file was empty or unreadable, as a "
            "launch that failed while writing it leaves it") in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def _fill(folder):
    with open(folder / "fill", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass


def test_a_lock_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, capsys):
    from engine_utils import QUICK, small_tmpfs
    from ssl_engine.engines.launcher import main

    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        _fill(disk)
        folder = disk / "run"
        code = main([QUICK, f"config.CHECKPOINT.DIR={folder}"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert err.splitlines() == [
            f"error: config.CHECKPOINT.DIR={folder}: the run's lock file .run.lock could not be "
            "written: No space left on device (ENOSPC), 0.0 MB free on its disk. Free space "
            "there (or pick another DIR) and launch again"]
        assert list(folder.iterdir()) == []  # no empty lock, no temporary file
        (disk / "fill").unlink()
        check_unlocked(folder)
        with RunLock(folder):
            assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
