"""The resnet trunk: stage shapes, torchvision compatibility, options and their errors."""
import copy
from pathlib import Path

import pytest
import torch
import torchvision
import yaml
from torch import nn

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models.trunks.resnet import ResNetTrunk

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])


def trunk(**resnet_overrides) -> ResNetTrunk:
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.RESNETS.update(resnet_overrides)
    torch.manual_seed(0)
    return ResNetTrunk(cfg)


def n_params(module: nn.Module, skip_prefix: str = "") -> int:
    named = module.named_parameters()
    return sum(p.numel() for n, p in named if not (skip_prefix and n.startswith(skip_prefix)))


@pytest.mark.parametrize("depth,expansion", [(18, 1), (50, 4)])
def test_stage_shapes_small_image_stem(depth, expansion):
    model = trunk(DEPTH=depth, SMALL_IMAGE_STEM=True).eval()
    assert model.stage_names == ["conv1", "res1", "res2", "res3", "res4", "res5", "res5avg"]
    with torch.no_grad():
        feats = model(torch.randn(2, 3, 32, 32), model.stage_names)
    e = expansion
    assert [tuple(f.shape) for f in feats] == [
        (2, 64, 32, 32), (2, 64, 32, 32), (2, 64 * e, 32, 32), (2, 128 * e, 16, 16),
        (2, 256 * e, 8, 8), (2, 512 * e, 4, 4), (2, 512 * e),
    ]
    assert model.output_dim == 512 * e


def test_default_output_is_pooled_res5_and_standard_stem_downsamples_32x():
    model = trunk(DEPTH=18).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        conv1, res1, res5 = model(x, ["conv1", "res1", "res5"])
        (default,) = model(x)
    assert tuple(res1.shape) == (1, 64, 16, 16)
    assert tuple(res5.shape) == (1, 512, 2, 2)
    torch.testing.assert_close(default, res5.mean(dim=(2, 3)))


def test_conv1_is_the_stem_before_its_max_pool_as_in_vissl():
    """VISSL's conv1 is the stem's ReLU output and res1 its max-pool: a 224 image gives a
    112x112 conv1, which VISSL's linear-evaluation files pool with AvgPool2d(10, 10, 4) to the
    12x12 = 144 positions their eval_mlp heads expect (64 x 144 = 9216 inputs)."""
    model = trunk(DEPTH=50).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        conv1, res1 = model(x, ["conv1", "res1"])
    stem = torch.relu(model.bn1(model.conv1(x)))
    torch.testing.assert_close(conv1, stem)
    torch.testing.assert_close(res1, nn.functional.max_pool2d(stem, 3, 2, 1))
    assert nn.AvgPool2d(10, 10, 4)(conv1).flatten(1).shape[1] == 9216


@pytest.mark.parametrize("depth", [18, 34, 50, 101])
def test_parameter_count_equals_torchvision_without_fc(depth):
    reference = getattr(torchvision.models, f"resnet{depth}")()
    assert n_params(trunk(DEPTH=depth)) == n_params(reference, skip_prefix="fc.")


def test_torchvision_state_dict_loads_and_gives_same_features():
    torch.manual_seed(1)
    reference = torchvision.models.resnet18().eval()
    model = trunk(DEPTH=18).eval()
    state = reference.state_dict()
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("fc.")})
    reference.fc = nn.Identity()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], reference(x))


def test_width_multiplier_scales_every_stage():
    model = trunk(DEPTH=50, WIDTH_MULTIPLIER=0.5)
    assert model.stage_dims == {
        "conv1": 32, "res1": 32, "res2": 128, "res3": 256, "res4": 512, "res5": 1024, "res5avg": 1024,
    }
    assert model.layer1[0].conv2.out_channels == 32
    with torch.no_grad():
        assert tuple(model.eval()(torch.randn(1, 3, 32, 32))[0].shape) == (1, 1024)


def test_group_norm_has_no_batch_norm():
    model = trunk(DEPTH=18, NORM="GroupNorm", GROUPNORM_GROUPS=8)
    kinds = {type(m) for m in model.modules()}
    assert nn.GroupNorm in kinds
    assert not any(issubclass(k, nn.modules.batchnorm._BatchNorm) for k in kinds)
    assert model.bn1.num_groups == 8


def test_group_norm_groups_must_divide_channels():
    with pytest.raises(ValueError, match="GROUPNORM_GROUPS=32 does not divide a layer of 16"):
        trunk(DEPTH=18, NORM="GroupNorm", WIDTH_MULTIPLIER=0.25)


def test_zero_init_residual_zeroes_last_norm_of_each_block():
    model = trunk(DEPTH=50, ZERO_INIT_RESIDUAL=True)
    layers = (model.layer1, model.layer2, model.layer3, model.layer4)
    blocks = [block for layer in layers for block in layer]
    assert len(blocks) == 16
    assert all(torch.count_nonzero(b.bn3.weight) == 0 for b in blocks)
    assert all(torch.all(b.bn2.weight == 1) for b in blocks)
    basic = trunk(DEPTH=18, ZERO_INIT_RESIDUAL=True)
    assert all(torch.count_nonzero(b.bn2.weight) == 0 for b in basic.layer3)


def test_small_image_stem_is_3x3_stride_1_without_maxpool():
    model = trunk(DEPTH=18, SMALL_IMAGE_STEM=True)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity)


def test_small_image_stem_stride_2_halves_every_map():
    model = trunk(DEPTH=18, SMALL_IMAGE_STEM=True, SMALL_IMAGE_STEM_STRIDE=2).eval()
    assert model.conv1.stride == (2, 2) and isinstance(model.maxpool, nn.Identity)
    with torch.no_grad():
        feats = model(torch.randn(2, 3, 28, 28), ["res2", "res5"])
    assert [tuple(f.shape[-2:]) for f in feats] == [(14, 14), (2, 2)]
    with pytest.raises(ValueError, match="SMALL_IMAGE_STEM_STRIDE must be 1 or 2, got 3"):
        trunk(DEPTH=18, SMALL_IMAGE_STEM=True, SMALL_IMAGE_STEM_STRIDE=3)
    with pytest.raises(ValueError, match="applies to the small-image stem"):
        trunk(DEPTH=18, SMALL_IMAGE_STEM_STRIDE=2)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"DEPTH": 77}, r"DEPTH must be one of \[18, 34, 50, 101, 152, 200\], got 77"),
        ({"NORM": "LayerNorm"}, "NORM must be BatchNorm or GroupNorm, got 'LayerNorm'"),
        ({"WIDTH_MULTIPLIER": 0}, "WIDTH_MULTIPLIER must be > 0"),
    ],
)
def test_bad_options_fail_with_key_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        trunk(**overrides)


def test_unknown_stage_lists_known_stages():
    model = trunk(DEPTH=18)
    message = "no stage.*'res6'.*stages are: conv1, res1, res2, res3, res4, res5, res5avg"
    with pytest.raises(ValueError, match=message):
        model(torch.randn(1, 3, 32, 32), ["res5", "res6"])


def test_lab_input_reads_the_l_channel_with_a_one_channel_conv1():
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.RESNETS.update(DEPTH=18, SMALL_IMAGE_STEM=True, WIDTH_MULTIPLIER=0.125)
    cfg.INPUT_TYPE = "lab"
    torch.manual_seed(0)
    lab = ResNetTrunk(cfg).eval()
    assert lab.conv1.weight.shape[1] == 1
    rgb = trunk(DEPTH=18, SMALL_IMAGE_STEM=True, WIDTH_MULTIPLIER=0.125).eval()
    state = lab.state_dict()
    # the same network on 3 channels, whose conv1 weighs channels 1 and 2 by zero
    conv1 = state["conv1.weight"]
    state["conv1.weight"] = torch.cat([conv1, torch.zeros_like(conv1).repeat(1, 2, 1, 1)], 1)
    rgb.load_state_dict(state)
    images = torch.randn(2, 3, 16, 16) * 40
    other_ab = images.clone()
    other_ab[:, 1:] = torch.randn(2, 2, 16, 16) * 40
    with torch.no_grad():
        out = lab(images)[0]
        assert torch.allclose(out, rgb(images)[0], atol=1e-4)
        assert torch.allclose(out, lab(other_ab)[0], atol=1e-6)
