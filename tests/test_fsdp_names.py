"""VISSL's FSDP component names build the ordinary components, and MODEL.FSDP_CONFIG's
precision and wrapping settings reach torch's FSDP2 (one in-process gloo rank)."""
import copy
import logging
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml
from torch import nn

from ssl_engine.checkpoint.formats import model_key_from_vissl
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model
from ssl_engine.models.fsdp_names import warn_fsdp_names_without_fsdp_task
from ssl_engine.optimizers import build_optimizer

DEFAULTS = yaml.safe_load((Path(__file__).resolve().parents[1]
                           / "configs/config/defaults.yaml").read_text())["config"]
# a RegNet of 4 stages of widths 8, 16, 32, 64
TINY_REGNET = dict(depth=6, w_0=8, w_a=8.0, w_m=2.0, group_width=8, stem_width=8)


def config(trunk="regnet", head="mlp", **fsdp) -> AttrDict:
    cfg = AttrDict(copy.deepcopy(DEFAULTS))
    cfg.MODEL.TRUNK.NAME = trunk
    cfg.MODEL.TRUNK.REGNET.update(TINY_REGNET)
    cfg.MODEL.HEAD.PARAMS = [[head, {"dims": [64, 16, 8], "use_bn": True, "use_relu": True}]]
    cfg.MODEL.FSDP_CONFIG.update(fsdp)
    return cfg


def seeded_model(model_cfg):
    torch.manual_seed(0)
    return build_model(model_cfg)


def test_fsdp_names_build_the_ordinary_components_with_their_names(caplog):
    with caplog.at_level(logging.INFO, logger="ssl_engine.models.fsdp_names"):
        fsdp = seeded_model(config("regnet_fsdp", "mlp_fsdp").MODEL)
    ordinary = seeded_model(config().MODEL)
    assert type(fsdp.trunk) is type(ordinary.trunk) and type(fsdp.heads[0]) is type(ordinary.heads[0])
    fsdp_state, state = fsdp.state_dict(), ordinary.state_dict()
    assert list(fsdp_state) == list(state)  # a checkpoint of one loads into the other
    for key, value in state.items():
        assert torch.equal(fsdp_state[key], value), key
    messages = [record.getMessage() for record in caplog.records]
    assert any("trunk regnet_fsdp: built as the ordinary regnet" in m for m in messages)
    assert any("head mlp_fsdp: built as the ordinary mlp" in m for m in messages)


def test_sgd_fsdp_is_sgd():
    cfg = config()
    cfg.OPTIMIZER.update(name="sgd_fsdp", momentum=0.9, nesterov=True, weight_decay=0.0)
    model = nn.Linear(3, 2)
    optimizer = build_optimizer(cfg.OPTIMIZER, model).classy_optimizer.optimizer
    assert type(optimizer) is torch.optim.SGD
    assert optimizer.param_groups[0]["momentum"] == 0.9 and optimizer.param_groups[0]["nesterov"]


def test_fsdp_names_outside_the_fsdp_task_are_warned_when_training(caplog):
    cfg = config("regnet_fsdp", "swav_head_fsdp")
    with caplog.at_level(logging.WARNING, logger="ssl_engine.models.fsdp_names"):
        assert warn_fsdp_names_without_fsdp_task("train", cfg)
        assert not warn_fsdp_names_without_fsdp_task("extract_features", cfg)
        cfg.TRAINER.TASK_NAME = "self_supervision_fsdp_task"
        assert not warn_fsdp_names_without_fsdp_task("train", cfg)
    (record,) = caplog.records
    assert record.getMessage().startswith("config.MODEL.TRUNK.NAME=regnet_fsdp, "
                                          "config.MODEL.HEAD.PARAMS[0][0]=swav_head_fsdp: with "
                                          "config.TRAINER.TASK_NAME=self_supervision_task")


def test_vissl_regnet_fsdp_block_groups_read_as_regnet_keys():
    from ssl_engine.checkpoint.formats import vissl_key_prefix

    prefix = vissl_key_prefix("regnet")  # the regnet trunk is spelt as VISSL spells it
    key = "trunk._feature_blocks.res3.block2-part1.block2-3.f.a.weight"
    assert model_key_from_vissl(key, prefix) == "trunk._feature_blocks.res3.block2-3.f.a.weight"
    assert model_key_from_vissl("trunk._feature_blocks.res3.block2-3.f.a.weight", prefix) == \
        "trunk._feature_blocks.res3.block2-3.f.a.weight"
    assert model_key_from_vissl("trunk.base_model._feature_blocks.res3.block2-part0.block2-0.bn."
                                "weight", prefix) == "trunk._feature_blocks.res3.block2-0.bn.weight"


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_fsdp_config_float16_and_auto_wrap_reach_fsdp2(one_rank):
    """mixed_precision with compute_dtype float16: the trunk computes with float16 parameters,
    batch norms with float32 ones, the head in float32; gradients come back float32; convolutions
    of at least AUTO_WRAP_THRESHOLD parameters are units of their own."""
    from torch.distributed.fsdp import FSDPModule

    from ssl_engine.trainer.fsdp_task import fsdp_units, shard_model

    fsdp_cfg = config(mixed_precision=True, compute_dtype="float16", fp32_reduce_scatter=True,
                      AUTO_WRAP_THRESHOLD=2000).MODEL.FSDP_CONFIG
    model = seeded_model(config().MODEL).eval()
    reference = copy.deepcopy(model)
    units = dict(fsdp_units(model, fsdp_cfg))
    big_convs = [m for m in model.trunk.modules()
                 if isinstance(m, nn.Conv2d) and m.weight.numel() >= 2000]
    assert big_convs and all(any(conv is unit for unit in units.values()) for conv in big_convs)
    assert "trunk._feature_blocks.res5" in units and "heads.0" in units
    shard_model(model, fsdp_cfg)
    assert all(isinstance(conv, FSDPModule) for conv in big_convs)

    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    out = model(x)[0]
    with torch.no_grad():
        float_out = reference(x)[0]
    # the same computation by hand: trunk weights in float16 except batch norms, head float32
    for module in reference.trunk.modules():
        if not isinstance(module, nn.modules.batchnorm._BatchNorm):
            for name, param in module.named_parameters(recurse=False):
                setattr(module, name, nn.Parameter(param.detach().half()))
    with torch.no_grad():
        expected = reference.heads[0](reference.trunk(x.half())[0].float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.detach(), expected, rtol=0, atol=1e-5)
    assert not torch.allclose(out.detach(), float_out, rtol=0, atol=1e-6)  # float16 was used
    out.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
