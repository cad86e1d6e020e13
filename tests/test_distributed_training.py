"""Two gloo processes with half the batch each train like one process with the whole batch."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine_utils import final_weights, run_engine, step_losses

REPO = Path(__file__).resolve().parents[1]

# GroupNorm: normalisation per sample, so the model's output does not depend on how the
# global batch is split over processes (batch norm would normalise per process).
COMMON = ["config.MODEL.TRUNK.RESNETS.NORM=GroupNorm", "config.LOG_FREQUENCY=1",
          "config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=24"]


def test_two_processes_match_one_process_on_the_same_global_batch(tmp_path):
    """The two processes meet through a file (DISTRIBUTED.INIT_METHOD=file); the default
    tcp:// set-up of two processes is the one of the batch-norm test below and of the
    torchrun comparison's spawned run."""
    run_engine(tmp_path / "one", COMMON + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"])
    run_engine(tmp_path / "two", COMMON + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                                           "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
                                           "config.DISTRIBUTED.INIT_METHOD=file"])
    one, two = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2, 3]
    for iteration in one:
        assert two[iteration] == pytest.approx(one[iteration], rel=1e-5, abs=1e-6)
    w1, w2 = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-5, msg=name)


def test_global_batch_norm_makes_two_processes_match_one_with_batch_norm(tmp_path):
    """MODEL.SYNC_BN_CONFIG with SYNC_BN_TYPE=all_reduce: batch norm over both processes'
    images, on gloo, so SimCLR with BatchNorm trains as one process on the global batch."""
    common = ["config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=true", "config.LOG_FREQUENCY=1",
              "config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16"]
    run_engine(tmp_path / "one", common + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"])
    run_engine(tmp_path / "two", common + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                                           "config.DISTRIBUTED.NUM_PROC_PER_NODE=2"])
    one, two = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2]
    for iteration in one:
        assert two[iteration] == pytest.approx(one[iteration], rel=1e-5, abs=1e-6)
    w1, w2 = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-5, msg=name)
    assert "batch norm synchronised over all processes (all_reduce)" in \
        (tmp_path / "two" / "log.txt").read_text()


def test_torch_sync_batch_norm_on_cpu_runs_as_global_batch_norm(tmp_path, caplog):
    """VISSL's GPU configs write SYNC_BN_TYPE=pytorch; on a CPU run the launcher's checked
    config synchronises with all_reduce (the run above), with one warning."""
    from ssl_engine.engines.prelaunch import load_checked_config
    from ssl_engine.models.sync_bn import check_sync_bn_config

    with caplog.at_level("WARNING", logger="ssl_engine"):
        _, cfg = load_checked_config([
            "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={tmp_path}",
            "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=true",
            "config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE=pytorch"])
    assert cfg.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE == "all_reduce"
    warnings = [r.getMessage() for r in caplog.records if "SYNC_BN_TYPE" in r.getMessage()]
    assert len(warnings) == 1 and "synchronised with all_reduce" in warnings[0]
    # a config that skipped composition is still refused, not run with SyncBatchNorm on a CPU
    cfg.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE = "pytorch"
    with pytest.raises(ValueError, match="SYNC_BN_TYPE=pytorch needs GPUs"):
        check_sync_bn_config(cfg.MODEL.SYNC_BN_CONFIG, cfg.MACHINE.DEVICE)


# a torchrun run of the quick config: 2 processes of 4 images, one epoch; a checkpoint every 2
# steps, resumed automatically, a short timeout for a group that lost a member (the elastic
# restart test's settings)
TORCHRUN_RUN = ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4", "config.LOG_FREQUENCY=1",
                "config.OPTIMIZER.num_epochs=1"]
ELASTIC = ["config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2", "config.CHECKPOINT.AUTO_RESUME=true",
           "config.DISTRIBUTED.TIMEOUT_MINUTES=0.5"]


@pytest.fixture(scope="module")
def torchrun_straight(tmp_path_factory) -> Path:
    """An uninterrupted run under ``torchrun --nproc_per_node=2 --master_port=...`` (its static
    rendezvous), with the elastic settings: the run of the two torchrun tests below."""
    from ssl_engine.engines.launcher import find_free_port

    folder = tmp_path_factory.mktemp("torchrun") / "straight"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         f"--master_port={find_free_port()}", str(REPO / "tools/run_distributed_engines.py"),
         "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={folder}",
         *TORCHRUN_RUN, *ELASTIC],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return folder


def test_torchrun_world_is_joined_not_respawned(tmp_path, torchrun_straight):
    """Under torchrun the launcher joins the 2-process world torchrun made; it trains exactly
    like the launcher's own 2 processes."""
    log = (torchrun_straight / "log.txt").read_text()
    assert "world=2 init=env://" in log
    run_engine(tmp_path / "spawned", TORCHRUN_RUN + ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2"])
    assert step_losses(torchrun_straight) == step_losses(tmp_path / "spawned")


def test_a_dead_rank_ends_the_run_with_one_message(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(repo / "tools/run_distributed_engines.py"),
         "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={tmp_path}",
         "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
         "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2",
         "config.TRAINER.TRAIN_STEP_NAME=kill_after_iteration"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "SSL_ENGINE_PLUGINS": "plugins.kill_step",
             "PYTHONPATH": str(repo / "tests"), "SSL_ENGINE_TEST_KILL_AT": "3",
             "SSL_ENGINE_TEST_KILL_RANK": "1"},
    )
    assert proc.returncode == 1
    assert "error: process 1 terminated with signal SIGKILL; the other processes were stopped" \
        in proc.stderr
    assert "Traceback" not in proc.stderr
    assert os.readlink(tmp_path / "checkpoint.torch") == "model_iteration2.torch"


def _read_bytes(path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a process that ended meanwhile
        return b""


def test_torchrun_restarts_a_killed_worker_and_the_run_ends_as_if_uninterrupted(
        tmp_path, torchrun_straight):
    """Elastic restart: rank 1 is killed after iteration 3 of torchrun's first attempt; torchrun
    starts the group again, which resumes from the checkpoint of iteration 2 and ends with the
    weights of an uninterrupted torchrun run (``torchrun_straight``).  (Each attempt sets its
    group up through keys of its own in the agent's store: before that, a restarted group often
    read the dead group's addresses and failed or hung, see the test below.)"""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from engine_utils import final_weights
    from ssl_engine.engines.launcher import find_free_port

    repo = Path(__file__).resolve().parents[1]

    def torchrun(folder, *extra, env=None):
        command = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
             "--max-restarts=5", "--rdzv-backend=c10d",
             f"--rdzv-endpoint=127.0.0.1:{find_free_port()}",
             str(repo / "tools/run_distributed_engines.py"), "config=test/quick_simclr_synthetic",
             f"config.CHECKPOINT.DIR={tmp_path / folder}", *TORCHRUN_RUN, *ELASTIC, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})},
        )
        try:
            _, stderr = command.communicate(timeout=240)
        finally:  # torchrun and its workers (in sessions of their own), also after a timeout
            for pid in [command.pid] + [int(p.name) for p in Path("/proc").iterdir()
                                        if p.name.isdigit() and str(tmp_path).encode() in
                                        _read_bytes(p / "cmdline")]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return SimpleNamespace(returncode=command.returncode, stderr=stderr)

    def failure_report(proc) -> str:
        """What the workers said (torchrun's own summary names only exit codes)."""
        said = [line for line in proc.stderr.splitlines()
                if "error" in line.lower() and "elastic/errors.html" not in line]
        return "\n".join(said[:40]) + "\n...\n" + proc.stderr[-1500:]

    proc = torchrun("elastic", "config.TRAINER.TRAIN_STEP_NAME=kill_after_iteration",
                    env={"SSL_ENGINE_PLUGINS": "plugins.kill_step",
                         "PYTHONPATH": str(repo / "tests"), "SSL_ENGINE_TEST_KILL_AT": "3",
                         "SSL_ENGINE_TEST_KILL_RANK": "1", "SSL_ENGINE_TEST_KILL_FIRST_ATTEMPT": "1"})
    assert proc.returncode == 0, failure_report(proc)
    assert "exitcode: -9" in proc.stderr  # the kill happened, and torchrun saw it
    assert "resuming from phase -1, iteration 2" in (tmp_path / "elastic" / "log.txt").read_text()
    straight, elastic = final_weights(torchrun_straight), final_weights(tmp_path / "elastic")
    for name, value in straight.items():
        assert torch.equal(elastic[name], value), name


def test_each_torchrun_attempt_sets_up_its_group_through_keys_of_its_own(monkeypatch):
    """The agent's store outlives a restarted worker group: the keys a group sets up with
    (ranks' addresses) must not be read by the next attempt, or its set-up connects to the
    dead group's ports (seen: 'connection refused', then hangs until the timeout)."""
    import datetime

    import torch.distributed as dist

    from ssl_engine.engines.launcher import find_free_port
    from ssl_engine.utils.distributed import elastic_attempt_store

    timeout = datetime.timedelta(seconds=10)
    port = find_free_port()
    agent_store = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timeout)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    assert elastic_attempt_store(2, timeout) is None  # no agent store: env:// as it is
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    first = elastic_attempt_store(2, timeout)
    first.set("rank_0", "address of the first group")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    second = elastic_attempt_store(2, timeout)
    assert not second.check(["rank_0"])  # the restarted group does not see the dead one's key
    second.set("rank_0", "address of the second group")
    assert first.get("rank_0") == b"address of the first group"
    assert agent_store.get("ssl_engine/attempt_1/rank_0") == b"address of the second group"
