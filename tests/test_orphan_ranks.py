"""A run whose launcher is killed (``kill -9``: the out-of-memory killer, a scheduler) does not
train on without it: its processes and their data-loader workers end within seconds, and a
relaunch into its folder takes the lock over and resumes alone (DDP and FSDP, 2 processes)."""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from engine_utils import QUICK, metrics
from ssl_engine.utils.run_lock import LOCK_NAME, process_alive

REPO = Path(__file__).resolve().parents[1]
TASKS = {"ddp": [], "fsdp": ["config.TRAINER.TASK_NAME=self_supervision_fsdp_task"]}
RUN = ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
       "config.LOG_FREQUENCY=1", "config.SEED_VALUE=0"]
# the first launch: a worker per process, a checkpoint per step (the relaunch goes without)
FIRST = ["config.DATA.NUM_DATALOADER_WORKERS=1", "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1",
         "config.OPTIMIZER.num_epochs=50"]
ITERATIONS_PER_EPOCH = 4  # 32 samples, 2 processes of 4
GONE_WITHIN_S = 5.0


def _command(folder: Path, args) -> List[str]:
    return [sys.executable, str(REPO / "tools/run_distributed_engines.py"), QUICK,
            f"config.CHECKPOINT.DIR={folder}", *args]


def _descendants(pid: int) -> List[int]:
    found, queue = [], [pid]
    while queue:
        parent = queue.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
            found.extend(children)
            queue.extend(children)
    return found


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _saved_iteration(checkpoint: str) -> int:
    """The iteration of a step's or an epoch's checkpoint file name."""
    step = re.fullmatch(r"model_iteration(\d+)\.torch", checkpoint)
    if step:
        return int(step.group(1))
    return (int(re.fullmatch(r"model_phase(\d+)\.torch", checkpoint).group(1)) + 1) * \
        ITERATIONS_PER_EPOCH


def _alive(pids) -> List[int]:
    return [pid for pid in pids if process_alive(pid)]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc")
@pytest.mark.parametrize("task", sorted(TASKS))
def test_killing_the_launcher_ends_its_processes_and_a_relaunch_resumes_alone(tmp_path, task):
    folder = tmp_path / "run"
    args = [*RUN, *TASKS[task]]
    with open(tmp_path / "first.err", "w") as first_err:
        launcher = subprocess.Popen(
            _command(folder, [*args, *FIRST]),
            stdout=subprocess.DEVNULL, stderr=first_err)
    everyone: List[int] = []
    try:
        deadline = time.monotonic() + 120
        while not (folder / "checkpoint.torch").exists():  # it trains: a step is saved
            assert launcher.poll() is None, (tmp_path / "first.err").read_text()
            assert time.monotonic() < deadline, "no checkpoint after 120 s"
            time.sleep(0.05)
        record = json.loads((folder / LOCK_NAME).read_text())
        ranks = [pid for pid, _ in record["processes"]]
        everyone = _descendants(launcher.pid)
        assert record["pid"] == launcher.pid and len(ranks) == 2
        assert set(ranks) <= set(everyone)
        assert sum(_name(pid) == "pt_data_worker" for pid in everyone) >= 2, everyone

        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + GONE_WITHIN_S
        while _alive(everyone) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _alive(everyone) == [], {pid: _name(pid) for pid in _alive(everyone)}
    finally:
        launcher.kill()
        for pid in _alive(everyone):  # what a failed check leaves running
            os.kill(pid, 9)
    for rank in ranks:
        assert f"(pid {rank}) ends: its launcher (pid {launcher.pid}) is gone" in \
            (tmp_path / "first.err").read_text()

    saved = _saved_iteration(os.readlink(folder / "checkpoint.torch"))
    epochs = saved // ITERATIONS_PER_EPOCH + 1  # the relaunch ends the epoch it resumes in
    relaunch = subprocess.run(_command(folder, [*args, f"config.OPTIMIZER.num_epochs={epochs}"]),
                              capture_output=True, text=True, timeout=300)
    assert relaunch.returncode == 0, relaunch.stderr
    assert f"took over the lock of {folder}: the run of pid {launcher.pid} on host" in \
        relaunch.stderr
    steps = [row["iteration"] for row in metrics(folder) if row.get("phase") == "train"]
    assert len(steps) == len(set(steps)), steps  # nobody else wrote into the folder
    assert max(steps) == epochs * ITERATIONS_PER_EPOCH
    assert os.readlink(folder / "checkpoint.torch") == \
        f"model_final_checkpoint_phase{epochs - 1}.torch"
    assert not (folder / LOCK_NAME).exists()
