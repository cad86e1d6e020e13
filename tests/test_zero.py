"""OPTIMIZER.use_zero (fairscale's OSS): 2 processes with the optimizer state sharded train
like 1 process with the whole batch and a full optimizer, save the whole state in torch's
layout, and a run saved by 2 processes resumes on 1."""
import re

import torch

from ssl_engine.utils.checkpoint import load_checkpoint

from engine_utils import run_engine

COMMON = ["config.MODEL.TRUNK.RESNETS.NORM=GroupNorm", "config.LOG_FREQUENCY=1",
          "config.OPTIMIZER.param_schedulers.lr.name=constant",
          "config.OPTIMIZER.param_schedulers.lr.value=0.1"]
ONE = ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"]
TWO = ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"]
ZERO = ["config.OPTIMIZER.use_zero=true"]


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
    # the second epoch on 1 process with the whole batch, from that checkpoint
    run_engine(tmp_path / "moved", COMMON + ONE + ZERO + ["config.CHECKPOINT.AUTO_RESUME=true"])
    assert_close(weights_and_momentum(tmp_path / "moved" / "checkpoint.torch")[0],
                 weights_and_momentum(tmp_path / "one" / "checkpoint.torch")[0])
