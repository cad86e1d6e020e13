"""Feature-evaluation model: one head per pooled stage, frozen parts, extract_layers, eval_mlp."""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model
from ssl_engine.models.heads.eval_mlp import EvalMLP

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])

# ResNet-18 at width 0.25, small stem, 8x8 input: res4 is 64 x 2 x 2, res5avg is 128.
POOL_MAP = [["res4", ["AdaptiveAvgPool2d", [[2, 2]]]], ["res5avg", ["Identity", []]]]
EVAL_HEADS = [
    ["eval_mlp", {"in_channels": 256, "dims": [256, 10]}],
    ["eval_mlp", {"in_channels": 128, "dims": [128, 10]}],
]


def eval_model(heads=EVAL_HEADS, pool_map=POOL_MAP, seed=0, **settings):
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.RESNETS.update(DEPTH=18, WIDTH_MULTIPLIER=0.25, SMALL_IMAGE_STEM=True)
    cfg.HEAD.PARAMS = heads
    cfg.FEATURE_EVAL_SETTINGS.update(EVAL_MODE_ON=True, LINEAR_EVAL_FEAT_POOL_OPS_MAP=pool_map)
    cfg.FEATURE_EVAL_SETTINGS.update(settings)
    torch.manual_seed(seed)
    return build_model(cfg)


def images(n=4, size=8, seed=1):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def manual_stage_features(model, x):
    """res4 average-pooled to 2x2 by hand, and res5avg, both flattened."""
    res4, res5avg = model.trunk(x, ["res4", "res5avg"])
    return [F.adaptive_avg_pool2d(res4, 2).flatten(1), res5avg]


def test_each_head_gets_its_own_pooled_stage():
    model = eval_model().eval()
    x = images()
    with torch.no_grad():
        outputs = model(x)
        res4, res5avg = manual_stage_features(model, x)
        expected = [model.heads[0](res4), model.heads[1](res5avg)]
    assert res4.shape == (4, 256) and res5avg.shape == (4, 128)
    assert len(outputs) == 2
    for output, reference in zip(outputs, expected):
        assert output.shape == (4, 10)
        torch.testing.assert_close(output, reference)


def test_without_heads_forward_returns_the_pooled_features():
    model = eval_model(heads=[]).eval()
    x = images()
    with torch.no_grad():
        outputs, expected = model(x), manual_stage_features(model, x)
    for output, reference in zip(outputs, expected):
        torch.testing.assert_close(output, reference)


def test_multi_crop_pooling_happens_before_concatenation():
    model = eval_model(heads=[]).eval()
    small, large = images(2, 8, seed=2), images(3, 16, seed=3)
    with torch.no_grad():
        res4, res5avg = model([small, large])
        expected = [torch.cat(parts) for parts in zip(manual_stage_features(model, small),
                                                     manual_stage_features(model, large))]
    torch.testing.assert_close(res4, expected[0])
    torch.testing.assert_close(res5avg, expected[1])


def test_the_map_is_ignored_without_eval_mode():
    heads = [["mlp", {"dims": [128, 16]}], ["mlp", {"dims": [16, 3]}]]
    model = eval_model(heads=heads, EVAL_MODE_ON=False).eval()
    x = images()
    with torch.no_grad():
        (output,) = model(x)
        expected = model.heads[1](model.heads[0](model.trunk(x)[0]))
    torch.testing.assert_close(output, expected)


def test_head_and_stage_counts_must_match():
    with pytest.raises(ValueError, match=r"has 1 head\(s\) but .*LINEAR_EVAL_FEAT_POOL_OPS_MAP "
                                         r"has 2 stage\(s\) \['res4', 'res5avg'\]"):
        eval_model(heads=EVAL_HEADS[:1])


def test_unknown_stage_lists_the_trunk_stages():
    with pytest.raises(ValueError, match=r"no stage\(s\) \['res6'\]; its stages are: "
                                         r"conv1, res1, res2, res3, res4, res5, res5avg"):
        eval_model(pool_map=[["res6", ["Identity", []]]], heads=[])


@pytest.mark.parametrize("pool_map, message", [
    ([["res4", ["NoSuchPool", []]]], r"\[0\]: 'NoSuchPool' is not a torch.nn module"),
    ([["res4", "AdaptiveAvgPool2d"]], r"must be \[stage, \[pool_op_name, \[args\]\]\]"),
    ([["res4", ["AdaptiveAvgPool2d", []]]], r"cannot build AdaptiveAvgPool2d"),
])
def test_bad_pool_ops_map_entries_are_refused(pool_map, message):
    with pytest.raises(ValueError, match=message):
        eval_model(pool_map=pool_map, heads=[])


def all_modules_training(module):
    return {m.training for m in module.modules()}


def test_freeze_trunk_only_keeps_the_trunk_fixed_while_heads_learn():
    model = eval_model(FREEZE_TRUNK_ONLY=True)
    model.train()
    assert all_modules_training(model.trunk) == {False}
    assert all_modules_training(model.heads) == {True}
    assert not any(p.requires_grad for p in model.trunk.parameters())
    assert all(p.requires_grad for p in model.heads.parameters())

    trunk_before = copy.deepcopy(model.trunk.state_dict())
    heads_before = copy.deepcopy(model.heads.state_dict())
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    loss = sum(F.cross_entropy(out, torch.arange(4)) for out in model(images()))
    loss.backward()
    optimizer.step()

    for key, value in model.trunk.state_dict().items():
        torch.testing.assert_close(value, trunk_before[key], rtol=0, atol=0)
    changed = [k for k, v in model.heads.state_dict().items()
               if not torch.equal(v, heads_before[k])]
    # weights, biases and running statistics of both heads moved
    assert {"0.mlp.clf.0.weight", "1.mlp.clf.0.weight", "0.channel_bn.running_mean",
            "1.channel_bn.running_var"} <= set(changed)


def test_freeze_trunk_and_head_freezes_everything():
    model = eval_model(FREEZE_TRUNK_AND_HEAD=True)
    model.train()
    assert all_modules_training(model) == {False}
    assert not any(p.requires_grad for p in model.parameters())


def test_extract_trunk_stages_pooled():
    model = eval_model(EXTRACT_TRUNK_FEATURES_ONLY=True, FREEZE_TRUNK_AND_HEAD=True)
    x = images()
    with torch.no_grad():
        layers = model.extract_layers(x)
        expected = manual_stage_features(model, x)
    assert list(layers) == model.extract_layer_names() == ["res4", "res5avg"]
    torch.testing.assert_close(layers["res4"], expected[0])
    torch.testing.assert_close(layers["res5avg"], expected[1])


def test_extract_trunk_stages_unflattened():
    model = eval_model(EXTRACT_TRUNK_FEATURES_ONLY=True, SHOULD_FLATTEN_FEATS=False).eval()
    with torch.no_grad():
        layers = model.extract_layers(images())
    assert layers["res4"].shape == (4, 64, 2, 2) and layers["res5avg"].shape == (4, 128)


def test_extract_trunk_default_stage_without_map():
    model = eval_model(heads=[], pool_map=[], EXTRACT_TRUNK_FEATURES_ONLY=True).eval()
    x = images()
    with torch.no_grad():
        layers = model.extract_layers(x)
        (expected,) = model.trunk(x, ["res5avg"])
    assert model.extract_layer_names() == ["res5avg"]
    torch.testing.assert_close(layers["res5avg"], expected)


def test_extract_head_outputs():
    model = eval_model().eval()
    x = images()
    with torch.no_grad():
        layers, outputs = model.extract_layers(x), model(x)
    assert list(layers) == model.extract_layer_names() == ["heads0", "heads1"]
    torch.testing.assert_close(layers["heads0"], outputs[0])
    torch.testing.assert_close(layers["heads1"], outputs[1])

    single = eval_model(heads=[["mlp", {"dims": [128, 5]}]], pool_map=[]).eval()
    with torch.no_grad():
        layers = single.extract_layers(x)
        (expected,) = single(x)
    assert single.extract_layer_names() == ["heads"]
    torch.testing.assert_close(layers["heads"], expected)


@pytest.mark.parametrize("train_mode", [True, False])
def test_eval_mlp_equals_batchnorm_then_linear(train_mode):
    torch.manual_seed(0)
    head = EvalMLP(in_channels=12, dims=[12, 5])
    reference = nn.Sequential(nn.BatchNorm1d(12), nn.Linear(12, 5))
    with torch.no_grad():
        head.channel_bn.weight.uniform_(0.5, 2.0)
        head.channel_bn.bias.uniform_(-1.0, 1.0)
        head.channel_bn.running_mean.uniform_(-1.0, 1.0)
        head.channel_bn.running_var.uniform_(0.5, 2.0)
    reference.load_state_dict({
        "0." + k: v for k, v in head.channel_bn.state_dict().items()
    } | {"1." + k: v for k, v in head.mlp.clf[0].state_dict().items()})
    head.train(train_mode)
    reference.train(train_mode)
    x = torch.randn(6, 3, 2, 2)  # flattened to 12 features
    torch.testing.assert_close(head(x), reference(x.flatten(1)))
    torch.testing.assert_close(head.channel_bn.running_mean, reference[0].running_mean)


def test_eval_mlp_without_bn_is_linear_and_checks_sizes():
    head = EvalMLP(in_channels=8, dims=[8, 3], use_bn=False)
    x = torch.randn(2, 8)
    torch.testing.assert_close(head(x), x @ head.mlp.clf[0].weight.T + head.mlp.clf[0].bias)
    with pytest.raises(ValueError, match=r"dims must start with in_channels=8, got dims=\[4, 3\]"):
        EvalMLP(in_channels=8, dims=[4, 3])
    with pytest.raises(ValueError, match="expects 8 input features .* got 6"):
        EvalMLP(in_channels=8, dims=[8, 3])(torch.randn(2, 6))
