"""The AlexNet trunks (alexnet_deepcluster, _bvlc, _jigsaw, _rotnet, _colorization): named
output shapes, parameter names of VISSL's trunks (and the loading of a VISSL checkpoint), the
Sobel input filter, the L channel of the colorization trunk, and the shapes the linear
evaluation configs expect."""
import copy
from pathlib import Path

import pytest
import torch
import yaml
from torch.nn import functional as F

from ssl_engine.checkpoint import formats, load_weights_init
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.unsupported import UNSUPPORTED_NAMES
from ssl_engine.models import MODEL_TRUNKS, build_model
from ssl_engine.models.trunks import check_trunk_config

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])
VARIANTS = ["alexnet_deepcluster", "alexnet_bvlc", "alexnet_jigsaw", "alexnet_rotnet",
            "alexnet_colorization"]
STAGES = ["conv1", "pool1", "conv2", "pool2", "conv3", "conv4", "conv5", "pool5", "flatten"]

# [N, C, H, W] of every stage for a 67x67 input: worked out by hand from each variant's
# kernel / stride / padding ((size + 2 * pad - kernel) // stride + 1; the pools are 3x3 / 2)
SHAPES_67 = {
    # conv1 11/4 pad 2: 16 -> 7 -> 7 -> 3 -> 3 -> 1
    "alexnet_deepcluster": [(96, 16), (96, 7), (256, 7), (256, 3), (384, 3), (384, 3),
                            (256, 3), (256, 1)],
    # conv1 11/4 no pad: 15 -> 7 -> 7 -> 3 -> 3 -> 1
    "alexnet_bvlc": [(96, 15), (96, 7), (256, 7), (256, 3), (384, 3), (384, 3), (256, 3),
                     (256, 1)],
    # conv1 11/2 no pad: 29 -> 14 -> 14 -> 6 -> 6 -> 2
    "alexnet_jigsaw": [(96, 29), (96, 14), (256, 14), (256, 6), (384, 6), (384, 6), (256, 6),
                       (256, 2)],
    "alexnet_rotnet": [(64, 16), (64, 7), (192, 7), (192, 3), (384, 3), (256, 3), (256, 3),
                       (256, 1)],
    "alexnet_colorization": [(96, 15), (96, 7), (256, 7), (256, 3), (384, 3), (384, 3),
                             (256, 3), (256, 1)],
}

# VISSL's modules: block index -> (conv weight shape, has batch norm); grouped convolutions
# (groups=2) halve the input channels of the weight
CONVS = {
    "alexnet_deepcluster": {0: ((96, 2, 11, 11), True), 2: ((256, 96, 5, 5), True),
                            4: ((384, 256, 3, 3), True), 5: ((384, 384, 3, 3), True),
                            6: ((256, 384, 3, 3), True)},
    "alexnet_bvlc": {0: ((96, 3, 11, 11), False), 2: ((256, 48, 5, 5), False),
                     4: ((384, 256, 3, 3), False), 5: ((384, 192, 3, 3), False),
                     6: ((256, 192, 3, 3), False)},
    "alexnet_jigsaw": {0: ((96, 3, 11, 11), False), 2: ((256, 48, 5, 5), False),
                       4: ((384, 256, 3, 3), True), 5: ((384, 192, 3, 3), True),
                       6: ((256, 192, 3, 3), True)},
    "alexnet_rotnet": {0: ((64, 3, 11, 11), True), 2: ((192, 64, 5, 5), True),
                       4: ((384, 192, 3, 3), True), 5: ((256, 384, 3, 3), True),
                       6: ((256, 256, 3, 3), True)},
    "alexnet_colorization": {0: ((96, 1, 11, 11), True), 2: ((256, 48, 5, 5), True),
                             4: ((384, 256, 3, 3), True), 5: ((384, 192, 3, 3), True),
                             6: ((256, 192, 3, 3), True)},
}
SOBEL_KEYS = {"sobel.0.weight": (1, 3, 1, 1), "sobel.0.bias": (1,),
              "sobel.1.weight": (2, 1, 3, 3), "sobel.1.bias": (2,)}


def model_cfg(trunk: str, **eval_settings) -> AttrDict:
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = trunk
    cfg.HEAD.PARAMS = []
    if trunk == "alexnet_colorization":
        cfg.INPUT_TYPE = "lab"
    cfg.FEATURE_EVAL_SETTINGS.update(eval_settings)
    return cfg


def vissl_trunk_keys(trunk: str) -> dict:
    """VISSL's trunk state-dict keys (with ``_feature_blocks.``) and shapes."""
    keys = dict(SOBEL_KEYS) if trunk == "alexnet_deepcluster" else {}
    for index, (weight, batch_norm) in CONVS[trunk].items():
        prefix = f"_feature_blocks.{index}"
        keys[f"{prefix}.0.weight"], keys[f"{prefix}.0.bias"] = weight, (weight[0],)
        if batch_norm:
            for name in ("weight", "bias", "running_mean", "running_var"):
                keys[f"{prefix}.1.{name}"] = (weight[0],)
            keys[f"{prefix}.1.num_batches_tracked"] = ()
    return keys


def test_the_alexnet_names_are_registered_and_no_longer_refused():
    refused = UNSUPPORTED_NAMES.get("config.MODEL.TRUNK.NAME", {})
    for name in VARIANTS:
        assert name in MODEL_TRUNKS.names() and name not in refused
        check_trunk_config(model_cfg(name))


@pytest.mark.parametrize("trunk", VARIANTS)
def test_named_outputs_and_their_shapes(trunk):
    torch.manual_seed(0)
    net = build_model(model_cfg(trunk)).trunk.eval()
    x = torch.randn(2, 3, 67, 67, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        outputs = dict(zip(STAGES, net(x, STAGES)))
        (default,) = net(x)
    expected = {name: (2, c, s, s) for name, (c, s) in zip(STAGES, SHAPES_67[trunk])}
    channels, size = SHAPES_67[trunk][-1][0], SHAPES_67[trunk][-1][1]
    expected["flatten"] = (2, channels * size * size)
    assert {k: tuple(v.shape) for k, v in outputs.items()} == expected
    assert net.stage_names == STAGES
    assert [net.stage_dims[k] for k in STAGES[:-1]] == [c for c, _ in SHAPES_67[trunk]]
    # at the crop of VISSL's configs (224 or 227): 256 x 6 x 6, jigsaw's conv1 of stride 2 12 x 12
    assert net.stage_dims["flatten"] == (36864 if trunk == "alexnet_jigsaw" else 9216)
    torch.testing.assert_close(default, outputs["flatten"])
    torch.testing.assert_close(outputs["flatten"], outputs["pool5"].flatten(1))
    assert (outputs["conv3"] >= 0).all() and (outputs["conv3"] > 0).any()  # after ReLU


@pytest.mark.parametrize("trunk", VARIANTS)
def test_parameter_names_are_vissls_and_a_vissl_checkpoint_loads(trunk):
    with torch.device("meta"):
        state = build_model(model_cfg(trunk)).trunk.state_dict()
    expected = vissl_trunk_keys(trunk)
    ours = {formats.trunk_key_to_vissl(k): tuple(v.shape) for k, v in state.items()}
    assert ours == expected


def test_a_vissl_deepcluster_checkpoint_loads_strictly_and_as_weights_init(tmp_path):
    generator = torch.Generator().manual_seed(3)
    trunk = {key: (torch.randint(0, 5, shape, generator=generator) if key.endswith("tracked")
                   else torch.randn(shape, generator=generator))
             for key, shape in vissl_trunk_keys("alexnet_deepcluster").items()}
    checkpoint = {"classy_state_dict": {"base_model": {"model": {"trunk": trunk, "heads": {}}}}}
    assert formats.is_vissl_checkpoint(checkpoint, formats.vissl_key_prefix("alexnet_deepcluster"))

    model = build_model(model_cfg("alexnet_deepcluster"))
    formats.load_vissl_model_weights(model, checkpoint)
    loaded = model.trunk.state_dict()
    torch.testing.assert_close(loaded["0.0.weight"], trunk["_feature_blocks.0.0.weight"])
    torch.testing.assert_close(loaded["sobel.1.weight"], trunk["sobel.1.weight"])
    # this engine's own checkpoint of the trunk is not taken for a VISSL one
    ours = formats.engine_checkpoint(model.get_classy_state()["model"])
    assert not formats.is_vissl_checkpoint(ours, formats.vissl_key_prefix("alexnet_deepcluster"))

    # a linear-evaluation checkpoint (trunk wrapped as base_model.) as MODEL.WEIGHTS_INIT
    wrapped = {f"base_model.{key}": value for key, value in trunk.items()}
    path = tmp_path / "vissl_eval.torch"
    torch.save({"classy_state_dict": {"base_model": {"model": {"trunk": wrapped, "heads": {}}}}},
               path)
    fresh = build_model(model_cfg("alexnet_deepcluster"))
    report = load_weights_init(fresh, {"PARAMS_FILE": str(path),
                                       "STATE_DICT_KEY_NAME": "classy_state_dict"})
    assert not report.missing and not report.unexpected
    torch.testing.assert_close(fresh.trunk.state_dict()["6.1.running_var"],
                               trunk["_feature_blocks.6.1.running_var"])
    torch.testing.assert_close(fresh.trunk.state_dict()["sobel.0.weight"],
                               trunk["sobel.0.weight"])


def test_deepcluster_sobel_filter_is_grayscale_then_the_two_sobel_kernels():
    net = build_model(model_cfg("alexnet_deepcluster")).trunk.eval()
    x = torch.randn(2, 3, 9, 11, generator=torch.Generator().manual_seed(2))
    gray = (x[:, 0] + x[:, 1] + x[:, 2]) / 3
    padded = F.pad(gray, (1, 1, 1, 1))
    h, w = gray.shape[1:]

    def at(di, dj):  # gray[i + di, j + dj] for every (i, j), zero outside the image
        return padded[:, 1 + di:1 + di + h, 1 + dj:1 + dj + w]

    # horizontal: left column minus right column, weights 1 2 1
    gx = (at(-1, -1) + 2 * at(0, -1) + at(1, -1)) - (at(-1, 1) + 2 * at(0, 1) + at(1, 1))
    # vertical: top row minus bottom row, weights 1 2 1
    gy = (at(-1, -1) + 2 * at(-1, 0) + at(-1, 1)) - (at(1, -1) + 2 * at(1, 0) + at(1, 1))
    expected = torch.stack([gx, gy], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(net.sobel(x), expected)
        big = torch.randn(1, 3, 67, 67, generator=torch.Generator().manual_seed(4))
        (conv1,) = net(big, ["conv1"])
        torch.testing.assert_close(conv1, net._modules["0"](net.sobel(big)))
    assert not any(p.requires_grad for p in net.sobel.parameters())
    assert all(p.requires_grad for name, p in net.named_parameters()
               if not name.startswith("sobel."))


def test_colorization_reads_the_l_channel_of_lab_inputs_only():
    cfg = model_cfg("alexnet_colorization")
    cfg.INPUT_TYPE = "rgb"
    with pytest.raises(ValueError, match="INPUT_TYPE=rgb.*LAB"):
        check_trunk_config(cfg)
    torch.manual_seed(0)
    net = build_model(model_cfg("alexnet_colorization")).trunk.eval()
    lab = torch.randn(1, 3, 67, 67, generator=torch.Generator().manual_seed(5))
    other_ab = lab.clone()
    other_ab[:, 1:] = torch.randn(1, 2, 67, 67, generator=torch.Generator().manual_seed(6))
    other_l = lab.clone()
    other_l[:, 0] += 1.0
    with torch.no_grad():
        torch.testing.assert_close(net(lab)[0], net(other_ab)[0])
        assert not torch.allclose(net(lab)[0], net(other_l)[0])


def test_deepcluster_linear_eval_features_at_224_have_the_configs_widths():
    """The pool ops of VISSL's alexnet_deepcluster linear evaluation on 224-pixel crops give
    the input widths of its eval_mlp heads (9600, 9216, 9600, 9600, 9216)."""
    pool_ops = [["conv1", ["AvgPool2d", [[19, 19], 4, 0]]],
                ["conv2", ["AvgPool2d", [[12, 12], 3, 0]]],
                ["conv3", ["AvgPool2d", [[9, 9], 1, 0]]],
                ["conv4", ["AvgPool2d", [[9, 9], 1, 0]]],
                ["conv5", ["AvgPool2d", [[8, 8], 1, 0]]]]
    torch.manual_seed(0)
    model = build_model(model_cfg("alexnet_deepcluster", EVAL_MODE_ON=True,
                                  FREEZE_TRUNK_ONLY=True,
                                  LINEAR_EVAL_FEAT_POOL_OPS_MAP=pool_ops)).eval()
    with torch.no_grad():
        features = model(torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(7)))
    assert [tuple(f.shape) for f in features] == [(1, 9600), (1, 9216), (1, 9600), (1, 9600),
                                                  (1, 9216)]
