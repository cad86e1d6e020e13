"""TRAINER.TASK_NAME=self_supervision_fsdp_task (torch's FSDP2 on gloo): 2 processes with the
model sharded train like 1 process with the whole batch, write sharded checkpoints beside
consolidated ones in the usual layout, and resume from the sharded ones exactly."""
import pytest
import torch

from engine_utils import final_weights, run_engine, step_losses
from ssl_engine.config import ConfigError, load_config
from ssl_engine.engines.prelaunch import check_before_launch

COMMON = ["config.MODEL.TRUNK.RESNETS.NORM=GroupNorm", "config.LOG_FREQUENCY=1",
          "config.OPTIMIZER.param_schedulers.lr.name=constant",
          "config.OPTIMIZER.param_schedulers.lr.value=0.1"]
FSDP = ["config.TRAINER.TASK_NAME=self_supervision_fsdp_task",
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"]


def test_sharded_model_trains_like_one_process_and_resumes_exactly(tmp_path):
    run_engine(tmp_path / "one", COMMON + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"])
    run_engine(tmp_path / "fsdp", COMMON + FSDP)
    one, fsdp = final_weights(tmp_path / "one"), final_weights(tmp_path / "fsdp")
    assert fsdp.keys() == one.keys()  # the consolidated checkpoint: the usual layout, whole
    for name, value in one.items():
        torch.testing.assert_close(fsdp[name], value, rtol=1e-4, atol=1e-5, msg=name)
    losses = step_losses(tmp_path / "fsdp")
    for iteration, loss in step_losses(tmp_path / "one").items():
        assert losses[iteration] == pytest.approx(loss, rel=1e-4)
    shards = sorted(p.name for p in (tmp_path / "fsdp").glob("*.sharded"))
    assert shards == ["model_final_checkpoint_phase1.torch.sharded", "model_phase0.torch.sharded"]
    assert not list((tmp_path / "fsdp").glob("*.partial"))

    # stopped after the first epoch, resumed from its sharded checkpoint
    run_engine(tmp_path / "resumed", COMMON + FSDP + ["config.OPTIMIZER.num_epochs=1"])
    run_engine(tmp_path / "resumed", COMMON + FSDP + ["config.CHECKPOINT.AUTO_RESUME=true"])
    resumed = final_weights(tmp_path / "resumed")
    for name, value in fsdp.items():
        assert torch.equal(resumed[name], value), name


def test_larc_on_sharded_parameters_steps_as_on_whole_ones(tmp_path):
    """LARC's trust ratio takes the norms of the whole parameter and gradient: 2 processes
    with sharded parameters train like 1 process with the whole batch (VISSL's sgd_fsdp)."""
    larc = COMMON + ["config.OPTIMIZER.use_larc=true", "config.OPTIMIZER.num_epochs=1",
                     "config.OPTIMIZER.name=sgd_fsdp"]
    run_engine(tmp_path / "one", larc + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"])
    run_engine(tmp_path / "fsdp", larc + FSDP)
    one, fsdp = final_weights(tmp_path / "one"), final_weights(tmp_path / "fsdp")
    for name, value in one.items():
        torch.testing.assert_close(fsdp[name], value, rtol=1e-4, atol=1e-5, msg=name)
    assert step_losses(tmp_path / "fsdp") == pytest.approx(step_losses(tmp_path / "one"),
                                                           rel=1e-4)


@pytest.mark.parametrize("override, message", [
    ("config.OPTIMIZER.use_zero=true", "FSDP already shards the optimizer state"),
    ("config.MODEL.SHARDED_DDP_SETUP.USE_SDP=true", "USE_SDP=true: FSDP already shards"),
])
def test_unsupported_combinations_are_refused_before_launch(tmp_path, override, message):
    engine, cfg = load_config(["config=test/quick_simclr_synthetic",
                               f"config.CHECKPOINT.DIR={tmp_path}", *FSDP, override])
    with pytest.raises(ConfigError, match=message):
        check_before_launch(engine, cfg)



def test_zero_and_fsdp_agree_in_bfloat16(tmp_path):
    """Two ways of sharding 2 processes, with bfloat16 autocast and channels_last on: the same
    per-rank computation, so the same losses and weights.  (Both equal 1 process in float32,
    tested above and in test_zero.py; ZeRO with channels_last weights did not: fairscale's
    broadcast scrambled them, so sharded runs keep the weights contiguous.)"""
    bf16 = COMMON + ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.OPTIMIZER.num_epochs=1",
                     "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4", "config.MODEL.CHANNELS_LAST=true",
                     "config.MODEL.AMP_PARAMS.USE_AMP=true"]
    run_engine(tmp_path / "zero", bf16 + ["config.OPTIMIZER.use_zero=true"])
    run_engine(tmp_path / "fsdp", bf16 + ["config.TRAINER.TASK_NAME=self_supervision_fsdp_task"])
    assert step_losses(tmp_path / "fsdp") == pytest.approx(step_losses(tmp_path / "zero"),
                                                           rel=1e-5)
    zero, fsdp = final_weights(tmp_path / "zero"), final_weights(tmp_path / "fsdp")
    for name, value in zero.items():
        torch.testing.assert_close(fsdp[name], value, rtol=1e-5, atol=1e-6, msg=name)
