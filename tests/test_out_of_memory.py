"""A run killed for lack of memory says so in one line: under a memory cgroup with a limit,
a train step that grows past it is ended by the kernel's out-of-memory killer (SIGKILL, as
``kill -9``), with 1 process (the launcher itself is killed: its watcher reports) and with 2
(the launcher reports the rank). A run killed otherwise is not said to have run out of
memory. Skipped where no memory cgroup can be made (not root, no cgroup file system)."""
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ssl_engine.utils.oom import _memory_cgroup, kernel_oom_record

REPO = Path(__file__).resolve().parents[1]
LIMIT = 3 * 2**30


def make_memory_cgroup(limit: int):
    """A child of this process's memory cgroup limited to ``limit`` bytes, or None."""
    own = _memory_cgroup()
    if own is None:
        return None
    folder = own / f"ssl_engine_test_{uuid.uuid4().hex[:8]}"
    limit_file = "memory.limit_in_bytes" if "/memory" in str(own) else "memory.max"
    try:
        folder.mkdir()
        (folder / limit_file).write_text(str(limit))
        if limit_file == "memory.limit_in_bytes":  # no swap to escape to
            try:
                (folder / "memory.memsw.limit_in_bytes").write_text(str(limit))
            except OSError:
                pass
        else:
            (folder / "memory.swap.max").write_text("0")
    except OSError:
        if folder.exists():
            folder.rmdir()
        return None
    return folder


@pytest.fixture
def memory_cgroup():
    folder = make_memory_cgroup(LIMIT)
    if folder is None:
        pytest.skip("no memory cgroup can be made here")
    yield folder
    for _ in range(100):  # its last processes (the watcher, loader workers) may still end
        try:
            folder.rmdir()
            return
        except OSError:
            time.sleep(0.1)


def run_in(cgroup: Path, tmp_path: Path, *overrides, env=None):
    command = [sys.executable, str(REPO / "tools/run_distributed_engines.py"),
               "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={tmp_path}",
               "config.DATA.NUM_DATALOADER_WORKERS=auto",
               "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1", *overrides]
    shell = f'echo $$ > {cgroup}/cgroup.procs && exec "$@"'
    return subprocess.run(["bash", "-c", shell, "bash", *command], capture_output=True,
                          text=True, timeout=300, cwd=REPO,
                          env={**os.environ, "SSL_ENGINE_PLUGINS": env["plugin"],
                               "PYTHONPATH": str(REPO / "tests"), **env["vars"]})


EAT = {"plugin": "plugins.eat_memory", "vars": {"SSL_ENGINE_TEST_EAT_AT": "2"}}


def assert_one_oom_line(stderr: str, who: str):
    lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    line = lines[0]
    assert line.startswith(f"error: {who}") and "ran out of memory" in line
    assert "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA" in line
    assert "config.DATA.NUM_DATALOADER_WORKERS" in line and "AUTO_RESUME" in line
    assert "Traceback" not in stderr
    return line


def test_one_process_killed_for_lack_of_memory_says_so(memory_cgroup, tmp_path):
    proc = run_in(memory_cgroup, tmp_path, "config.TRAINER.TRAIN_STEP_NAME="
                  "eat_memory_after_iteration", env=EAT)
    assert proc.returncode == -9 or proc.returncode == 137, proc.stderr
    line = assert_one_oom_line(proc.stderr, "the run (pid ")
    assert "GiB when the kernel killed it" in line or "oom_kill" in line
    # the step of iteration 2 grew: its checkpoint (saved after the step) was never written
    assert os.readlink(tmp_path / "checkpoint.torch") == "model_iteration1.torch"


def test_a_rank_killed_for_lack_of_memory_says_so(memory_cgroup, tmp_path):
    env = {**EAT, "vars": {**EAT["vars"], "SSL_ENGINE_TEST_EAT_RANK": "1"}}
    proc = run_in(memory_cgroup, tmp_path, "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
                  "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                  "config.TRAINER.TRAIN_STEP_NAME=eat_memory_after_iteration", env=env)
    assert proc.returncode == 1, proc.stderr
    line = assert_one_oom_line(proc.stderr, "process 1 (pid ")
    pid = int(line.split("(pid ")[1].split(")")[0])
    record = kernel_oom_record(pid)
    if record is not None:  # the kernel log is readable here: the line gives its figure
        assert f"{record['rss_bytes'] / 2**30:.2f} GiB" in line


def test_a_run_killed_otherwise_is_not_said_to_have_run_out_of_memory(memory_cgroup, tmp_path):
    """1 process killed by ``kill -9`` under the same limit: the watcher finds no record of an
    out-of-memory kill and says nothing (the launcher's own check reads the same evidence)."""
    env = {"plugin": "plugins.kill_step", "vars": {"SSL_ENGINE_TEST_KILL_AT": "2"}}
    proc = run_in(memory_cgroup, tmp_path, "config.TRAINER.TRAIN_STEP_NAME=kill_after_iteration",
                  env=env)
    assert proc.returncode in (-9, 137)
    assert "memory" not in proc.stderr and "error:" not in proc.stderr, proc.stderr
