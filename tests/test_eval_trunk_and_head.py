"""MODEL.FEATURE_EVAL_SETTINGS.EVAL_TRUNK_AND_HEAD and ASSERT_HEAD_LAYER_SHAPE_INIT: evaluating a
trained model's heads with the weights file's head weights."""
import copy
from pathlib import Path

import pytest
import torch
import yaml

from ssl_engine.checkpoint import WeightsInitError, load_weights_init
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model

DEFAULTS = AttrDict(yaml.safe_load((Path(__file__).resolve().parents[1]
                                    / "configs/config/defaults.yaml").read_text())["config"])
HEADS = [["mlp", {"dims": [64, 16], "use_relu": True}], ["mlp", {"dims": [16, 8]}]]


def model(seed, heads=HEADS, **eval_settings):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.RESNETS.update(DEPTH=18, WIDTH_MULTIPLIER=0.125, SMALL_IMAGE_STEM=True)
    cfg.HEAD.PARAMS = heads
    cfg.FEATURE_EVAL_SETTINGS.update(eval_settings)
    torch.manual_seed(seed)
    return build_model(cfg)


EVAL_HEADS = dict(EVAL_MODE_ON=True, FREEZE_TRUNK_AND_HEAD=True, EVAL_TRUNK_AND_HEAD=True)


def weights(path, **overrides):
    cfg = copy.deepcopy(DEFAULTS.MODEL.WEIGHTS_INIT)
    cfg.update(PARAMS_FILE=str(path), STATE_DICT_KEY_NAME="", **overrides)
    return cfg


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model (seed 0) and its weights file."""
    original = model(seed=0)
    with torch.no_grad():  # batch-norm statistics of its own, so that they count too
        original.train()(torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(2)))
    path = tmp_path_factory.mktemp("weights") / "model.torch"
    torch.save(original.state_dict(), path)
    return original.eval(), path


def test_heads_come_from_the_file_and_give_the_original_output(trained):
    original, path = trained
    evaluated = model(seed=1, **EVAL_HEADS)
    report = load_weights_init(evaluated, weights(path))
    assert not report.missing
    for key, value in torch.load(path).items():
        if key.endswith("num_batches_tracked"):
            continue  # a counter, in MODEL.WEIGHTS_INIT.SKIP_LAYERS by default
        assert torch.equal(evaluated.state_dict()[key], value), key
    x = torch.randn(3, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        (out,), (expected,) = evaluated.eval()(x), original(x)
    assert out.shape == (3, 8)  # the last head's output
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_a_file_without_the_heads_is_refused_with_eval_trunk_and_head(trained, tmp_path):
    original, _ = trained
    trunk_only = {k: v for k, v in original.state_dict().items() if k.startswith("trunk.")}
    torch.save(trunk_only, tmp_path / "trunk.torch")
    with pytest.raises(WeightsInitError, match=r"EVAL_TRUNK_AND_HEAD=true evaluates the heads .*"
                                               r"4 head tensor\(s\) are not loaded from it"):
        load_weights_init(model(seed=1, **EVAL_HEADS), weights(tmp_path / "trunk.torch"))
    # false: as before, the trunk is loaded and the heads keep their initial weights
    fresh = model(seed=1, **dict(EVAL_HEADS, EVAL_TRUNK_AND_HEAD=False))
    initial = copy.deepcopy(fresh.heads.state_dict())
    report = load_weights_init(fresh, weights(tmp_path / "trunk.torch"))
    assert sorted(report.missing) == sorted(f"heads.{k}" for k in initial)
    for key, value in fresh.heads.state_dict().items():
        assert torch.equal(value, initial[key])


def test_assert_head_layer_shape_init_false_leaves_reshaped_heads(trained):
    original, path = trained
    heads = [HEADS[0], ["mlp", {"dims": [16, 5]}]]  # a new classifier of 5 classes
    with pytest.raises(WeightsInitError, match=r"heads.1.clf.0.weight: file \(8, 16\) vs model"):
        load_weights_init(model(seed=1, heads=heads), weights(path))
    tolerant = model(seed=1, heads=heads, ASSERT_HEAD_LAYER_SHAPE_INIT=False)
    initial = copy.deepcopy(tolerant.state_dict())
    report = load_weights_init(tolerant, weights(path))
    skipped = sorted(key for key in report.skipped if key.startswith("heads."))
    assert skipped == ["heads.1.clf.0.bias", "heads.1.clf.0.weight"]
    state, saved = tolerant.state_dict(), torch.load(path)
    for key, value in state.items():  # the trunk and the first head from the file
        if key.endswith("num_batches_tracked"):
            continue
        expected = initial[key] if key.startswith("heads.1.") else saved[key]
        assert torch.equal(value, expected), key
