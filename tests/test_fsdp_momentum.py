"""A method with a momentum teacher (DINO, as VISSL's FSDP configs train it) under
self_supervision_fsdp_task: the teacher is sharded like the student, 2 processes train like 1
process with the whole batch, and a run stopped after its first iteration resumes exactly from
the sharded checkpoint, teacher included."""

import pytest
import torch

from engine_utils import final_weights, run_engine, step_losses, stopped_after
from ssl_engine.checkpoint import load_checkpoint

CONFIG = "config=test/quick_dino_synthetic"
COMMON = ["config.MODEL.TRUNK.RESNETS.NORM=GroupNorm", "config.LOG_FREQUENCY=1",
          "config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16",
          "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=1",
          "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=true"]
FSDP = ["config.TRAINER.TASK_NAME=self_supervision_fsdp_task",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"]


def teacher_state(folder):
    loss = load_checkpoint(folder / "checkpoint.torch")["classy_state_dict"]["loss"]
    return {key: value for key, value in loss.items() if key.startswith("target_network.")}


def test_dino_with_a_sharded_teacher_trains_like_one_process_and_resumes_exactly(tmp_path):
    run_engine(tmp_path / "one", COMMON + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"],
               config=CONFIG)
    run_engine(tmp_path / "fsdp", COMMON + FSDP, config=CONFIG)
    losses = step_losses(tmp_path / "fsdp")
    for iteration, loss in step_losses(tmp_path / "one").items():
        assert losses[iteration] == pytest.approx(loss, rel=1e-5)
    one, fsdp = final_weights(tmp_path / "one"), final_weights(tmp_path / "fsdp")
    for name, value in one.items():
        torch.testing.assert_close(fsdp[name], value, rtol=1e-4, atol=1e-5, msg=name)
    # the checkpoint holds the whole teacher (gathered), as a DDP run's does
    teacher_one, teacher_fsdp = teacher_state(tmp_path / "one"), teacher_state(tmp_path / "fsdp")
    assert teacher_one and teacher_fsdp.keys() == teacher_one.keys()
    for name, value in teacher_one.items():
        assert type(teacher_fsdp[name]) is torch.Tensor
        torch.testing.assert_close(teacher_fsdp[name], value, rtol=1e-4, atol=1e-5, msg=name)

    # the run as if stopped after its first iteration: its folder up to that checkpoint
    crashed = stopped_after(tmp_path / "fsdp", tmp_path / "crashed", "model_iteration1.torch")
    assert sorted(p.name for p in crashed.glob("model_*")) == [
        "model_iteration1.torch", "model_iteration1.torch.sharded"]
    run_engine(crashed, COMMON + FSDP + ["config.CHECKPOINT.AUTO_RESUME=true"], config=CONFIG)
    # the resumed run made iteration 2 again (its log rows after the checkpoint replaced)
    assert (crashed / "checkpoint.torch").resolve().name != "model_iteration1.torch"
    assert step_losses(crashed)[2] == losses[2]
    resumed = final_weights(tmp_path / "crashed")
    for name, value in fsdp.items():
        assert torch.equal(resumed[name], value), name
    for name, value in teacher_state(tmp_path / "crashed").items():
        assert torch.equal(value, teacher_fsdp[name]), name
