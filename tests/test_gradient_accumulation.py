"""OPTIMIZER.gradient_accumulation_steps: micro-batches accumulated into one update equal one
update of the whole batch for a per-sample loss (SimSiam, with GroupNorm in the trunk and no
batch norm in the heads); 2 processes accumulate like 1, a last, shorter group included; a
loss that couples its batch warns."""
import logging

import pytest
import torch

from engine_utils import FunctionLoss, final_weights, metrics, run_engine
from ssl_engine.config import ConfigError, load_config
from ssl_engine.trainer.accumulation import warn_if_accumulation_changes_the_loss
from ssl_engine.utils.metrics_store import MetricsStore

CONFIG = "config=test/quick_simsiam_synthetic"
# no batch statistics anywhere: the loss of a batch is the mean of its samples' losses
PER_SAMPLE = ["config.MODEL.TRUNK.RESNETS.NORM=GroupNorm",
              "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,64,16],use_relu:true}],"
              "[mlp,{dims:[16,8,16],use_relu:true}]]",
              "config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=32",
              "config.LOG_FREQUENCY=1"]


def updates(checkpoint_dir):
    return [r["iteration"] for r in metrics(checkpoint_dir) if r.get("phase") == "train"]


def test_accumulated_micro_batches_equal_one_large_batch(tmp_path):
    run_engine(tmp_path / "whole", PER_SAMPLE + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16"],
               config=CONFIG)
    run_engine(tmp_path / "accumulated",
               PER_SAMPLE + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
                             "config.OPTIMIZER.gradient_accumulation_steps=2"], config=CONFIG)
    assert updates(tmp_path / "whole") == updates(tmp_path / "accumulated") == [1, 2]
    whole, accumulated = final_weights(tmp_path / "whole"), final_weights(tmp_path / "accumulated")
    for name, value in whole.items():
        torch.testing.assert_close(accumulated[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_two_processes_accumulate_like_one_with_a_shorter_last_group(tmp_path):
    # 32 images in batches of 8: 4 micro-batches, in groups of 3 -> updates of 3 and of 1.
    # On 2 processes DDP skips the all-reduce of all but the last micro-batch of a group; the
    # shorter last group's gradients are averaged over the ranks by hand
    run_engine(tmp_path / "one", PER_SAMPLE + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
                                               "config.OPTIMIZER.gradient_accumulation_steps=3"],
               config=CONFIG)
    run_engine(tmp_path / "two", PER_SAMPLE + ["config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                                               "config.OPTIMIZER.gradient_accumulation_steps=3",
                                               "config.DISTRIBUTED.NUM_PROC_PER_NODE=2"],
               config=CONFIG)
    assert updates(tmp_path / "one") == updates(tmp_path / "two") == [1, 2]
    one, two = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    for name, value in one.items():
        torch.testing.assert_close(two[name], value, rtol=1e-4, atol=1e-6, msg=name)


def test_bad_step_counts_are_refused_and_batch_coupled_losses_warn(caplog):
    for value in (0, -2):
        with pytest.raises(ConfigError, match="gradient_accumulation_steps must be an integer"):
            load_config([CONFIG, f"config.OPTIMIZER.gradient_accumulation_steps={value}"])
    # the global batch used by auto lr scaling counts the accumulated micro-batches
    _, cfg = load_config([CONFIG, "config.OPTIMIZER.gradient_accumulation_steps=4",
                          "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling.auto_scale=true",
                          "config.OPTIMIZER.param_schedulers.lr.auto_lr_scaling"
                          ".base_lr_batch_size=16"])
    assert cfg.OPTIMIZER.param_schedulers.lr.start_value == pytest.approx(0.1 * 8 * 4 / 16)

    from ssl_engine.losses.simclr_info_nce_loss import SimclrInfoNCELoss
    from ssl_engine.losses.simsiam_loss import SimSiamLoss

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_if_accumulation_changes_the_loss(SimSiamLoss(), 2)
        assert not caplog.records
        warn_if_accumulation_changes_the_loss(SimclrInfoNCELoss(), 2)
    assert "does not add negatives" in caplog.text and "2x larger batch" in caplog.text


def test_the_update_of_a_shorter_group_uses_the_mean_gradient_of_its_micro_batches():
    from types import SimpleNamespace

    from ssl_engine.trainer.amp import MixedPrecision
    from ssl_engine.trainer.train_steps.standard_train_step import accumulate_gradients

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    batches = [{"input": torch.randn(4, 3), "target": torch.zeros(4)} for _ in range(2)]
    task = SimpleNamespace(
        data_iterator=iter(batches), to_device=lambda b: b, model=model, base_model=model,
        train=True, loss=FunctionLoss(lambda out, target: (out.squeeze(1) ** 2).mean()),
        meters=[], metrics=MetricsStore(), run_hook=lambda event: None, iteration=0,
        phase_idx=0, schedule_iteration=0, schedule_length=1,
        iteration_num_in_phase=0, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        amp=MixedPrecision(None, "cpu"), accumulation_steps=3,  # the data ends after 2
    )
    accumulate_gradients(task)
    assert task.iteration_num_in_phase == 2
    mean_loss = sum((model(b["input"]).squeeze(1) ** 2).mean() for b in batches) / 2
    expected = torch.autograd.grad(mean_loss, list(model.parameters()))
    for param, grad in zip(model.parameters(), expected):
        torch.testing.assert_close(param.grad, grad)
    with pytest.raises(StopIteration):  # no micro-batch left: the phase is over
        accumulate_gradients(task)
