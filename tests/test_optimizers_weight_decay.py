"""OPTIMIZER.param_schedulers.weight_decay: without a name the weight decay is the constant
OPTIMIZER.weight_decay; with one, the regularised group's weight decay follows the schedule
at every step (AdamW's decoupled decay shrinks the weights by exactly lr x scheduled value),
unregularised groups stay at 0, epochs hold the value with update_interval epoch, a resumed
optimizer continues bit-exactly, and bad settings are refused naming the key."""
import copy
import math

import pytest
import torch
from torch import nn

from ssl_engine.config import ConfigError, compose_config
from ssl_engine.optimizers import build_optimizer
from ssl_engine.optimizers.weight_decay import build_weight_decay_scheduler

QUICK = "config=test/quick_simclr_synthetic"
COSINE = ["config.OPTIMIZER.name=adamw", "config.OPTIMIZER.num_epochs=4",
          "config.OPTIMIZER.regularize_bias=false",
          "config.OPTIMIZER.param_schedulers.lr={name: constant, value: 0.1, "
          "update_interval: step}",
          "config.OPTIMIZER.param_schedulers.weight_decay={name: cosine, start_value: 0.04, "
          "end_value: 0.4, update_interval: step}"]


def optimizer_cfg(*overrides):
    return compose_config([QUICK, *overrides])[1].OPTIMIZER


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(3, 2))


def weight_decays(optimizer):
    return [group["weight_decay"] for group in optimizer.param_groups]


def cosine(where: float, start: float = 0.04, end: float = 0.4) -> float:
    return end + (start - end) * (1 + math.cos(math.pi * where)) / 2


def test_without_a_name_the_weight_decay_is_the_constant():
    cfg = optimizer_cfg("config.OPTIMIZER.weight_decay=0.01")
    assert cfg.param_schedulers.weight_decay.name is None
    assert build_weight_decay_scheduler(cfg) is None
    optimizer = build_optimizer(cfg, tiny_model())
    for where in (0.0, 0.5, 0.9):
        optimizer.step(where)
        assert weight_decays(optimizer) == [0.01, 0.0]


def test_regularised_weights_decay_by_the_scheduled_value_at_every_step():
    model = tiny_model()
    optimizer = build_optimizer(optimizer_cfg(*COSINE), model)
    regularised = [model[0].weight, model[2].weight]
    exempt = [model[0].bias, model[1].weight, model[1].bias, model[2].bias]
    for step in range(6):
        where = step / 6
        for param in model.parameters():  # Adam's own step is 0: only the decay moves them
            param.grad = torch.zeros_like(param)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step(where)
        decay = cosine(where)
        assert weight_decays(optimizer) == pytest.approx([decay, 0.0], rel=1e-9)
        for param, old in zip(model.parameters(), before):
            if any(param is p for p in regularised):
                torch.testing.assert_close(param, old * (1 - 0.1 * decay), rtol=1e-6, atol=0)
            else:
                assert any(param is p for p in exempt) and torch.equal(param, old)


def test_update_interval_epoch_holds_the_value_for_a_whole_epoch():
    overrides = COSINE[:-1] + [
        "config.OPTIMIZER.param_schedulers.weight_decay={name: cosine, start_value: 0.04, "
        "end_value: 0.4, update_interval: epoch}"]
    optimizer = build_optimizer(optimizer_cfg(*overrides), tiny_model())
    for where, epoch_start in ((0.3, 0.25), (0.49, 0.25), (0.5, 0.5), (0.99, 0.75)):
        optimizer.step(where)
        assert weight_decays(optimizer)[0] == pytest.approx(cosine(epoch_start), rel=1e-9)


def test_a_resumed_optimizer_continues_the_schedule_exactly():
    cfg = optimizer_cfg(*COSINE)
    model = tiny_model()
    optimizer = build_optimizer(cfg, model)
    generator = torch.Generator().manual_seed(1)
    grads = [[torch.randn(p.shape, generator=generator) for p in model.parameters()]
             for _ in range(5)]

    def run(model, optimizer, steps):
        for step in steps:
            for param, grad in zip(model.parameters(), grads[step]):
                param.grad = grad.clone()
            optimizer.step(step / 5)

    run(model, optimizer, range(2))
    saved_model, saved_state = copy.deepcopy(model), copy.deepcopy(optimizer.get_classy_state())
    run(model, optimizer, range(2, 5))
    resumed = build_optimizer(cfg, saved_model)
    resumed.set_classy_state(saved_state)
    run(saved_model, resumed, range(2, 5))
    for straight, again in zip(model.parameters(), saved_model.parameters()):
        assert torch.equal(straight, again)
    assert weight_decays(resumed) == weight_decays(optimizer)


def test_settings_without_a_name_and_bad_schedules_are_refused():
    key = "config.OPTIMIZER.param_schedulers.weight_decay"
    with pytest.raises(ValueError, match=f"{key} sets start_value, end_value but no name"):
        build_weight_decay_scheduler(optimizer_cfg(f"{key}.start_value=0.1",
                                                   f"{key}.end_value=0.2"))
    with pytest.raises(ValueError, match=f"{key}: param scheduler 'cosine' needs the key "
                                         "'start_value'"):
        build_weight_decay_scheduler(optimizer_cfg(f"{key}.name=cosine"))
    with pytest.raises(ValueError, match="weight_decay.update_interval must be step or epoch"):
        build_weight_decay_scheduler(optimizer_cfg(f"{key}.name=constant", f"{key}.value=0.1",
                                                   f"{key}.update_interval=often"))
    with pytest.raises(ConfigError, match=f"did you mean '{key}.start_value'"):
        optimizer_cfg(f"{key}.start_valu=0.1")


def test_a_bad_schedule_is_refused_before_launch(tmp_path, capsys):
    from ssl_engine.engines.launcher import main

    code = main([QUICK, f"config.CHECKPOINT.DIR={tmp_path}",
                 "config.OPTIMIZER.param_schedulers.weight_decay.start_value=0.1"])
    assert code == 2
    assert "weight_decay sets start_value but no name" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_single_param_group_decays_every_parameter_norms_and_biases_included():
    """VISSL's OPTIMIZER.construct_single_param_group_only: one group, every parameter decayed."""
    model = tiny_model()
    cfg = optimizer_cfg("config.OPTIMIZER.weight_decay=0.01", "config.OPTIMIZER.momentum=0.0",
                        "config.OPTIMIZER.construct_single_param_group_only=true",
                        "config.OPTIMIZER.param_schedulers.lr={name: constant, value: 0.1, "
                        "update_interval: step}")
    optimizer = build_optimizer(cfg, model)
    assert weight_decays(optimizer) == [0.01]
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step(0.0)
    for old, new in zip(before, model.parameters()):  # SGD: p -= lr * wd * p with zero gradients
        torch.testing.assert_close(new.detach(), old * (1 - 0.1 * 0.01))
    with pytest.raises(ValueError, match="cannot take config.OPTIMIZER.lr_multipliers"):
        build_optimizer(optimizer_cfg("config.OPTIMIZER.construct_single_param_group_only=true",
                                      "config.OPTIMIZER.lr_multipliers=[[0, 2.0]]"), model)


def test_dino_param_groups_exempt_biases_and_norms_by_name():
    """param_group_constructor=dino: no weight decay for *.bias and names containing 'norm'."""
    model = nn.Sequential()
    model.add_module("proj", nn.Linear(4, 3))
    model.add_module("norm1", nn.LayerNorm(3))
    model.add_module("head", nn.Linear(3, 2, bias=False))
    cfg = optimizer_cfg("config.OPTIMIZER.weight_decay=0.05", "config.OPTIMIZER.regularize_bn=true",
                        "config.OPTIMIZER.regularize_bias=true",
                        "config.OPTIMIZER.param_group_constructor=dino")
    groups = build_optimizer(cfg, model).param_groups
    decayed = {id(p) for g in groups if g["weight_decay"] == 0.05 for p in g["params"]}
    exempt = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert decayed == {id(model.proj.weight), id(model.head.weight)}
    assert exempt == {id(model.proj.bias), id(model.norm1.weight), id(model.norm1.bias)}


def test_linear_eval_heads_groups_give_each_head_its_lr_and_weight_decay():
    """param_group_constructor=linear_eval_heads (VISSL): per head lr multiplier, weight decay
    and regularize_bn; a trainable parameter outside the heads is refused."""
    heads = nn.ModuleList([nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2)), nn.Linear(4, 3)])
    model = nn.Module()
    model.trunk, model.heads = nn.Linear(4, 4), heads
    cfg = optimizer_cfg("config.OPTIMIZER.weight_decay=0.01", "config.OPTIMIZER.regularize_bn=false",
                        "config.OPTIMIZER.regularize_bias=false",
                        "config.OPTIMIZER.param_group_constructor=linear_eval_heads",
                        "config.OPTIMIZER.linear_eval_heads=[{lr: 2.0, weight_decay: 0.5, "
                        "regularize_bn: true}, {lr: 0.5}]",
                        "config.OPTIMIZER.param_schedulers.lr={name: constant, value: 0.1, "
                        "update_interval: step}")
    with pytest.raises(ValueError, match=r"optimizes the heads only, but 2 trainable parameters "
                                         r"are outside them \(e.g. trunk.weight\)"):
        build_optimizer(cfg, model)
    model.trunk.requires_grad_(False)
    optimizer = build_optimizer(cfg, model)
    optimizer.step(0.0)  # sets each group's lr from the schedule
    by_param = {id(p): (g["lr"], g["weight_decay"]) for g in optimizer.param_groups
                for p in g["params"]}
    for name, param in heads[0].named_parameters():  # head 0 regularizes its norm (weight)
        assert by_param[id(param)] == pytest.approx((0.2, 0.0 if name.endswith("bias") else 0.5))
    assert by_param[id(heads[1].weight)] == pytest.approx((0.05, 0.01))
    assert by_param[id(heads[1].bias)] == pytest.approx((0.05, 0.0))  # regularize_bias false
    cfg.linear_eval_heads = cfg.linear_eval_heads[:1]
    with pytest.raises(ValueError, match="needs an entry {lr: ..} for head 1"):
        build_optimizer(cfg, model)


def test_non_regularized_parameters_are_named_by_substrings():
    """OPTIMIZER.non_regularized_parameters (VISSL): e.g. a ViT's class token and position
    embedding get no weight decay."""
    model = nn.Module()
    model.class_token = nn.Parameter(torch.zeros(1, 4))
    model.pos_embedding = nn.Parameter(torch.zeros(3, 4))
    model.proj = nn.Linear(4, 4)
    cfg = optimizer_cfg("config.OPTIMIZER.weight_decay=0.05", "config.OPTIMIZER.regularize_bias=true",
                        "config.OPTIMIZER.non_regularized_parameters=[pos_embedding, class_token]")
    groups = build_optimizer(cfg, model).param_groups
    exempt = {id(p) for g in groups if g["weight_decay"] == 0.0 for p in g["params"]}
    assert exempt == {id(model.class_token), id(model.pos_embedding)}


def test_non_regularized_vissl_vit_names_read_as_the_vit_s_and_unknown_names_are_refused():
    from ssl_engine.optimizers.param_groups import resolve_name_parts

    vit = nn.Module()
    vit.cls_token, vit.pos_embed = nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))
    assert resolve_name_parts(vit, ["class_token", "pos_embedding"]) == ["cls_token", "pos_embed"]
    with pytest.raises(ValueError, match="'tokens' is part of no parameter name"):
        resolve_name_parts(vit, ["tokens"])
