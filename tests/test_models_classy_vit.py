"""The classy_vit trunk: its output, VISSL's parameter names (classy_vision's ViT held as
``model``), VISSL checkpoint layouts, the settings it reads and refuses."""
import copy
from pathlib import Path

import pytest
import torch
import yaml

from ssl_engine.checkpoint import load_weights_init
from ssl_engine.checkpoint.formats import (load_vissl_model_weights, vissl_checkpoint,
                                           vissl_key_prefix)
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.unsupported import UNSUPPORTED_NAMES
from ssl_engine.engines.registered_names import check_registered_names
from ssl_engine.models import build_model

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULTS = AttrDict(yaml.safe_load(f)["config"])

D, LAYERS, SIZE, PATCH = 16, 2, 16, 8
# VISSL's classy_vit configs also set QKV_BIAS and DROP_PATH_RATE, which its trunk does not read
TINY = dict(IMAGE_SIZE=SIZE, PATCH_SIZE=PATCH, HIDDEN_DIM=D, NUM_LAYERS=LAYERS, NUM_HEADS=2,
            MLP_DIM=32, CLASSIFIER="token", QKV_BIAS=True, DROP_PATH_RATE=0.1)


def vit_cfg(heads=(), **overrides):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.NAME = "classy_vit"
    cfg.TRUNK.VISION_TRANSFORMERS.update(TINY, **overrides)
    cfg.HEAD.PARAMS = [list(head) for head in heads]
    return cfg


def make_model(seed=0, heads=(), **overrides):
    torch.manual_seed(seed)
    model = build_model(vit_cfg(heads, **overrides))
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if tensor.is_floating_point() and key.startswith("trunk."):
                tensor.normal_(0, 0.3)
    return model.eval()


def images(n=2, seed=1, size=(SIZE, SIZE)):
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(seed))


def vissl_classy_vit_keys(layers, class_token=True):
    """The state-dict keys of VISSL's ClassyViT: classy_vision's VisionTransformer as ``model``
    (patch convolution, class token, an encoder of pre-norm layers with torch's multi-head
    attention and a two-layer MLP, a final norm)."""
    wb = ("weight", "bias")
    keys = ["model.conv_proj.weight", "model.conv_proj.bias", "model.encoder.pos_embedding",
            "model.encoder.ln.weight", "model.encoder.ln.bias"]
    keys += ["model.class_token"] if class_token else []
    for i in range(layers):
        p = f"model.encoder.layers.layer_{i}."
        keys += [p + "self_attention.in_proj_weight", p + "self_attention.in_proj_bias"]
        keys += [p + f"{m}.{w}" for m in ("ln_1", "self_attention.out_proj", "ln_2",
                                          "mlp.linear_1", "mlp.linear_2") for w in wb]
    return keys


def test_the_output_is_the_normed_class_token_or_patch_mean():
    trunk = make_model().trunk
    assert trunk.stage_dims == {"avgpool": D} and trunk.output_dim == D
    x = images()
    with torch.no_grad():
        (out,) = trunk(x, ["avgpool"])
        (default,) = trunk(x)
        # the class token after the encoder (its final norm included), computed by hand
        tokens = trunk.model.conv_proj(x).flatten(2).permute(2, 0, 1)  # [patches, N, D]
        tokens = torch.cat([trunk.model.class_token.expand(-1, 2, -1), tokens])
        expected = trunk.model.encoder(tokens)[0]
    assert out.shape == (2, D)
    torch.testing.assert_close(default, out, rtol=0, atol=0)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="lastCLS"):
        trunk(x, ["lastCLS"])
    with pytest.raises(ValueError, match="takes 16 x 16 images"):
        trunk(images(size=(16, 24)))
    gap = make_model(CLASSIFIER="gap").trunk
    assert gap.model.encoder.pos_embedding.shape[0] == (SIZE // PATCH) ** 2  # no class token
    with torch.no_grad():
        assert gap(x)[0].shape == (2, D)


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_parameter_names_are_those_of_vissl_classy_vit(classifier):
    trunk = make_model(CLASSIFIER=classifier).trunk
    assert sorted(trunk.state_dict()) == sorted(
        vissl_classy_vit_keys(LAYERS, class_token=classifier == "token"))
    assert vissl_key_prefix("classy_vit") == ""


def test_vissl_checkpoints_load(tmp_path):
    heads = [["eval_mlp", {"in_channels": D, "dims": [D, 5]}]]
    source = make_model(seed=3, heads=heads)
    state = source.get_classy_state()["model"]
    written = vissl_checkpoint(state, vissl_key_prefix("classy_vit"))
    vissl_model = written["classy_state_dict"]["base_model"]["model"]
    assert sorted(vissl_model["trunk"]) == sorted(vissl_classy_vit_keys(LAYERS))
    vissl_model["trunk"] = {f"base_model.{k}": v for k, v in vissl_model["trunk"].items()}
    target = make_model(seed=4, heads=heads)
    load_vissl_model_weights(target, written)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(target.trunk(x), source.trunk(x), rtol=0, atol=0)
    # a plain state dict read as VISSL's classy_vit configs do: APPEND_PREFIX trunk.base_model.
    torch.save(state["trunk"], tmp_path / "vit.pth")
    fresh = make_model(seed=5)
    report = load_weights_init(fresh, {"PARAMS_FILE": str(tmp_path / "vit.pth"),
                                       "STATE_DICT_KEY_NAME": "",
                                       "APPEND_PREFIX": "trunk.base_model."})
    assert len(report.loaded) == len(state["trunk"]) and not report.missing
    with torch.no_grad():
        torch.testing.assert_close(fresh.trunk(x), source.trunk(x), rtol=0, atol=0)


def test_classy_vit_name_passes_the_checks():
    cfg = copy.deepcopy(DEFAULTS)
    cfg.DATA.TRAIN.DATA_SOURCES = cfg.DATA.TEST.DATA_SOURCES = ["synthetic"]
    assert "classy_vit" not in UNSUPPORTED_NAMES.get("config.MODEL.TRUNK.NAME", {})
    cfg.MODEL.TRUNK.NAME = "classy_vit"
    check_registered_names("train", cfg)


@pytest.mark.parametrize("overrides, message", [
    (dict(CLASSIFIER="pool"), "VISION_TRANSFORMERS.CLASSIFIER='pool' must be token or gap"),
    (dict(PATCH_SIZE=5), "VISION_TRANSFORMERS.PATCH_SIZE=5 must divide IMAGE_SIZE=16"),
    (dict(NUM_HEADS=3), "VISION_TRANSFORMERS.NUM_HEADS=3 must divide HIDDEN_DIM=16"),
    (dict(name="vit_b_16"), "VISION_TRANSFORMERS.name='vit_b_16' is not read"),
])
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=f"config.MODEL.TRUNK.{message}"):
        build_model(vit_cfg(**overrides))
    cfg = vit_cfg()
    cfg.INPUT_TYPE = "lab"
    with pytest.raises(ValueError, match="config.MODEL.INPUT_TYPE='lab'"):
        build_model(cfg)
