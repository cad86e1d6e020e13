"""OPTIMIZER.use_zero (fairscale's OSS) and MODEL.SHARDED_DDP_SETUP.USE_SDP (its
ShardedDataParallel on top): 2 processes with the optimizer state (and the gradient reduction)
sharded train like 1 process with the whole batch and a full optimizer, save the whole state
in torch's layout, and a run saved by 2 processes resumes on 1."""
import re

import pytest
import torch

from ssl_engine.checkpoint import load_checkpoint
from ssl_engine.config import ConfigError, load_config
from ssl_engine.engines.prelaunch import check_before_launch

from engine_utils import run_engine

COMMON = ["config.MODEL.TRUNK.RESNETS.NORM=GroupNorm", "config.LOG_FREQUENCY=1",
          "config.OPTIMIZER.param_schedulers.lr.name=constant",
          "config.OPTIMIZER.param_schedulers.lr.value=0.1"]
ONE = ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"]
TWO = ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"]
ZERO = ["config.OPTIMIZER.use_zero=true"]
SDP = ["config.MODEL.SHARDED_DDP_SETUP.USE_SDP=true"]  # turns use_zero on


def weights_and_momentum(path):
    state = load_checkpoint(path)["classy_state_dict"]
    model = state["base_model"]["model"]
    weights = {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in model[part].items()}
    momentum = {key: value["momentum_buffer"]
                for key, value in state["optimizer"]["optim"]["state"].items()}
    return weights, momentum


def assert_close(actual, expected):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_sharded_state_trains_saves_and_resumes_like_a_full_optimizer(tmp_path):
    run_engine(tmp_path / "one", COMMON + ONE)  # 2 epochs, a checkpoint after each
    # the first epoch on 2 processes, each holding half the optimizer state
    run_engine(tmp_path / "moved", COMMON + TWO + ZERO + ["config.OPTIMIZER.num_epochs=1"])
    shard = re.search(r"rank 0 keeps the optimizer state of \d+ of \d+ parameter tensors "
                      r"\((\d+) of (\d+) values\)", (tmp_path / "moved" / "log.txt").read_text())
    assert shard and 0.4 < int(shard[1]) / int(shard[2]) < 0.6  # about half the state
    weights, momentum = weights_and_momentum(tmp_path / "moved" / "checkpoint.torch")
    one_weights, one_momentum = weights_and_momentum(tmp_path / "one" / "model_phase0.torch")
    assert_close(weights, one_weights)
    assert len(momentum) == len(weights)  # rank 0 saved every parameter's, not its shard's
    assert_close(momentum, one_momentum)
    # ZeRO stage 2: each gradient reduced (in buckets) to the rank owning its state; 4 updates,
    # so the reduce buckets must hold the gradients after the optimizer zeroes them
    run_engine(tmp_path / "sdp", COMMON + TWO + SDP + ["config.OPTIMIZER.num_epochs=1"])
    log = (tmp_path / "sdp" / "log.txt").read_text()
    assert "USE_SDP: each gradient reduced" in log and "use_zero: rank 0 keeps" in log
    sdp_weights, sdp_momentum = weights_and_momentum(tmp_path / "sdp" / "checkpoint.torch")
    assert_close(sdp_weights, one_weights)
    assert_close(sdp_momentum, one_momentum)
    # the second epoch on 1 process with the whole batch, from the checkpoint of SDP (whose
    # optimizer state is ZeRO's, consolidated the same way)
    run_engine(tmp_path / "sdp", COMMON + ONE + ZERO + ["config.CHECKPOINT.AUTO_RESUME=true"])
    assert_close(weights_and_momentum(tmp_path / "sdp" / "checkpoint.torch")[0],
                 weights_and_momentum(tmp_path / "one" / "checkpoint.torch")[0])


@pytest.mark.parametrize("override, message", [
    ("config.MODEL.GRAD_CLIP.USE_GRAD_CLIP=true", "USE_SDP=true does not work with "
                                                  "config.MODEL.GRAD_CLIP.USE_GRAD_CLIP"),
    ("config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[[heads.0.clf.0.weight,2]]",
     "USE_SDP=true does not work with config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP"),
    ("config.MODEL.SHARDED_DDP_SETUP.reduce_buffer_size=-5", "reduce_buffer_size must be"),
])
def test_sdp_refuses_what_needs_every_ranks_gradients_before_launch(tmp_path, override,
                                                                    message):
    engine, cfg = load_config(["config=test/quick_simclr_synthetic",
                               f"config.CHECKPOINT.DIR={tmp_path}", *TWO, *SDP, override])
    with pytest.raises(ConfigError, match=message):
        check_before_launch(engine, cfg)


def test_sdp_turns_zero_on():
    _, cfg = load_config(["config=test/quick_simclr_synthetic", *SDP])
    assert cfg.OPTIMIZER.use_zero is True
