"""The beit trunk: named outputs, the relative position index against its formula, VISSL's
parameter names, the outputs against a forward written out here, VISSL checkpoint layouts."""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from ssl_engine.checkpoint import load_weights_init
from ssl_engine.checkpoint.formats import (is_vissl_checkpoint, load_vissl_model_weights,
                                           model_state_from_vissl, vissl_checkpoint,
                                           vissl_key_prefix)
from ssl_engine.config import ConfigError
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.unsupported import UNSUPPORTED_NAMES
from ssl_engine.config.validate import validate_config
from ssl_engine.engines.registered_names import check_registered_names
from ssl_engine.models import build_model
from ssl_engine.models.trunks.beit import _relative_position_bias, relative_position_index

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    SCHEMA = yaml.safe_load(f)
DEFAULTS = AttrDict(copy.deepcopy(SCHEMA)["config"])
DEFAULT_MODEL_CFG = DEFAULTS.MODEL

D, HEADS, LAYERS, SIZE, PATCH = 32, 2, 2, 32, 8
GRID = SIZE // PATCH
TINY = dict(IMAGE_SIZE=SIZE, PATCH_SIZE=PATCH, NUM_LAYERS=LAYERS, NUM_HEADS=HEADS, HIDDEN_DIM=D,
            MLP_RATIO=2.0, QKV_BIAS=True, USE_REL_POS_BIAS=True, USE_SHARED_REL_POS_BIAS=True,
            USE_MEAN_POOLING=False, INIT_VALUES=0.1)


def beit_cfg(heads=(), **overrides):
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = "beit"
    cfg.TRUNK.BEIT.update(TINY, **overrides)
    cfg.HEAD.PARAMS = [list(head) for head in heads]
    return cfg


def make_model(seed=0, heads=(), **overrides):
    """A tiny BEiT whose every parameter is random (zero-initialised biases, tables and the
    class token would hide a mistake)."""
    torch.manual_seed(seed)
    model = build_model(beit_cfg(heads, **overrides))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "gamma" in name:
                parameter.uniform_(0.5, 1.5)
            elif "norm" in name and name.endswith("weight"):
                parameter.uniform_(0.8, 1.2)
            else:
                parameter.normal_(0, 0.2)
    return model.eval()


def images(n=2, seed=1):
    return torch.randn(n, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed))


def vissl_beit_keys(layers, qkv_bias, rel_pos_bias, shared, layer_scale, final_norm, abs_pos):
    """The state-dict keys of VISSL's BEiT module for these switches, from its layout: a class
    token, absolute position embeddings, the patch projection, an optional shared bias, the
    blocks (own parameters, then buffers, then sub-modules), the final norm."""
    keys = ["cls_token"] + (["pos_embed"] if abs_pos else [])
    keys += ["patch_embed.proj.weight", "patch_embed.proj.bias"]
    if shared:
        keys += ["rel_pos_bias.relative_position_bias_table",
                 "rel_pos_bias.relative_position_index"]
    for i in range(layers):
        block = f"blocks.{i}."
        keys += [block + "gamma_1", block + "gamma_2"] if layer_scale else []
        keys += [block + "norm1.weight", block + "norm1.bias"]
        keys += [block + "attn.q_bias", block + "attn.v_bias"] if qkv_bias else []
        keys += ([block + "attn.relative_position_bias_table",
                  block + "attn.relative_position_index"] if rel_pos_bias else [])
        keys += [block + k for k in ("attn.qkv.weight", "attn.proj.weight", "attn.proj.bias",
                                     "norm2.weight", "norm2.bias", "mlp.fc1.weight",
                                     "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias")]
    return keys + (["norm.weight", "norm.bias"] if final_norm else [])


# ------------------------------------------------------------------ a forward written out
def index_from_formula(height, width):
    """Relative position index by a loop over token pairs (class token first)."""
    offsets = (2 * height - 1) * (2 * width - 1)
    tokens = height * width + 1
    index = torch.zeros(tokens, tokens, dtype=torch.long)
    for i in range(tokens):
        for j in range(tokens):
            if i == 0 and j == 0:
                index[i, j] = offsets + 2
            elif i == 0:
                index[i, j] = offsets
            elif j == 0:
                index[i, j] = offsets + 1
            else:
                (ri, ci), (rj, cj) = divmod(i - 1, width), divmod(j - 1, width)
                index[i, j] = (ri - rj + height - 1) * (2 * width - 1) + (ci - cj + width - 1)
    return index


def bias_from_table(table, height, width):
    """[heads, T, T] looked up entry by entry with the formula's index."""
    index = index_from_formula(height, width)
    return torch.stack([table[index, h] for h in range(table.shape[1])])


def reference_blocks(state, x, mean_pooling):
    """Every block's tokens, and the final norm, computed from the state dict alone."""
    grid_h = grid_w = GRID
    tokens = F.conv2d(x, state["patch_embed.proj.weight"], state["patch_embed.proj.bias"],
                      stride=PATCH).flatten(2).transpose(1, 2)
    tokens = torch.cat([state["cls_token"].expand(len(x), 1, D), tokens], 1) + state["pos_embed"]
    shared = bias_from_table(state["rel_pos_bias.relative_position_bias_table"], grid_h, grid_w)
    outputs = []
    for i in range(LAYERS):
        p = {k[len(f"blocks.{i}."):]: v for k, v in state.items() if k.startswith(f"blocks.{i}.")}
        h = F.layer_norm(tokens, (D,), p["norm1.weight"], p["norm1.bias"], eps=1e-6)
        qkv_bias = torch.cat([p["attn.q_bias"], torch.zeros(D), p["attn.v_bias"]])
        q, k, v = (h @ p["attn.qkv.weight"].T + qkv_bias).chunk(3, dim=-1)
        split = lambda t: t.reshape(len(x), -1, HEADS, D // HEADS).transpose(1, 2)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        scores = (q * (D // HEADS) ** -0.5) @ k.transpose(-2, -1)
        scores = scores + shared + bias_from_table(
            p["attn.relative_position_bias_table"], grid_h, grid_w)
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(len(x), -1, D)
        tokens = tokens + p["gamma_1"] * (attended @ p["attn.proj.weight"].T
                                          + p["attn.proj.bias"])
        h = F.layer_norm(tokens, (D,), p["norm2.weight"], p["norm2.bias"], eps=1e-6)
        h = F.gelu(h @ p["mlp.fc1.weight"].T + p["mlp.fc1.bias"])
        tokens = tokens + p["gamma_2"] * (h @ p["mlp.fc2.weight"].T + p["mlp.fc2.bias"])
        outputs.append(tokens)
    if mean_pooling:
        return outputs, lambda t: t
    return outputs, lambda t: F.layer_norm(t, (D,), state["norm.weight"], state["norm.bias"],
                                           eps=1e-6)


# ------------------------------------------------------------------ tests
def test_every_named_output_has_its_shape():
    trunk = make_model().trunk
    expected = {"blkCLS0": D, "blkCLS1": D, "lastCLS": D, "lastPOOL": D,
                "concatCLS1": D, "concatCLS2": 2 * D}
    assert trunk.stage_dims == expected and trunk.default_out_feat_key == "lastCLS"
    with torch.no_grad():
        outputs = trunk(images(), list(expected))
        (default,) = trunk(images())
    assert [tuple(o.shape) for o in outputs] == [(2, dim) for dim in expected.values()]
    torch.testing.assert_close(default, outputs[2], rtol=0, atol=0)
    with pytest.raises(ValueError, match="concatCLS3"):
        trunk(images(), ["concatCLS3"])
    with pytest.raises(ValueError, match=r"takes 32x32 images .*IMAGE_SIZE"):
        trunk(torch.zeros(1, 3, 16, 16))


@pytest.mark.parametrize("height, width", [(4, 4), (2, 3)])
def test_relative_position_index_follows_the_formula(height, width):
    index = relative_position_index((height, width))
    torch.testing.assert_close(index, index_from_formula(height, width), rtol=0, atol=0)
    # every row of the table is read: (2H-1)(2W-1) offsets and the 3 class-token entries
    assert sorted(index.unique().tolist()) == list(range((2 * height - 1) * (2 * width - 1) + 3))


def test_attention_bias_is_the_table_looked_up_by_offset():
    trunk = make_model().trunk
    for module in (trunk.rel_pos_bias, trunk.blocks[1].attn):
        table = module.relative_position_bias_table
        torch.testing.assert_close(_relative_position_bias(module),
                                   bias_from_table(table, GRID, GRID), rtol=0, atol=0)


@pytest.mark.parametrize("overrides", [
    {},
    dict(QKV_BIAS=False, USE_REL_POS_BIAS=False, USE_SHARED_REL_POS_BIAS=False,
         USE_MEAN_POOLING=True, INIT_VALUES=False, USE_ABS_POS_EMB=False),
])
def test_parameter_names_are_those_of_vissl_beit(overrides):
    cfg = {**TINY, **overrides}
    torch.manual_seed(0)
    trunk = build_model(beit_cfg(**overrides)).trunk
    expected = vissl_beit_keys(
        LAYERS, cfg["QKV_BIAS"], cfg["USE_REL_POS_BIAS"], cfg["USE_SHARED_REL_POS_BIAS"],
        bool(cfg["INIT_VALUES"]), not cfg["USE_MEAN_POOLING"], cfg.get("USE_ABS_POS_EMB", True))
    assert sorted(trunk.state_dict()) == sorted(expected)
    if cfg["INIT_VALUES"]:
        assert torch.equal(trunk.blocks[0].gamma_1, torch.full((D,), 0.1))


@pytest.mark.parametrize("mean_pooling", [False, True])
def test_outputs_equal_a_forward_written_out(mean_pooling):
    model = make_model(USE_MEAN_POOLING=mean_pooling)
    x = images()
    with torch.no_grad():
        last_cls, last_pool, concat, first = model.trunk(
            x, ["lastCLS", "lastPOOL", "concatCLS2", "blkCLS0"])
        blocks, norm = reference_blocks(model.trunk.state_dict(), x, mean_pooling)
    tol = dict(rtol=1e-4, atol=1e-4)
    # the class token, through the final norm unless USE_MEAN_POOLING (as in VISSL)
    torch.testing.assert_close(last_cls, norm(blocks[-1])[:, 0], **tol)
    torch.testing.assert_close(last_pool, norm(blocks[-1])[:, 1:].mean(1), **tol)
    torch.testing.assert_close(concat, torch.cat([norm(b)[:, 0] for b in blocks], 1), **tol)
    torch.testing.assert_close(first, norm(blocks[0])[:, 0], **tol)
    assert not torch.allclose(last_cls, last_pool, atol=1e-2)
    if mean_pooling:  # no final norm at all
        torch.testing.assert_close(last_cls, blocks[-1][:, 0], **tol)


def test_vissl_checkpoints_of_a_linear_evaluation_and_of_pretraining_load(tmp_path):
    heads = [["eval_mlp", {"in_channels": 2 * D, "dims": [2 * D, 5]}]]
    source = make_model(seed=3, heads=heads)
    state = source.get_classy_state()["model"]
    prefix = vissl_key_prefix("beit")
    written = vissl_checkpoint(state, prefix)
    # VISSL's beit holds its keys at the trunk's top level: written as they are
    assert sorted(written["classy_state_dict"]["base_model"]["model"]["trunk"]) == \
        sorted(state["trunk"])
    assert "0.clf.clf.0.weight" in written["classy_state_dict"]["base_model"]["model"]["heads"]
    # VISSL's linear evaluation wraps the trunk in base_model.
    vissl_model = written["classy_state_dict"]["base_model"]["model"]
    vissl_model["trunk"] = {f"base_model.{k}": v for k, v in vissl_model["trunk"].items()}
    assert is_vissl_checkpoint(written)
    assert sorted(model_state_from_vissl(vissl_model, prefix)["trunk"]) == sorted(state["trunk"])
    target = make_model(seed=4, heads=heads, QKV_BIAS=True)
    load_vissl_model_weights(target, written)
    x = images()
    with torch.no_grad():
        for key in ("lastCLS", "concatCLS2"):
            torch.testing.assert_close(target.trunk(x, [key]), source.trunk(x, [key]),
                                       rtol=0, atol=0)
        torch.testing.assert_close(target.heads[0](torch.ones(1, 2 * D)),
                                   source.heads[0](torch.ones(1, 2 * D)), rtol=0, atol=0)
    # a plain BEiT state dict with VISSL's configs' APPEND_PREFIX: trunk.base_model.
    torch.save({"model": dict(state["trunk"])}, tmp_path / "beit.pth")
    fresh = make_model(seed=5)
    report = load_weights_init(fresh, {"PARAMS_FILE": str(tmp_path / "beit.pth"),
                                       "STATE_DICT_KEY_NAME": "model",
                                       "APPEND_PREFIX": "trunk.base_model."})
    assert len(report.loaded) == len(state["trunk"]) and not report.missing
    with torch.no_grad():
        torch.testing.assert_close(fresh.trunk(x), source.trunk(x), rtol=0, atol=0)


def test_beit_and_convnext_pass_the_name_checks():
    cfg = copy.deepcopy(DEFAULTS)
    cfg.DATA.TRAIN.DATA_SOURCES = cfg.DATA.TEST.DATA_SOURCES = ["synthetic"]
    for name in ("beit", "convnext"):
        assert name not in UNSUPPORTED_NAMES.get("config.MODEL.TRUNK.NAME", {})
        cfg.MODEL.TRUNK.NAME = name
        check_registered_names("train", cfg)


def test_init_values_and_qk_scale_take_false_or_a_number():
    """VISSL's configs set INIT_VALUES: 0.1 or 1e-5 (a string to YAML 1.1) over the default
    false."""
    for init_values, qk_scale in ((0.1, False), ("1e-5", 0.125), (False, 1)):
        cfg = copy.deepcopy(SCHEMA)
        cfg["config"]["MODEL"]["TRUNK"]["BEIT"].update(INIT_VALUES=init_values,
                                                       QK_SCALE=qk_scale)
        validate_config(cfg, SCHEMA)
    cfg["config"]["MODEL"]["TRUNK"]["BEIT"]["INIT_VALUES"] = "some"
    with pytest.raises(ConfigError, match="'config.MODEL.TRUNK.BEIT.INIT_VALUES' expects a bool"):
        validate_config(cfg, SCHEMA)
    torch.manual_seed(0)
    trunk = build_model(beit_cfg(INIT_VALUES="1e-5", QK_SCALE=0.125)).trunk
    assert torch.equal(trunk.blocks[1].gamma_2, torch.full((D,), 1e-5))
    assert trunk.blocks[0].attn.scale == 0.125


@pytest.mark.parametrize("overrides, message", [
    (dict(NUM_HEADS=3), "NUM_HEADS=3 must divide HIDDEN_DIM=32"),
    (dict(PATCH_SIZE=64), "IMAGE_SIZE=32 is smaller than PATCH_SIZE=64"),
    (dict(DROP_PATH_RATE=1.5), "DROP_PATH_RATE=1.5 must be in"),
    (dict(INIT_VALUES="big"), "INIT_VALUES='big' must be a number or false"),
])
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=f"config.MODEL.TRUNK.BEIT.{message}"):
        build_model(beit_cfg(**overrides))
