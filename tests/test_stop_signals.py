"""SIGTERM and SIGINT (Ctrl-C) end a training run cleanly: the step ends, a checkpoint of it is
written, one line says where, the lock is released, the exit code is 128 + the signal; the
run resumed from there ends with the weights of a run that was never stopped. A second signal
ends it at once."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine_utils import QUICK, final_weights

REPO = Path(__file__).resolve().parents[1]
TWO_PROCS = ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"]


def _command(folder: Path, args):
    return [sys.executable, str(REPO / "tools/run_distributed_engines.py"), QUICK,
            f"config.CHECKPOINT.DIR={folder}", "config.LOG_FREQUENCY=1", *args]


def _run(folder: Path, args):
    proc = subprocess.run(_command(folder, args), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc


def _start_waiting(folder: Path, args, wait_at: int, go_on_signal: bool):
    """The run, held at iteration ``wait_at`` (tests/plugins/wait_step.py) in a session of its
    own, as a terminal's job is; returns it once it waits."""
    started = folder.parent / f"{folder.name}.started"
    env = {**os.environ, "SSL_ENGINE_PLUGINS": "plugins.wait_step",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
           "SSL_ENGINE_TEST_STARTED": str(started), "SSL_ENGINE_TEST_WAIT_AT": str(wait_at),
           "SSL_ENGINE_TEST_GO_ON_SIGNAL": "1" if go_on_signal else ""}
    proc = subprocess.Popen(_command(folder, [*args, "config.TRAINER.TRAIN_STEP_NAME=wait_for_go"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    _wait_for(started, proc)
    return proc, started


def _wait_for(path: Path, proc) -> None:
    deadline = time.monotonic() + 120
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not path.exists():
        proc.kill()
        raise AssertionError(f"{path} never appeared: {proc.communicate()[1]}")


def _assert_weights_equal(a: Path, b: Path) -> None:
    first, second = final_weights(a), final_weights(b)
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def _leftovers(folder: Path):
    return sorted(p.name for p in folder.iterdir()
                  if p.name.endswith(".tmp") or p.name.startswith((".run.lock", ".rank_reports")))


def _stop_line(signame: str, folder: Path, iteration: int) -> str:
    return (f"stopped by {signame} after iteration {iteration}: the last checkpoint saved is "
            f"{folder / f'model_iteration{iteration}.torch'} (checkpoint.torch points to it); "
            "run again with config.CHECKPOINT.AUTO_RESUME=true to continue from it")


def test_sigterm_saves_the_step_and_the_resumed_run_ends_bit_exact(tmp_path, quick_straight_run):
    """Stopped after the last step of the first epoch (4 steps), before its end: the resumed
    run ends that epoch, then trains the second, to the weights of the uninterrupted run
    (conftest.py's, which also saves at iterations 3 and 6)."""
    folder = tmp_path / "stopped"
    proc, _ = _start_waiting(folder, [], wait_at=4, go_on_signal=True)
    proc.send_signal(signal.SIGTERM)  # the launcher only, as `kill -TERM <pid>` does
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == [_stop_line("SIGTERM", folder, 4)]
    assert os.readlink(folder / "checkpoint.torch") == "model_iteration4.torch"
    assert _leftovers(folder) == []  # no temporary file, the lock released

    _run(folder, ["config.CHECKPOINT.AUTO_RESUME=true"])
    _assert_weights_equal(quick_straight_run, folder)


def test_ctrl_c_to_two_processes_and_their_workers_stops_them_at_one_step(tmp_path):
    """SIGINT to the whole process group (a terminal's Ctrl-C: the launcher, both processes and
    their data-loader workers get it): both processes stop after the same step and save it.
    (That a run resumed from such a checkpoint ends bit-exact is the SIGTERM test's claim, and
    the two-process resume tests'.)"""
    args = [*TWO_PROCS, "config.DATA.NUM_DATALOADER_WORKERS=1", "config.OPTIMIZER.num_epochs=1"]
    folder = tmp_path / "stopped"
    proc, _ = _start_waiting(folder, args, wait_at=2, go_on_signal=True)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    # the processes agree on the step after the one where they saw the signal
    assert err.strip().splitlines() == [_stop_line("SIGINT", folder, 3)]
    assert os.readlink(folder / "checkpoint.torch") == "model_iteration3.torch"
    assert _leftovers(folder) == []


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_second_signal_stops_at_once_saving_nothing(tmp_path, nproc):
    folder = tmp_path / "run"
    proc, started = _start_waiting(folder, TWO_PROCS if nproc == 2 else [], wait_at=2,
                                   go_on_signal=False)
    proc.send_signal(signal.SIGTERM)
    _wait_for(Path(f"{started}.signal"), proc)  # the first one was noted
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)  # the step still waits: only an abort ends it
    if nproc == 1:  # the signal's default action
        assert proc.returncode == -signal.SIGTERM, err
    else:  # the launcher kills its processes
        assert proc.returncode == 143, err
        assert err.strip().splitlines() == [
            "error: stopped at once by a second SIGTERM: the processes were killed without "
            "saving. Checkpoints already written are intact: run again with "
            "config.CHECKPOINT.AUTO_RESUME=true"]
    assert not list(folder.glob("model_*.torch"))


def test_without_save_on_sigterm_the_run_stops_saving_nothing(tmp_path):
    folder = tmp_path / "run"
    proc, _ = _start_waiting(folder, ["config.CHECKPOINT.SAVE_ON_SIGTERM=false"], wait_at=1,
                             go_on_signal=True)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == [
        "stopped by SIGTERM after iteration 1 without saving "
        "(config.CHECKPOINT.SAVE_ON_SIGTERM=false): no checkpoint had been saved yet, so a new "
        "run starts from the beginning"]
    assert not list(folder.glob("*.torch"))
    assert _leftovers(folder) == []
