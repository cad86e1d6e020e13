"""The test session's temporary files stay in its own temporary tree; a command-line run of the
quick config that several test files compare with; under pytest-xdist each worker's own torch
takes its share of the cores."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKER_THREADS = {}  # "threads": this pytest-xdist worker's share of the cores


def xdist_worker_threads():
    """Compute threads for the torch of a pytest-xdist worker (``-n N``): its share of the
    cores this process may run on, at least 1; None outside xdist or with one worker."""
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if not os.environ.get("PYTEST_XDIST_WORKER") or count < 2:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
    return max(1, cores // count)


def pytest_configure(config):
    """Under ``-n N`` the tests' own torch (and a subprocess's before the engine sizes its
    threads from the cores, ssl_engine/utils/cpu_budget.py) runs its share of the cores'
    threads, so that N workers do not spin more compute threads than there are cores."""
    threads = xdist_worker_threads()
    if threads is None:
        return
    WORKER_THREADS["threads"] = threads
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


@pytest.fixture(autouse=True)
def worker_threads_after_each_test():
    """An engine run inside a test sets torch's threads to its own cores' count: under ``-n N``
    the worker's share is given back after the test."""
    yield
    threads = WORKER_THREADS.get("threads")
    torch = sys.modules.get("torch")
    if threads and torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def session_temporary_folder(tmp_path_factory):
    """TMPDIR (and Python's cached temporary folder) of this session and of every process it
    starts: a folder under pytest's temporary tree. Temporary folders that a process makes and
    would remove at its exit stay behind when it ends without Python's clean-up (a rank that
    leaves with os._exit, a killed process): W&B makes two at import (``wandb-media``,
    ``wandb-artifacts``), and timm imports W&B, so every process with a ViT makes them."""
    folder = tmp_path_factory.mktemp("tmpdir")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(folder))
        yield folder


@pytest.fixture(scope="session")
def quick_straight_run(tmp_path_factory, session_temporary_folder) -> Path:
    """The folder of an uninterrupted command-line run of config=test/quick_simclr_synthetic
    (2 epochs of 4 steps, a log line per step, checkpoints at iterations 3 and 6 and at the
    epoch ends): the run whose final weights the stopped-and-resumed runs of
    tests/test_train_engine.py and tests/test_stop_signals.py end with."""
    folder = tmp_path_factory.mktemp("quick_straight_run")
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"),
         "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={folder}",
         "config.LOG_FREQUENCY=1", "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return folder
