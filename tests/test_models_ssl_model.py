"""build_model: trunk + heads, multi-crop input, state round trip and config errors."""
import copy
from pathlib import Path

import pytest
import torch
import yaml

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import BaseSSLMultiInputOutputModel, build_model

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])

SIMCLR_HEAD = [["mlp", {"dims": [512, 64, 16], "use_relu": True}]]


def model_cfg(head_params=SIMCLR_HEAD, trunk_name="resnet", **resnet_overrides):
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = trunk_name
    cfg.TRUNK.RESNETS.update(dict(DEPTH=18, SMALL_IMAGE_STEM=True), **resnet_overrides)
    cfg.HEAD.PARAMS = head_params
    return cfg


def make_model(seed=0, **kwargs) -> BaseSSLMultiInputOutputModel:
    torch.manual_seed(seed)
    return build_model(model_cfg(**kwargs))


def test_forward_returns_list_with_last_head_output():
    model = make_model().eval()
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        outputs = model(x)
        features = model.trunk(x)[0]
        projected = model.heads[0](features)
    assert isinstance(outputs, list) and len(outputs) == 1
    assert tuple(outputs[0].shape) == (3, 16)
    torch.testing.assert_close(outputs[0], projected)


def test_heads_are_chained_in_order():
    heads = [["mlp", {"dims": [512, 32]}], ["mlp", {"dims": [32, 5]}]]
    model = make_model(head_params=heads).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = model.heads[1](model.heads[0](model.trunk(x)[0]))
        torch.testing.assert_close(model(x)[0], expected)


def test_a_head_of_one_listed_output_feeds_the_next_head():
    """VISSL's semi-supervised SwAV files fine-tune a swav_head without prototypes (its
    output: [embedding]) under a classifier; a head of several outputs must still be last."""
    swav = ["swav_head", {"dims": [512, 32], "use_bn": True, "num_clusters": []}]
    model = make_model(head_params=[swav, ["mlp", {"dims": [32, 5]}]]).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        (embedding,) = model.heads[0](model.trunk(x)[0])
        torch.testing.assert_close(model(x)[0], model.heads[1](embedding))
    swav[1]["num_clusters"] = [4]
    model = make_model(head_params=[swav, ["mlp", {"dims": [32, 5]}]]).eval()
    with pytest.raises(ValueError, match=r"PARAMS\[0\] gives several outputs"):
        model(x)


def test_without_heads_returns_flattened_trunk_output():
    model = make_model(head_params=[]).eval()
    assert len(model.heads) == 0
    with torch.no_grad():
        (out,) = model(torch.randn(2, 3, 16, 16))
    assert tuple(out.shape) == (2, model.trunk.output_dim) == (2, 512)


def test_multi_crop_list_equals_concatenated_separate_runs():
    model = make_model().eval()
    torch.manual_seed(1)
    crops = [torch.randn(4, 3, 32, 32), torch.randn(4, 3, 32, 32), torch.randn(4, 3, 16, 16)]
    with torch.no_grad():
        together = model(crops)[0]
        separate = torch.cat([model(crop)[0] for crop in crops], dim=0)
    assert tuple(together.shape) == (12, 16)
    torch.testing.assert_close(together, separate)


def test_eval_mode_is_deterministic():
    model = make_model().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], model(x)[0], rtol=0, atol=0)


def test_extract_features_by_stage_name():
    model = make_model().eval()
    crops = [torch.randn(2, 3, 16, 16), torch.randn(1, 3, 16, 16)]
    with torch.no_grad():
        features = model.extract_features(crops, ["res5avg", "res4"])
        res4_second, res5avg_second = model.trunk(crops[1], ["res4", "res5avg"])
    assert list(features) == ["res5avg", "res4"]
    assert tuple(features["res5avg"].shape) == (3, 512)
    assert tuple(features["res4"].shape) == (3, 256, 4, 4)
    torch.testing.assert_close(features["res5avg"][2:], res5avg_second)
    torch.testing.assert_close(features["res4"][2:], res4_second)


def test_extract_features_errors():
    model = make_model().eval()
    crops = [torch.randn(1, 3, 32, 32), torch.randn(1, 3, 16, 16)]
    with pytest.raises(ValueError, match="no stage.*'res9'.*stages are: conv1, res1, res2"):
        model.extract_features(crops, ["res9"])
    with torch.no_grad(), pytest.raises(ValueError, match="stage 'res4' gives differently shaped"):
        model.extract_features(crops, ["res4"])


def test_state_round_trip_gives_same_outputs():
    source = make_model(seed=0).eval()
    target = make_model(seed=1).eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert not torch.allclose(source(x)[0], target(x)[0])
        state = source.get_classy_state()
        assert set(state) == {"model"} and set(state["model"]) == {"trunk", "heads"}
        assert "conv1.weight" in state["model"]["trunk"]
        assert "0.clf.0.weight" in state["model"]["heads"]
        target.set_classy_state(state)
        torch.testing.assert_close(source(x)[0], target(x)[0], rtol=0, atol=0)


def test_state_mismatch_names_the_keys():
    model = make_model()
    state = model.get_classy_state()
    del state["model"]["trunk"]["conv1.weight"]
    state["model"]["trunk"]["extra.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"trunk state: missing keys \(1\): conv1.weight; "
                                         r"unexpected keys \(1\): extra.weight"):
        model.set_classy_state(state)

    other_head = make_model(head_params=[["mlp", {"dims": [512, 8]}]]).get_classy_state()
    state = model.get_classy_state()
    state["model"]["heads"] = other_head["model"]["heads"]
    message = (
        r"heads state: .*shape mismatches \(2\): "
        r"0.clf.0.weight: checkpoint \(8, 512\) vs model \(64, 512\)"
    )
    with pytest.raises(ValueError, match=message):
        model.set_classy_state(state)

    with pytest.raises(ValueError, match=r"found keys \['trunk'\]"):
        model.set_classy_state({"model": {"trunk": {}}})


def test_unknown_trunk_and_head_names_suggest_closest():
    with pytest.raises(KeyError, match="unknown model trunk 'resnt': did you mean 'resnet'"):
        make_model(trunk_name="resnt")
    with pytest.raises(KeyError, match="unknown model head 'mpl': did you mean 'mlp'"):
        make_model(head_params=[["mpl", {"dims": [512, 8]}]])


def test_bad_head_entries_fail_with_their_position():
    message = r"MODEL.HEAD.PARAMS\[1\] must be \[head_name, \{params\}\]"
    with pytest.raises(ValueError, match=message):
        make_model(head_params=[["mlp", {"dims": [512, 8]}], "mlp"])
    message = r"MODEL.HEAD.PARAMS\[0\] \('mlp'\) has invalid params.*use_bnn"
    with pytest.raises(ValueError, match=message):
        make_model(head_params=[["mlp", {"dims": [512, 8], "use_bnn": True}]])


def test_input_must_be_tensor_or_list_of_tensors():
    model = make_model()
    with pytest.raises(TypeError, match="a Tensor or a non-empty list of Tensors"):
        model([])
