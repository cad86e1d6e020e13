"""MODEL.GRAD_CLIP: the total gradient norm is clipped as torch.nn.utils.clip_grad_norm_
clips it; the standard train step clips before the optimizer step, after float16 gradients
are unscaled (and the step does not unscale them again); bad values are refused."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from engine_utils import FunctionLoss
from ssl_engine.config import ConfigError, compose_config
from ssl_engine.optimizers import build_optimizer
from ssl_engine.trainer.amp import MixedPrecision
from ssl_engine.trainer.grad_clip import GradClip
from ssl_engine.hooks.base import SSLClassyHookFunctions as Event
from ssl_engine.trainer.train_steps.standard_train_step import (
    clip_gradients, standard_train_step, update,
)
from ssl_engine.utils.metrics_store import MetricsStore

QUICK = "config=test/quick_simclr_synthetic"


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))


def loss_of(model: nn.Module, scale: float = 10.0) -> torch.Tensor:
    inputs = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    return model(inputs).pow(2).sum() * scale


def grads(model: nn.Module):
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clips_the_total_norm_like_clip_grad_norm(norm_type):
    model, reference = tiny_model(), tiny_model()
    loss_of(model).backward()
    loss_of(reference).backward()
    norm = GradClip(max_norm=0.5, norm_type=norm_type)(model.parameters())
    expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5, norm_type)
    assert norm.item() == pytest.approx(expected.item(), rel=1e-6) and norm.item() > 0.5
    for mine, theirs in zip(grads(model), grads(reference)):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    total = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads(model)]), norm_type)
    assert total.item() == pytest.approx(0.5, rel=1e-5)


def test_gradients_below_the_limit_are_left_alone():
    model = tiny_model()
    loss_of(model, scale=1e-4).backward()
    before = grads(model)
    GradClip(max_norm=100.0)(model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, grads(model)))


def test_config_values():
    assert GradClip.from_config({"USE_GRAD_CLIP": False, "MAX_NORM": 1.0}) is None
    clip = GradClip.from_config({"USE_GRAD_CLIP": True, "NORM_TYPE": "inf", "MAX_NORM": 3})
    assert (clip.norm_type, clip.max_norm) == (float("inf"), 3.0)
    with pytest.raises(ValueError, match="config.MODEL.GRAD_CLIP.MAX_NORM must be a positive"):
        GradClip(max_norm=0)
    for bad in (-1, "two"):
        with pytest.raises(ValueError, match="config.MODEL.GRAD_CLIP.NORM_TYPE must be a "
                                             "positive number or inf"):
            GradClip(max_norm=1.0, norm_type=bad)
    # VISSL's 'inf' (a string in YAML; the command line makes it a float) is accepted
    for value in ("inf", '"inf"'):
        _, cfg = compose_config([QUICK, f"config.MODEL.GRAD_CLIP.NORM_TYPE={value}"])
        assert GradClip(1.0, cfg.MODEL.GRAD_CLIP.NORM_TYPE).norm_type == float("inf")
    with pytest.raises(ConfigError, match="'config.MODEL.GRAD_CLIP.MAX_NORM' expects a float"):
        compose_config([QUICK, "config.MODEL.GRAD_CLIP.MAX_NORM=big"])


def sgd_task(model: nn.Module, amp: MixedPrecision, grad_clip):
    _, cfg = compose_config([QUICK, "config.OPTIMIZER.momentum=0",
                             "config.OPTIMIZER.weight_decay=0",
                             "config.OPTIMIZER.param_schedulers.lr={name: constant, "
                             "value: 0.1, update_interval: step}"])
    return SimpleNamespace(base_model=model, optimizer=build_optimizer(cfg.OPTIMIZER, model),
                           amp=amp, grad_clip=grad_clip, where=0.0, iteration=0,
                           run_hook=lambda event: None)


def test_the_step_clips_unscaled_float16_gradients_once():
    """A GradScaler (float16 AMP) scales the loss by 2^16: the step unscales the gradients,
    clips them, and the update uses them as they are: the same weights as plain float32
    gradients clipped with clip_grad_norm_ and an SGD step."""
    model, reference = tiny_model(), tiny_model()
    task = sgd_task(model, MixedPrecision(torch.float16, "cpu"), GradClip(max_norm=0.5))
    assert task.amp.scaler is not None and task.amp.scaler.get_scale() > 1
    task.amp.backward(loss_of(model))
    clip_gradients(task)
    loss_of(reference).backward()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
    for mine, theirs in zip(grads(model), grads(reference)):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-9)
    update(task)
    with torch.no_grad():
        for param in reference.parameters():
            param -= 0.1 * param.grad
    for mine, theirs in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-9)
    assert task.iteration == 1


def test_the_standard_train_step_updates_with_clipped_gradients():
    model = tiny_model()
    task = sgd_task(model, MixedPrecision(None, "cpu"), GradClip(max_norm=0.5))
    norms = []

    def run_hook(event):
        if event is Event.on_update:  # after the optimizer step, with the gradients it used
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            norms.append(torch.linalg.vector_norm(flat).item())

    inputs = torch.randn(6, 5, generator=torch.Generator().manual_seed(1))
    task.__dict__.update(
        data_iterator=iter([{"input": inputs, "target": torch.zeros(6)}]),
        to_device=lambda batch: batch, train=True, model=model, run_hook=run_hook,
        loss=FunctionLoss(lambda output, target: output.pow(2).sum() * 10.0),
        metrics=MetricsStore(), meters=[], phase_idx=0, schedule_iteration=0, schedule_length=1,
        iteration_num_in_phase=0)
    standard_train_step(task)
    assert norms == [pytest.approx(0.5, rel=1e-5)] and task.iteration == 1


def test_without_clipping_the_step_leaves_gradients_alone():
    model = tiny_model()
    task = sgd_task(model, MixedPrecision(None, "cpu"), None)
    loss_of(model).backward()
    before = grads(model)
    clip_gradients(task)
    assert all(torch.equal(a, b) for a, b in zip(before, grads(model)))
