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
from ssl_engine.engines.slurm import executor_parameters

REPO = Path(__file__).resolve().parents[1]


def test_slurm_settings_map_to_submitit_parameters():
    _, cfg = load_config([QUICK, "config.SLURM.USE_SLURM=true", "config.SLURM.PARTITION=learn",
                          "config.SLURM.TIME_HOURS=2",
                          "config.SLURM.TIME_MINUTES=30", "config.DISTRIBUTED.NUM_NODES=2",
                          "config.DISTRIBUTED.NUM_PROC_PER_NODE=4", "config.MACHINE.DEVICE=gpu",
                          "config.SLURM.NUM_CPU_PER_PROC=10",
                          "+config.SLURM.ADDITIONAL_PARAMETERS.account=vision"])
    params = executor_parameters(cfg)  # (no GPU here: checked on the job's nodes)
    assert params["timeout_min"] == 150 and params["nodes"] == 2
    assert params["tasks_per_node"] == 1 and params["gpus_per_node"] == 4
    assert params["cpus_per_task"] == 40 and params["slurm_partition"] == "learn"
    assert params["slurm_additional_parameters"] == {"account": "vision"}


def test_a_submitted_job_signalled_for_preemption_requeues_and_resumes(tmp_path):
    started, go = tmp_path / "started", tmp_path / "go"
    common = ["config.OPTIMIZER.num_epochs=1", "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1",
              "config.LOG_FREQUENCY=1"]
    command = subprocess.Popen(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"), QUICK,
         f"config.CHECKPOINT.DIR={tmp_path / 'job'}", *common,
         "config.TRAINER.TRAIN_STEP_NAME=wait_for_go",  # holds at iteration 2
         "config.SLURM.USE_SLURM=true", f"config.SLURM.LOG_FOLDER={tmp_path / 'logs'}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SSL_ENGINE_PLUGINS": "plugins.wait_step",
             "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
             "SSL_ENGINE_TEST_STARTED": str(started),
             "SSL_ENGINE_TEST_GO": str(go), "SSL_ENGINE_TEST_WAIT_AT": "2"})
    try:
        deadline = time.monotonic() + 120
        while not (started.exists() and started.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        # the signal SLURM sends to a job's tasks before preemption or the time limit
        os.kill(int(started.read_text()), signal.SIGUSR2)
        time.sleep(0.3)  # handled at once: the first attempt never sees the go-ahead
        go.touch()
        stdout, stderr = command.communicate(timeout=200)
    finally:
        command.kill()
    assert command.returncode == 0, stderr[-2000:]
    job_id = stdout.split("submitted job ")[1].split(";")[0]
    assert f"its logs: {tmp_path / 'logs'}" in stdout and f"job {job_id} finished" in stdout
    assert "Caught signal SIGUSR2" in (tmp_path / "logs" / f"{job_id}_0_log.err").read_text()
    log = (tmp_path / "job" / "log.txt").read_text()
    assert f"Requeued job {job_id}" in log
    assert "stopped on rank 0 by an exit request" in log  # not reported as a failure
    assert "resuming from phase -1, iteration 1" in log  # iteration 1's checkpoint
    run_engine(tmp_path / "straight", common)
    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "job")
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name
