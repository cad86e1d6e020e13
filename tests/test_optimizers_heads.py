"""OPTIMIZER.head_optimizer_params (the heads' own lr schedule and weight decay, VISSL's
lr_head) and MODEL.HEAD.PARAMS_MULTIPLIER, checked against SGD steps written out by hand."""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models.base_ssl_model import scale_head_weights
from ssl_engine.models.heads.eval_mlp import EvalMLP
from ssl_engine.models.heads.mlp import MLP
from ssl_engine.optimizers import apply_auto_lr_scaling, build_optimizer

DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "config" / "defaults.yaml"


def optimizer_cfg(**heads) -> AttrDict:
    cfg = AttrDict(yaml.safe_load(DEFAULTS.read_text())["config"]["OPTIMIZER"])
    cfg.update(name="sgd", momentum=0.0, weight_decay=0.1, regularize_bias=False)
    cfg.head_optimizer_params.update(heads)
    cfg.param_schedulers.lr = AttrDict({"name": "cosine", "start_value": 0.4, "end_value": 0.0,
                                        "update_interval": "step"})
    cfg.param_schedulers.lr_head = AttrDict({"name": "constant", "value": 2.0,
                                             "update_interval": "step"})
    return cfg


class TrunkAndHeads(nn.Module):  # the SSL model's layout: trunk.* and heads.<i>.*
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        self.heads = nn.ModuleList([nn.Linear(4, 2)])

    def forward(self, x):
        return self.heads[0](self.trunk(x))


@pytest.mark.parametrize("different_lr, different_wd", [(True, False), (False, True),
                                                         (True, True)])
def test_heads_step_with_their_own_lr_and_weight_decay(different_lr, different_wd):
    torch.manual_seed(0)
    model = TrunkAndHeads()
    before = copy.deepcopy(model)
    optimizer = build_optimizer(optimizer_cfg(use_different_lr=different_lr,
                                              use_different_wd=different_wd,
                                              weight_decay=0.03), model)
    model(torch.randn(5, 3)).square().sum().backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters()}
    optimizer.step(0.5)  # the trunk's cosine at half-way: 0.2
    old = dict(before.named_parameters())
    for name, param in model.named_parameters():
        head = name.startswith("heads.")
        lr = 2.0 if head and different_lr else 0.2
        if name.endswith("bias") or name.startswith("trunk.1."):  # biases, batch norm
            decay = 0.0
        else:
            decay = 0.03 if head and different_wd else 0.1
        torch.testing.assert_close(param, old[name] - lr * (grads[name] + decay * old[name]),
                                   msg=name)


def test_lr_head_is_scaled_with_the_batch_by_its_own_setting():
    cfg = optimizer_cfg(use_different_lr=True)
    cfg.param_schedulers.lr_head.auto_lr_scaling = AttrDict(
        {"auto_scale": True, "base_lr_batch_size": 256, "scaling_type": "linear"})
    scaled = apply_auto_lr_scaling(cfg, 512)
    assert scaled.param_schedulers.lr_head.value == 4.0
    assert scaled.param_schedulers.lr.start_value == 0.4  # its own auto_scale is off


def test_head_settings_need_the_default_param_groups():
    cfg = optimizer_cfg(use_different_lr=True)
    cfg.construct_single_param_group_only = True
    with pytest.raises(ValueError, match="head_optimizer_params"):
        build_optimizer(cfg, TrunkAndHeads())


def test_params_multiplier_scales_the_linear_layers_of_mlp_heads():
    torch.manual_seed(0)
    heads = nn.ModuleList([MLP(dims=[4, 3, 2], use_bn=True), EvalMLP(in_channels=4, dims=[4, 2])])
    before = copy.deepcopy(heads)
    scale_head_weights(heads, AttrDict(PARAMS_MULTIPLIER=0.5))
    for (name, value), old in zip(heads.state_dict().items(), before.state_dict().values()):
        linear = any(isinstance(m, nn.Linear) and name.startswith(prefix + ".") for prefix, m
                     in heads.named_modules())
        torch.testing.assert_close(value, old * 0.5 if linear else old, msg=name)
