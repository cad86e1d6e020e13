"""TRAINER.TASK_NAME=self_supervision_fsdp_task resumes exactly, batch norms included: the
sharded checkpoint beside each consolidated one holds the same model (every parameter and
buffer), 2 processes killed mid-epoch resume to the parameters and buffers of an uninterrupted
run (a DINO teacher's and the loss's buffers too), and a checkpoint saved at an epoch end by 2
processes resumes on 1 (and one saved by 1 on 2), loading the saved weights, batch-norm
statistics and optimizer state and training on like the run that was not stopped.

The models of the exact-resume tests keep plain batch norms: each process updates its
statistics from its own part of the batch, so the ranks' copies differ between two forward
passes (rank 0's are sent to every rank at the next one); the checkpoints hold rank 0's."""
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict

import pytest
import torch
import torch.distributed as dist

from engine_utils import final_weights, run_engine, step_losses, stopped_after
from ssl_engine.checkpoint import load_checkpoint
from ssl_engine.hooks import SSLHook
from ssl_engine.trainer.default_hooks import default_hook_generator

REPO = Path(__file__).resolve().parents[1]
# the global batch is 8 on 1 process and on 2; the tiny SimCLR config of the reshard tests
# (32 samples, 2 epochs of 4 iterations) is checkpointed at the epoch ends
FSDP = ["config.TRAINER.TASK_NAME=self_supervision_fsdp_task", "config.LOG_FREQUENCY=1"]
TWO = ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"]
ONE = ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"]
RESUME = ["config.CHECKPOINT.AUTO_RESUME=true"]
# one global batch norm over the processes: 1 and 2 processes compute the same statistics
GLOBAL_BN = ["config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=true"]


def consolidated_model(path: Path) -> Dict[str, torch.Tensor]:
    model = load_checkpoint(path)["classy_state_dict"]["base_model"]["model"]
    return {f"{part}.{key}": value for part in ("trunk", "heads")
            for key, value in model[part].items()}


def sharded_state(folder: Path, scratch: Path) -> dict:
    """The model and optimizer state of a ``.sharded`` folder, whole tensors."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(str(folder), str(scratch))
    return torch.load(scratch, weights_only=False)


def assert_equal_states(actual: Dict[str, torch.Tensor], expected: Dict[str, torch.Tensor]):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name


class RecordLoaded(SSLHook):
    """At the start of the run (after the resume): rank 0 writes the whole model and optimizer
    state, as the run holds it, to ``loaded.pt``; every rank writes its own buffers to
    ``buffers_rank<r>.pt``."""

    def on_start(self, task):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

        from ssl_engine.trainer.fsdp_task import torch_optimizer

        folder = Path(task.checkpoint_folder)
        model, optimizer = get_state_dict(
            task.base_model, torch_optimizer(task),
            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        torch.save({name: buffer.detach().cpu().clone()
                    for name, buffer in task.base_model.named_buffers()},
                   folder / f"buffers_rank{dist.get_rank()}.pt")
        if dist.get_rank() == 0:
            torch.save({"model": model, "optimizer": optimizer}, folder / "loaded.pt")


def record_loaded_hooks(cfg):
    return default_hook_generator(cfg) + [RecordLoaded()]


def assert_loaded(folder: Path, checkpoint: str, nproc: int, scratch: Path) -> None:
    """The resumed run of ``folder`` started (every rank) from the model of ``checkpoint``,
    buffers included, and from its optimizer state."""
    saved = consolidated_model(folder / checkpoint)
    assert any(name.endswith("running_mean") for name in saved)
    loaded = torch.load(folder / "loaded.pt", weights_only=False)
    assert_equal_states(loaded["model"], saved)
    buffers = {name for name in saved if "running_" in name or "num_batches" in name}
    for rank in range(nproc):
        on_rank = torch.load(folder / f"buffers_rank{rank}.pt")
        assert buffers <= on_rank.keys()
        assert_equal_states({name: on_rank[name] for name in buffers},
                            {name: saved[name] for name in buffers})
    sharded = sharded_state(folder / f"{checkpoint}.sharded", scratch)["optimizer"]["state"]
    assert loaded["optimizer"]["state"].keys() == sharded.keys() and sharded
    for name, state in sharded.items():
        assert_equal_states(loaded["optimizer"]["state"][name], state)


# DINO: a momentum teacher (its own batch norms, in the loss state) and a center (a loss
# buffer); 16 samples in global batches of 8, one epoch: a checkpoint after each iteration
DINO = "config=test/quick_dino_synthetic"
DINO_BN = [*FSDP, "config.MODEL.TRUNK.RESNETS.NORM=BatchNorm", "config.OPTIMIZER.num_epochs=1",
           "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16",
           "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1"]


def loss_state(path: Path) -> Dict[str, torch.Tensor]:
    return load_checkpoint(path)["classy_state_dict"]["loss"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """An uninterrupted DINO run of 2 processes."""
    folder = tmp_path_factory.mktemp("fsdp_resume") / "straight"
    run_engine(folder, DINO_BN + TWO, config=DINO)
    return folder


def test_every_sharded_checkpoint_holds_the_model_of_the_consolidated_one(straight, tmp_path):
    names = sorted(path.name for path in straight.glob("model_*.torch"))
    assert names == ["model_final_checkpoint_phase0.torch", "model_iteration1.torch",
                     "model_iteration2.torch"]
    for name in names:
        saved = consolidated_model(straight / name)
        assert sum(key.endswith("running_var") for key in saved) == 20  # ResNet-18's
        assert_equal_states(sharded_state(straight / f"{name}.sharded", tmp_path / "s.pt")["model"],
                            saved)


def test_two_processes_killed_mid_epoch_resume_to_the_uninterrupted_run(straight, tmp_path):
    folder = tmp_path / "killed"
    killed = subprocess.run(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"), DINO,
         f"config.CHECKPOINT.DIR={folder}", *DINO_BN, *TWO,
         "config.TRAINER.TRAIN_STEP_NAME=kill_after_iteration"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "SSL_ENGINE_PLUGINS": "plugins.kill_step",
             "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
             "SSL_ENGINE_TEST_KILL_AT": "2", "SSL_ENGINE_TEST_KILL_RANK": "1"})
    assert killed.returncode == 1, killed.stderr[-3000:]
    assert "process 1 terminated with signal SIGKILL" in killed.stderr
    assert os.readlink(folder / "checkpoint.torch") == "model_iteration1.torch"

    run_engine(folder, DINO_BN + TWO + RESUME, hook_generator=record_loaded_hooks, config=DINO)
    assert "resuming from phase -1, iteration 1" in (folder / "log.txt").read_text()
    assert_loaded(folder, "model_iteration1.torch", 2, tmp_path / "s.pt")
    # every parameter and buffer (batch-norm statistics, num_batches_tracked) bit-equal, the
    # teacher's and the loss's too
    assert_equal_states(final_weights(folder), final_weights(straight))
    teacher = loss_state(straight / "checkpoint.torch")
    assert sum(key.startswith("target_network.") and key.endswith("running_mean")
               for key in teacher) == 20
    assert_equal_states(loss_state(folder / "checkpoint.torch"), teacher)
    assert step_losses(folder) == step_losses(straight)


@pytest.mark.parametrize("saved_on, resumed_on", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_processes(tmp_path, saved_on, resumed_on):
    """Saved at the end of the first epoch, resumed for the second on ``resumed_on``
    processes: it loads the saved state and trains on like the uninterrupted run (the same
    global batch; global batch norm, so the process count changes only the rounding)."""
    procs = {1: ONE, 2: TWO}
    run_engine(tmp_path / "straight", FSDP + GLOBAL_BN + procs[saved_on])
    folder = stopped_after(tmp_path / "straight", tmp_path / "resumed", "model_phase0.torch")
    run_engine(folder, FSDP + GLOBAL_BN + procs[resumed_on] + RESUME,
               hook_generator=record_loaded_hooks)
    assert "resuming from phase 0, iteration 4" in (folder / "log.txt").read_text()
    assert_loaded(folder, "model_phase0.torch", resumed_on, tmp_path / "s.pt")

    straight, resumed = step_losses(tmp_path / "straight"), step_losses(folder)
    assert sorted(resumed) == [1, 2, 3, 4, 5, 6, 7, 8]
    for iteration in (5, 6, 7, 8):
        assert resumed[iteration] == pytest.approx(straight[iteration], rel=1e-4)
    trained = final_weights(folder)
    assert not torch.equal(trained["trunk.conv1.weight"],
                           consolidated_model(folder / "model_phase0.torch")["trunk.conv1.weight"])
    for name, value in final_weights(tmp_path / "straight").items():
        torch.testing.assert_close(trained[name], value, rtol=1e-3, atol=1e-4, msg=name)
