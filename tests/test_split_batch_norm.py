"""MODEL.BATCH_NORM_SPLITS: batch norm over equal slices of the batch (models/sync_bn.py), and
one-process MoCo v2 whose shuffled keys meet other slices than their queries."""
import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from engine_utils import crash_hooks_at, final_weights, run_engine, step_losses
from ssl_engine.config import load_config
from ssl_engine.losses.moco_loss import MoCoLoss
from ssl_engine.models.sync_bn import (SplitBatchNorm, check_batch_norm_splits,
                                       convert_to_split_bn)

MOCO = "config=test/quick_moco_v2_synthetic"


def numpy_split_bn(x, weight, bias, splits, eps=1e-5):
    """Each slice normalised by its own mean and biased variance over every axis but 1."""
    out = []
    for part in np.split(x, splits):
        axes = (0,) + tuple(range(2, x.ndim))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean, var = part.mean(axis=axes), part.var(axis=axes)
        out.append((part - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)
                   * weight.reshape(shape) + bias.reshape(shape))
    return np.concatenate(out)


@pytest.mark.parametrize("shape", [(8, 3, 5, 4), (12, 6)], ids=["images", "embeddings"])
def test_each_slice_is_normalised_by_its_own_statistics(shape):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=generator, dtype=torch.float64) * 3 + 1
    bn = SplitBatchNorm(shape[1], splits=2).double()
    with torch.no_grad():
        bn.weight.copy_(torch.rand(shape[1], generator=generator, dtype=torch.float64) + 0.5)
        bn.bias.copy_(torch.randn(shape[1], generator=generator, dtype=torch.float64))
    x.requires_grad_(True)
    out = bn(x)
    expected = numpy_split_bn(x.detach().numpy(), bn.weight.detach().numpy(),
                              bn.bias.detach().numpy(), 2)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-10, atol=1e-10)
    # not plain batch norm over the whole batch
    assert not np.allclose(expected, numpy_split_bn(x.detach().numpy(),
                                                    bn.weight.detach().numpy(),
                                                    bn.bias.detach().numpy(), 1), atol=1e-3)
    # gradients: each slice's are those of a plain batch norm on that slice alone
    upstream = torch.randn(*shape, generator=generator, dtype=torch.float64)
    (out * upstream).sum().backward()
    plain = nn.BatchNorm1d(shape[1]).double() if len(shape) == 2 else \
        nn.BatchNorm2d(shape[1]).double()
    plain.load_state_dict({k: v for k, v in bn.state_dict().items() if k != "splits"})
    for part, grad_up, grad in zip(x.detach().chunk(2), upstream.chunk(2), x.grad.chunk(2)):
        part = part.clone().requires_grad_(True)
        (plain(part) * grad_up).sum().backward()
        torch.testing.assert_close(grad, part.grad)
    # running statistics: one step towards the slices' mean statistics (unbiased variances)
    axes = (0,) + tuple(range(2, len(shape)))
    parts = np.split(x.detach().numpy(), 2)
    mean = np.mean([p.mean(axis=axes) for p in parts], axis=0)
    var = np.mean([p.var(axis=axes, ddof=1) for p in parts], axis=0)
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * mean, rtol=1e-10)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * var, rtol=1e-10)
    assert int(bn.num_batches_tracked) == 1
    # eval mode: the running statistics, as nn.BatchNorm
    bn.eval()
    plain.load_state_dict(bn.state_dict())
    plain.eval()
    torch.testing.assert_close(bn(x.detach()), plain(x.detach()))


def test_conversion_keeps_weights_modes_and_keys_and_channels_last_gives_the_same_values():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Sequential(nn.BatchNorm2d(4)))
    with torch.no_grad():
        model[1].weight.uniform_(0.5, 1.5)
        model[1].running_mean.fill_(0.25)
    model[3][0].weight.requires_grad_(False)
    keys = set(model.state_dict())
    before = copy.deepcopy(model.state_dict())
    converted = convert_to_split_bn(model, 4)
    assert isinstance(converted[1], SplitBatchNorm) and isinstance(converted[3][0], SplitBatchNorm)
    assert set(converted.state_dict()) == keys
    for key, value in before.items():
        assert torch.equal(converted.state_dict()[key], value), key
    assert not converted[3][0].weight.requires_grad
    x = torch.randn(8, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    plain = converted(x)
    fast = copy.deepcopy(converted).to(memory_format=torch.channels_last)
    torch.testing.assert_close(fast(x.contiguous(memory_format=torch.channels_last)), plain)
    with pytest.raises(ValueError, match="BATCH_NORM_SPLITS=4 does not divide the batch of 6"):
        converted(x[:6])


def test_one_process_moco_keys_are_those_of_ranks_holding_the_shuffled_slices():
    """With BATCH_NORM_SPLITS=2 one process computes each key as the rank would that holds it
    after the shuffle: plain batch norm over that rank's slice of the shuffled batch."""
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 8))
    loss = MoCoLoss(embedding_dim=8, queue_size=16)
    loss.target_network = _Outputs(convert_to_split_bn(copy.deepcopy(encoder), 2)).train()
    task = SimpleNamespace(config=SimpleNamespace(SEED_VALUE=3), iteration=5)
    images = torch.randn(8, 3, 6, 6)
    with torch.no_grad():
        keys = loss.run_target(images, task)
        order = torch.randperm(8, generator=torch.Generator().manual_seed(3 * 1_000_003 + 5))
        ranks = [copy.deepcopy(encoder).train()(part) for part in images[order].chunk(2)]
        expected = torch.empty(8, 8)
        expected[order] = torch.cat(ranks)
        whole = copy.deepcopy(encoder).train()(images)
    torch.testing.assert_close(keys, expected)
    assert (keys - whole).abs().max() > 1e-2  # not the keys of one batch norm over all 8


class _Outputs(nn.Module):
    """A module returning a list of outputs, as the engine's models do."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return [self.module(x)]


def test_moco_trains_in_slices_and_resumes_exactly(tmp_path):
    splits = ["config.MODEL.BATCH_NORM_SPLITS=2", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16",
              "config.LOG_FREQUENCY=1"]
    run_engine(tmp_path / "straight", splits, config=MOCO)
    losses = step_losses(tmp_path / "straight")
    assert sorted(losses) == [1, 2, 3, 4] and all(np.isfinite(list(losses.values())))
    assert "batch norm in 2 slices of each process's batch" in \
        (tmp_path / "straight" / "log.txt").read_text()
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_engine(tmp_path / "crashed", splits, config=MOCO, hook_generator=crash_hooks_at(3))
    run_engine(tmp_path / "crashed", splits + ["config.CHECKPOINT.AUTO_RESUME=true"], config=MOCO)
    resumed, straight = final_weights(tmp_path / "crashed"), final_weights(tmp_path / "straight")
    for name in straight:  # weights and batch-norm statistics
        assert torch.equal(resumed[name], straight[name]), name
    assert step_losses(tmp_path / "crashed")[4] == losses[4]


@pytest.mark.parametrize("overrides, message", [
    (["config.MODEL.BATCH_NORM_SPLITS=3"], "must divide config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"),
    (["config.MODEL.BATCH_NORM_SPLITS=8"], "slices of at least 2 images"),
    (["config.MODEL.BATCH_NORM_SPLITS=0"], "must be an integer >= 1"),
    (["config.MODEL.BATCH_NORM_SPLITS=2", "config.MODEL.SYNC_BN_CONFIG.CONVERT_BN_TO_SYNC_BN=true"],
     "choose one"),
])
def test_splits_that_cannot_run_are_refused_before_launch(overrides, message):
    _, cfg = load_config([MOCO, *overrides])
    with pytest.raises(ValueError, match=message):
        check_batch_norm_splits(cfg)
