"""build_optimizer: param groups, scheduled lr, state round trip, LARC against hand formulas."""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.optimizers import LARC, build_optimizer, get_optimizer_param_groups
from ssl_engine.utils.registry import UnknownNameError

DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "config" / "defaults.yaml"


def optimizer_cfg(**settings) -> AttrDict:
    """cfg.OPTIMIZER from defaults.yaml with ``settings`` replaced."""
    cfg = AttrDict(yaml.safe_load(DEFAULTS.read_text())["config"]["OPTIMIZER"])
    for key, value in settings.items():
        cfg[key] = value
    return cfg


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, bias=True)
        self.bn = nn.BatchNorm2d(4)
        self.gn = nn.GroupNorm(2, 4)
        self.fc = nn.Linear(4, 5)
        self.ln = nn.LayerNorm(5)
        self.frozen = nn.Linear(5, 2)
        self.frozen.requires_grad_(False)

    def forward(self, x):
        x = self.gn(self.bn(self.conv(x))).mean(dim=(2, 3))
        return self.ln(self.fc(x))


def group_names(model, groups):
    names = {id(p): n for n, p in model.named_parameters()}
    return [(sorted(names[id(p)] for p in g["params"]), g["weight_decay"]) for g in groups]


NORM = ["bn.bias", "bn.weight", "gn.bias", "gn.weight", "ln.bias", "ln.weight"]


@pytest.mark.parametrize(
    "regularize_bn, regularize_bias, decayed, not_decayed",
    [
        (False, True, ["conv.bias", "conv.weight", "fc.bias", "fc.weight"], NORM),
        (True, True, sorted(NORM + ["conv.bias", "conv.weight", "fc.bias", "fc.weight"]), None),
        (True, False, ["bn.weight", "conv.weight", "fc.weight", "gn.weight", "ln.weight"],
         ["bn.bias", "conv.bias", "fc.bias", "gn.bias", "ln.bias"]),
        (False, False, ["conv.weight", "fc.weight"], sorted(NORM + ["conv.bias", "fc.bias"])),
    ],
)
def test_param_groups(regularize_bn, regularize_bias, decayed, not_decayed):
    model = SmallNet()
    groups = get_optimizer_param_groups(model, 5e-4, regularize_bn, regularize_bias)
    expected = [(decayed, 5e-4)] + ([(not_decayed, 0.0)] if not_decayed else [])
    assert group_names(model, groups) == expected


def fixed_gradient_steps(model, optimizer, first_step, num_steps, total_steps=10):
    """``num_steps`` optimizer steps with deterministic gradients of a fixed batch."""
    for step in range(first_step, first_step + num_steps):
        generator = torch.Generator().manual_seed(step)
        x = torch.randn(4, 3, 6, 6, generator=generator)
        optimizer.zero_grad()
        model(x).pow(2).sum().backward()
        optimizer.step(where=step / total_steps)


def test_sgd_lr_follows_the_schedule_and_weight_decay_per_group():
    cfg = optimizer_cfg(name="sgd", num_epochs=10)
    cfg.param_schedulers.lr = AttrDict(
        {"name": "linear", "update_interval": "step", "start_value": 1.0, "end_value": 0.0}
    )
    model = SmallNet()
    optimizer = build_optimizer(cfg, model)
    assert optimizer.get_lr() == 1.0
    fixed_gradient_steps(model, optimizer, first_step=3, num_steps=1)
    assert optimizer.get_lr() == pytest.approx(0.7)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.7, 0.7])
    assert [g["weight_decay"] for g in optimizer.param_groups] == [1e-4, 0.0]
    assert [g["momentum"] for g in optimizer.param_groups] == [0.9, 0.9]


def test_epoch_interval_changes_lr_only_at_epoch_starts():
    cfg = optimizer_cfg(name="sgd", num_epochs=90)  # default: multistep 0.1/0.01/0.001 at 30, 60
    model = SmallNet()
    optimizer = build_optimizer(cfg, model)
    lrs = []
    for where in (29.5 / 90, 30.2 / 90, 61 / 90):
        optimizer.zero_grad()
        model(torch.ones(1, 3, 6, 6)).sum().backward()
        optimizer.step(where)
        lrs.append(optimizer.get_lr())
    assert lrs == [0.1, 0.01, 0.001]


def test_one_sgd_step_matches_hand_formula():
    cfg = optimizer_cfg(name="sgd", momentum=0.0, weight_decay=0.1, regularize_bias=False)
    cfg.param_schedulers.lr = AttrDict({"name": "constant", "value": 0.5, "update_interval": "step"})
    layer = nn.Linear(3, 2)
    before = copy.deepcopy(layer)
    optimizer = build_optimizer(cfg, layer)
    layer(torch.ones(1, 3)).sum().backward()
    optimizer.step(0.0)
    weight_grad = torch.ones(2, 3)
    torch.testing.assert_close(layer.weight, before.weight - 0.5 * (weight_grad + 0.1 * before.weight))
    torch.testing.assert_close(layer.bias, before.bias - 0.5 * torch.ones(2))  # no decay on biases


def test_lr_multipliers_scale_the_scheduled_lr_of_the_named_parameters():
    cfg = optimizer_cfg(name="sgd", momentum=0.0, weight_decay=0.1, regularize_bias=False,
                        lr_multipliers=[["1", 10.0]])
    cfg.param_schedulers.lr = AttrDict({"name": "cosine", "start_value": 0.5, "end_value": 0.0,
                                        "update_interval": "step"})
    model = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 2), nn.Linear(2, 1))
    before = copy.deepcopy(model)
    optimizer = build_optimizer(cfg, model)
    model(torch.ones(1, 3)).sum().backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    optimizer.step(0.5)  # cosine at half-way: 0.25
    assert optimizer.get_lr() == pytest.approx(0.25)
    for name, param in model.named_parameters():
        lr = 0.25 * (10.0 if name.startswith("1.") else 1.0)
        decay = 0.0 if name.endswith("bias") else 0.1
        old = dict(before.named_parameters())[name]
        torch.testing.assert_close(param, old - lr * (grads[name] + decay * old), msg=name)
    with pytest.raises(ValueError, match="no trainable parameter is named 'heads.3'"):
        build_optimizer(optimizer_cfg(lr_multipliers=[["heads.3", 2.0]]), model)
    with pytest.raises(ValueError, match=r"entries are \[parameter name prefix, multiplier"):
        build_optimizer(optimizer_cfg(lr_multipliers=[["1"]]), model)


@pytest.mark.parametrize(
    "settings",
    [
        {"name": "sgd", "nesterov": True},
        {"name": "adam"},
        {"name": "adamw", "weight_decay": 0.05},
        {"name": "sgd", "use_larc": True},
        {"name": "lars", "exclude_bias_and_norm": True},
    ],
)
def test_state_round_trip_gives_identical_next_steps(settings):
    torch.manual_seed(0)
    cfg = optimizer_cfg(num_epochs=10, **settings)
    cfg.param_schedulers.lr = AttrDict(
        {"name": "cosine", "update_interval": "step", "start_value": 0.05, "end_value": 0.0}
    )
    model = SmallNet()
    optimizer = build_optimizer(cfg, model)
    fixed_gradient_steps(model, optimizer, first_step=0, num_steps=3)
    saved_model, saved_state = copy.deepcopy(model), copy.deepcopy(optimizer.get_classy_state())
    fixed_gradient_steps(model, optimizer, first_step=3, num_steps=2)

    resumed = build_optimizer(cfg, saved_model)
    resumed.set_classy_state(saved_state)
    fixed_gradient_steps(saved_model, resumed, first_step=3, num_steps=2)
    for (name, expected), (_, actual) in zip(model.state_dict().items(), saved_model.state_dict().items()):
        assert torch.equal(expected, actual), name
    assert resumed.get_lr() == optimizer.get_lr()


@pytest.mark.parametrize("clip", [False, True])
def test_larc_matches_hand_computation(clip):
    param = nn.Parameter(torch.tensor([3.0, -4.0]))  # norm 5
    untouched = nn.Parameter(torch.tensor([1.0, 1.0]))
    lr, weight_decay, trust, eps = 0.5, 0.1, 0.02, 1e-8
    inner = torch.optim.SGD([param, untouched], lr=lr, weight_decay=weight_decay)
    larc = LARC(inner, trust_coefficient=trust, clip=clip, eps=eps)
    param.grad = torch.tensor([0.6, 0.8])  # norm 1
    untouched.grad = torch.zeros(2)
    larc.step()
    local_lr = trust * 5.0 / (1.0 + weight_decay * 5.0 + eps)
    scale = min(local_lr / lr, 1.0) if clip else local_lr
    decayed_grad = torch.tensor([0.6, 0.8]) + weight_decay * torch.tensor([3.0, -4.0])
    expected = torch.tensor([3.0, -4.0]) - lr * scale * decayed_grad
    torch.testing.assert_close(param.detach(), expected)
    torch.testing.assert_close(untouched.detach(), torch.ones(2))  # zero grad: skipped, no decay
    assert inner.param_groups[0]["weight_decay"] == weight_decay  # restored after the step


def test_larc_clip_caps_the_ratio_at_one():
    param = nn.Parameter(torch.tensor([3.0, -4.0]))
    inner = torch.optim.SGD([param], lr=1e-4)
    larc = LARC(inner, trust_coefficient=1.0, clip=True)
    param.grad = torch.tensor([0.6, 0.8])
    larc.step()  # local lr 5 / lr 1e-4 is far above 1: plain SGD step
    torch.testing.assert_close(param.detach(), torch.tensor([3.0, -4.0]) - 1e-4 * torch.tensor([0.6, 0.8]))


def test_larc_through_build_optimizer_uses_config_settings():
    cfg = optimizer_cfg(name="sgd", use_larc=True, momentum=0.0, weight_decay=0.0)
    cfg.larc_config = AttrDict({"clip": False, "eps": 1e-8, "trust_coefficient": 0.01})
    cfg.param_schedulers.lr = AttrDict({"name": "constant", "value": 0.5, "update_interval": "step"})
    param_holder = nn.Linear(2, 1, bias=False)
    param_holder.weight.data = torch.tensor([[3.0, -4.0]])
    optimizer = build_optimizer(cfg, param_holder)
    param_holder.weight.grad = torch.tensor([[0.6, 0.8]])
    optimizer.step(0.0)
    scale = 0.01 * 5.0 / (1.0 + 1e-8)
    expected = torch.tensor([[3.0, -4.0]]) - 0.5 * scale * torch.tensor([[0.6, 0.8]])
    torch.testing.assert_close(param_holder.weight.detach(), expected)


def test_unknown_optimizer_and_frozen_model_are_refused():
    with pytest.raises(UnknownNameError, match="did you mean 'adamw'"):
        build_optimizer(optimizer_cfg(name="adamww"), SmallNet())
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter that requires gradients"):
        build_optimizer(optimizer_cfg(), frozen)


@pytest.mark.parametrize("exclude_bias_and_norm", [False, True])
def test_lars_two_steps_match_hand_computation(exclude_bias_and_norm):
    cfg = optimizer_cfg(name="lars", momentum=0.9, weight_decay=0.1, eta=0.02,
                        exclude_bias_and_norm=exclude_bias_and_norm, regularize_bias=True)
    cfg.param_schedulers.lr = AttrDict({"name": "constant", "value": 0.5, "update_interval": "step"})
    layer = nn.Linear(3, 2)
    expected = {name: p.detach().clone() for name, p in layer.named_parameters()}
    momentum = {name: torch.zeros_like(p) for name, p in expected.items()}
    optimizer = build_optimizer(cfg, layer)
    for step in range(2):
        x = torch.randn(4, 3, generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        layer(x).pow(2).sum().backward()
        for name, param in layer.named_parameters():
            update = param.grad + 0.1 * expected[name]
            if not (exclude_bias_and_norm and name == "bias"):
                update = update * 0.02 * expected[name].norm() / update.norm()
            momentum[name] = 0.9 * momentum[name] + update
            expected[name] = expected[name] - 0.5 * momentum[name]
        optimizer.step(0.0)
        for name, param in layer.named_parameters():
            torch.testing.assert_close(param.detach(), expected[name], rtol=1e-6, atol=1e-7)
