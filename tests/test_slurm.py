"""config.SLURM.USE_SLURM through submitit, on its local executor (no SLURM here): the command
submits, prints the job id and log folder and (locally) waits for the job; a job signalled as
SLURM does before preemption requeues itself and resumes from its last checkpoint, ending with
the weights of an uninterrupted run."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from engine_utils import QUICK, final_weights, run_engine
from ssl_engine.config import load_config
from ssl_engine.engines.slurm import executor_parameters, submit

REPO = Path(__file__).resolve().parents[1]


def test_the_command_submits_prints_the_job_and_waits_for_it_locally(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"), QUICK,
         f"config.CHECKPOINT.DIR={tmp_path / 'run'}", "config.OPTIMIZER.num_epochs=1",
         "config.SLURM.USE_SLURM=true", f"config.SLURM.LOG_FOLDER={tmp_path / 'logs'}"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    job_id = proc.stdout.split("submitted job ")[1].split(";")[0]
    assert f"its logs: {tmp_path / 'logs'}" in proc.stdout
    assert (tmp_path / "logs" / f"{job_id}_0_log.out").exists()
    assert (tmp_path / "run" / "model_final_checkpoint_phase0.torch").exists()


def test_slurm_settings_map_to_submitit_parameters():
    _, cfg = load_config([QUICK, "config.SLURM.USE_SLURM=true", "config.SLURM.PARTITION=learn",
                          "config.SLURM.TIME_HOURS=2",
                          "config.SLURM.TIME_MINUTES=30", "config.DISTRIBUTED.NUM_NODES=2",
                          "config.DISTRIBUTED.NUM_PROC_PER_NODE=4", "config.MACHINE.DEVICE=gpu",
                          "config.SLURM.NUM_CPU_PER_PROC=10",
                          "+config.SLURM.ADDITIONAL_PARAMETERS.account=vision"])
    params = executor_parameters(cfg)
    assert params["timeout_min"] == 150 and params["nodes"] == 2
    assert params["tasks_per_node"] == 1 and params["gpus_per_node"] == 4
    assert params["cpus_per_task"] == 40 and params["slurm_partition"] == "learn"
    assert params["slurm_additional_parameters"] == {"account": "vision"}


def test_a_preempted_job_requeues_and_resumes_from_its_last_checkpoint(tmp_path, monkeypatch):
    started, go = tmp_path / "started", tmp_path / "go"
    monkeypatch.setenv("SSL_ENGINE_PLUGINS", "plugins.wait_step")
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tests"))
    monkeypatch.setenv("SSL_ENGINE_TEST_STARTED", str(started))
    monkeypatch.setenv("SSL_ENGINE_TEST_GO", str(go))
    monkeypatch.setenv("SSL_ENGINE_TEST_WAIT_AT", "2")  # iteration 1's checkpoint is written
    common = ["config.OPTIMIZER.num_epochs=1", "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1",
              "config.LOG_FREQUENCY=1"]
    _, cfg = load_config([QUICK, f"config.CHECKPOINT.DIR={tmp_path / 'job'}", *common,
                          "config.TRAINER.TRAIN_STEP_NAME=wait_for_go",  # holds at iteration 2
                          "config.SLURM.USE_SLURM=true",
                          f"config.SLURM.LOG_FOLDER={tmp_path / 'logs'}"])
    job = submit(cfg, "train", cluster="local")
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists(), job.stderr()
    # the signal SLURM sends to a job's tasks before preemption or the time limit (sent to the
    # task itself: submitit's local controller does not forward it)
    task_pid = int(Path(f"/proc/{job._process.pid}/task/{job._process.pid}/children")
                   .read_text().split()[0])
    os.kill(task_pid, signal.SIGUSR2)
    time.sleep(0.3)  # handled at once: the first attempt never sees the go-ahead
    go.touch()
    job.result()
    log = (tmp_path / "job" / "log.txt").read_text()
    assert "resuming from phase -1, iteration 1" in log
    assert "Requeued job" in (job.stderr() or "") + (job.stdout() or "")
    run_engine(tmp_path / "straight", common)
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "job")
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name
