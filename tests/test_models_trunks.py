"""The regnet and efficientnet trunks and the ResNeXt settings of the resnet trunk: stage
outputs against classy_vision's and torchvision's own networks, VISSL's settings, and the
refusal of bad settings before launch."""
import copy
from pathlib import Path

import pytest
import torch
import torchvision
import yaml
from torch import nn

from ssl_engine.config import compose_config
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.models import build_model
from ssl_engine.models.trunks import check_trunk_config
from ssl_engine.utils.classy import classy_vision  # noqa: F401  (warnings filtered)
from classy_vision.models import AnyNet, EfficientNet, RegNet  # noqa: E402
from classy_vision.models.efficientnet import MODEL_PARAMS  # noqa: E402

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])
# a RegNet of 4 stages of widths 8, 16, 32, 64 (blocks 1, 1, 3, 1)
TINY_REGNET = dict(depth=6, w_0=8, w_a=8.0, w_m=2.0, group_width=8, stem_width=8)


def model_cfg(trunk: str, **settings) -> AttrDict:
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = trunk
    section = {"regnet": "REGNET", "efficientnet": "EFFICIENT_NETS", "resnet": "RESNETS"}[trunk]
    cfg.TRUNK[section].update(settings)
    return cfg


def images(n=2, size=32, seed=1):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def n_params(module: nn.Module, skip_prefix: str = "") -> int:
    return sum(p.numel() for n, p in module.named_parameters()
               if not (skip_prefix and n.startswith(skip_prefix)))


# ------------------------------------------------------------------------------ RegNet
def regnet_to_classy_names(state):
    """Our (VISSL's) regnet parameter names -> those of classy_vision's RegNet."""
    renamed = {}
    for key, value in state.items():
        block, rest = key.split(".", 2)[1:]
        if block == "conv1":
            renamed[f"stem.{rest}"] = value
        else:
            renamed[f"trunk_output.block{int(block[3:]) - 1}.{rest}"] = value
    return renamed


def test_regnet_by_parameters_gives_classy_regnet_stages():
    torch.manual_seed(0)
    model = build_model(model_cfg("regnet", **TINY_REGNET)).eval()
    trunk = model.trunk
    assert trunk.stage_names == ["conv1", "res2", "res3", "res4", "res5", "avgpool", "flatten",
                                 "res5avg"]
    reference = RegNet.from_config(TINY_REGNET).eval()
    reference.load_state_dict(regnet_to_classy_names(trunk.state_dict()))
    x = images()
    with torch.no_grad():
        outputs = dict(zip(trunk.stage_names, trunk(x, trunk.stage_names)))
        res5 = reference(x)
        default = model(x)[0]
    assert {k: tuple(v.shape) for k, v in outputs.items()} == {
        "conv1": (2, 8, 16, 16), "res2": (2, 8, 8, 8), "res3": (2, 16, 4, 4),
        "res4": (2, 32, 2, 2), "res5": (2, 64, 1, 1), "avgpool": (2, 64, 1, 1),
        "flatten": (2, 64), "res5avg": (2, 64),
    }
    assert trunk.stage_dims["res5"] == 64 and trunk.output_dim == 64
    torch.testing.assert_close(outputs["res5"], res5)
    torch.testing.assert_close(default, res5.mean(dim=(2, 3)))
    torch.testing.assert_close(outputs["res5avg"], outputs["flatten"])


def test_regnet_preset_by_name_has_torchvision_regnet_y_400mf_shapes():
    with torch.device("meta"):
        trunk = build_model(model_cfg("regnet", name="regnet_y_400mf")).trunk
    reference = torchvision.models.regnet_y_400mf()  # its widths are computed on tensors
    assert n_params(trunk) == n_params(reference, skip_prefix="fc.")
    assert trunk.output_dim == reference.fc.in_features == 440


def test_regnet_anynet_follows_the_stage_lists():
    anynet = dict(depths=[1, 2], widths=[16, 24], group_widths=[8, 8],
                  bottleneck_multipliers=[1.0, 1.0], strides=[2, 1], stem_width=8)
    torch.manual_seed(0)
    trunk = build_model(model_cfg("regnet", name="anynet", **anynet)).trunk.eval()
    reference = AnyNet.from_config(anynet).eval()
    reference.load_state_dict(regnet_to_classy_names(trunk.state_dict()))
    with torch.no_grad():
        res3, pooled = trunk(images(), ["res3", "flatten"])
        torch.testing.assert_close(res3, reference(images()))
    assert tuple(res3.shape) == (2, 24, 8, 8) and tuple(pooled.shape) == (2, 24)
    assert len(trunk._feature_blocks["res3"]) == 2


# ------------------------------------------------------------------------ EfficientNet
def efficientnet_to_classy_names(state, classy_blocks):
    """Our (VISSL's) efficientnet parameter names -> those of classy_vision's EfficientNet,
    whose blocks are named ``classy_blocks`` (ours are block0, block1, ... in order)."""
    fixed = {"conv1.0": "conv_stem", "conv1.1": "bn0", "conv_final.0": "conv_head",
             "conv_final.1": "bn1"}
    renamed = {}
    for key, value in state.items():
        name = key[len("_feature_blocks."):]
        prefix, _, rest = name.rpartition(".")
        if prefix in fixed:
            renamed[f"{fixed[prefix]}.{rest}"] = value
        else:
            block, rest = name.split(".", 1)
            renamed[f"blocks.{classy_blocks[int(block[len('block'):])]}.{rest}"] = value
    return renamed


def classy_efficientnet_b0():
    model = EfficientNet(num_classes=1, model_params=MODEL_PARAMS["B0"], bn_momentum=0.01,
                         bn_epsilon=0.001, width_divisor=8, min_width=None,
                         drop_connect_rate=0.2, use_se=True)
    model.fc = nn.Identity()
    return model


# in training, batch norm over 2 x 1 x 1 values would amplify rounding: 4 images of 64 there
@pytest.mark.parametrize("training, n, size", [(False, 2, 32), (True, 4, 64)],
                         ids=["eval", "train"])
def test_efficientnet_b0_gives_classy_efficientnet_features(training, n, size):
    """In training the drop-connect rates and the dropout draw the same random numbers as
    classy's forward: the outputs agree only if every block gets classy's rate."""
    torch.manual_seed(0)
    trunk = build_model(model_cfg("efficientnet")).trunk.train(training)
    reference = classy_efficientnet_b0().train(training)
    classy_blocks = [name for name, _ in reference.blocks.named_children()]
    reference.load_state_dict(efficientnet_to_classy_names(trunk.state_dict(), classy_blocks))
    x = images(n, size)
    torch.manual_seed(5)
    with torch.no_grad():
        conv1, conv_final, flat, out = trunk(x, ["conv1", "conv_final", "flatten", "dropout"])
    torch.manual_seed(5)
    with torch.no_grad():
        expected = reference(x)
    assert tuple(conv1.shape) == (n, 32, size // 2, size // 2)
    assert tuple(conv_final.shape) == (n, 1280, size // 32, size // 32)
    assert trunk.default_out_feat_key == "dropout" and len(classy_blocks) == 16
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    if not training:
        torch.testing.assert_close(flat, expected, rtol=1e-4, atol=1e-4)


def test_efficientnet_versions_have_torchvision_parameter_counts():
    with torch.device("meta"):
        b0 = build_model(model_cfg("efficientnet")).trunk
        b2 = build_model(model_cfg("efficientnet", model_version="B2")).trunk
        reference_b0 = torchvision.models.efficientnet_b0()
    assert n_params(b0) == n_params(reference_b0, skip_prefix="classifier.")
    assert b0.output_dim == 1280 and b2.output_dim == 1408  # VISSL's B2 swav_head input


# ----------------------------------------------------------------------------- ResNeXt
def test_resnext50_32x4d_has_torchvision_state_dict_shapes():
    with torch.device("meta"):
        trunk = build_model(model_cfg("resnet", GROUPS=32, WIDTH_PER_GROUP=4)).trunk
        reference = torchvision.models.resnext50_32x4d()
    ours = {k: tuple(v.shape) for k, v in trunk.state_dict().items()}
    theirs = {k: tuple(v.shape) for k, v in reference.state_dict().items()
              if not k.startswith("fc.")}
    assert ours == theirs
    assert trunk.layer2[0].conv2.groups == 32


def test_resnext_width_multiplier_and_layer4_stride():
    torch.manual_seed(0)
    trunk = build_model(model_cfg("resnet", GROUPS=4, WIDTH_PER_GROUP=8, WIDTH_MULTIPLIER=0.25,
                                  SMALL_IMAGE_STEM=True, LAYER4_STRIDE=1)).trunk.eval()
    # grouped 3x3 width: planes x WIDTH_PER_GROUP / 64 x GROUPS, planes = 64 x 0.25 at res2
    assert trunk.layer1[0].conv2.out_channels == int(16 * 8 / 64) * 4
    assert trunk.layer4[0].conv2.groups == 4
    with torch.no_grad():
        res4, res5 = trunk(images(size=16), ["res4", "res5"])
    assert tuple(res4.shape) == (2, 256, 4, 4) and tuple(res5.shape) == (2, 512, 4, 4)


def test_resnet152_has_torchvision_parameter_count():
    with torch.device("meta"):
        trunk = build_model(model_cfg("resnet", DEPTH=152)).trunk
        reference = torchvision.models.resnet152()
        deepest = build_model(model_cfg("resnet", DEPTH=200)).trunk
    assert n_params(trunk) == n_params(reference, skip_prefix="fc.")
    assert [len(layer) for layer in (deepest.layer1, deepest.layer2, deepest.layer3,
                                     deepest.layer4)] == [3, 24, 36, 3]


# ------------------------------------------------------------------- refused settings
@pytest.mark.parametrize("trunk, settings, message", [
    ("regnet", {"name": "regnet_y_400gf"}, r"REGNET\.name='regnet_y_400gf' is not one of "
                                            r"anynet, regnet_x_1\.6gf"),
    ("regnet", {}, r"REGNET: set name .* missing: depth, w_0, w_a, w_m, group_width"),
    ("regnet", dict(TINY_REGNET, w_0=12), r"REGNET\.w_0=12 must be a positive multiple of 8"),
    ("regnet", dict(TINY_REGNET, w_m=1.0), r"REGNET\.w_m=1\.0 must be > 1"),
    ("regnet", dict(TINY_REGNET, block_type="bottleneck"),
     r"REGNET\.block_type='bottleneck' is not one of vanilla_block"),
    ("regnet", {"name": "regnet_y_400mf", "depth": 10},
     r"REGNET\.depth=10 cannot be combined with name='regnet_y_400mf'"),
    ("regnet", {"name": "regnet_y_400mf", "bn_momentum": 0.01},
     r"REGNET\.bn_momentum=0\.01 cannot be combined"),
    ("regnet", {"name": "anynet", "depths": [1, 2], "widths": [8], "group_widths": [8, 8],
                "bottleneck_multipliers": [1, 1], "strides": [2, 2]},
     r"REGNET: the per-stage lists must have one entry per stage"),
    ("regnet", dict(TINY_REGNET, stage_checkpoints=[[1], [], [2, 1], []]),
     r"REGNET\.stage_checkpoints=.* has stage 2 boundaries \[2, 1\]: they must be increasing"),
    ("regnet", dict(TINY_REGNET, stage_checkpoints=[[1]], stage_checkpointing=[[True, False]]),
     r"REGNET\.stage_checkpointing=.* has 2 flags for stage 0"),
    ("efficientnet", {"model_version": "B9"}, r"EFFICIENT_NETS\.model_version='B9' is not one "
                                              r"of B0, B1"),
    ("efficientnet", {"drop_connect_rate": 1.5}, r"EFFICIENT_NETS\.drop_connect_rate=1\.5"),
    ("resnet", {"DEPTH": 18, "GROUPS": 32}, r"RESNETS\.GROUPS=32 .* need bottleneck blocks"),
    ("resnet", {"LAYER4_STRIDE": 3}, r"RESNETS\.LAYER4_STRIDE must be 1 or 2, got 3"),
    ("resnet", {"STANDARDIZE_CONVOLUTIONS": True},
     r"RESNETS\.STANDARDIZE_CONVOLUTIONS=True is not supported"),
])
def test_bad_trunk_settings_are_refused_without_building(trunk, settings, message):
    cfg = model_cfg(trunk, **settings)
    with pytest.raises(ValueError, match=message):
        check_trunk_config(cfg)
    with pytest.raises(ValueError, match=message):
        build_model(cfg)


def test_efficientnet_refuses_activation_checkpointing():
    cfg = model_cfg("efficientnet")
    cfg.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING = True
    with pytest.raises(ValueError, match="USE_ACTIVATION_CHECKPOINTING=true is not supported "
                                         "by the efficientnet trunk"):
        check_trunk_config(cfg)


def test_launcher_refuses_a_bad_trunk_before_any_process(tmp_path):
    _, cfg = compose_config(["config=test/quick_simclr_synthetic",
                             "config.MODEL.TRUNK.NAME=regnet",
                             "config.MODEL.TRUNK.REGNET.name=regnet_y_4000mf",
                             f"config.CHECKPOINT.DIR={tmp_path}"])
    with pytest.raises(ValueError, match=r"REGNET\.name='regnet_y_4000mf' is not one of"):
        check_before_launch("train", cfg)


def test_evaluated_stages_are_checked_against_the_trunk():
    cfg = model_cfg("regnet", **TINY_REGNET)
    cfg.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON = True
    cfg.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP = [
        ["res4", ["AdaptiveAvgPool2d", [[1, 1]]]], ["avgpool", ["Identity", []]]]
    model = build_model(cfg).eval()
    with torch.no_grad():
        res4, avgpool = model(images())
    assert tuple(res4.shape) == (2, 32) and tuple(avgpool.shape) == (2, 64)
    cfg.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP = [["res5avg2", ["Identity", []]]]
    with pytest.raises(ValueError, match=r"no stage\(s\) \['res5avg2'\]"):
        build_model(cfg)
