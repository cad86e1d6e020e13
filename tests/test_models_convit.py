"""The convit trunk: named outputs, VISSL's parameter names, gated positional attention against
its formula in a forward written out here, the local initialisation, a VISSL checkpoint."""
import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from engine_utils import assert_checkpointing_keeps_gradients
from ssl_engine.checkpoint.formats import (load_vissl_model_weights, vissl_checkpoint,
                                           vissl_key_prefix)
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.unsupported import UNSUPPORTED_NAMES
from ssl_engine.engines.registered_names import check_registered_names
from ssl_engine.models import build_model

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULTS = AttrDict(yaml.safe_load(f)["config"])

D, HEADS, LAYERS, GPSA_LAYERS, SIZE, PATCH, LOCALITY = 32, 4, 2, 1, 32, 8, 3
GRID = SIZE // PATCH
VIT = dict(IMAGE_SIZE=SIZE, PATCH_SIZE=PATCH, NUM_LAYERS=LAYERS, NUM_HEADS=HEADS, HIDDEN_DIM=D,
           MLP_DIM=2 * D, QKV_BIAS=True)


def convit_cfg(heads=(), convit=None, **vit):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.NAME = "convit"
    cfg.TRUNK.VISION_TRANSFORMERS.update(VIT, **vit)
    cfg.TRUNK.CONVIT.update(dict(N_GPSA_LAYERS=GPSA_LAYERS, LOCALITY_DIM=LOCALITY),
                            **(convit or {}))
    cfg.HEAD.PARAMS = [list(head) for head in heads]
    return cfg


def make_model(seed=0, heads=(), convit=None, **vit):
    """A tiny ConViT whose every parameter is random."""
    torch.manual_seed(seed)
    model = build_model(convit_cfg(heads, convit, **vit))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                parameter.uniform_(0.8, 1.2)
            else:
                parameter.normal_(0, 0.3)
    return model.eval()


def images(n=2, seed=1, size=SIZE):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def vissl_convit_keys(qkv_bias=True):
    keys = ["class_token", "pos_embedding", "patch_embed.proj.weight", "patch_embed.proj.bias"]
    for i in range(LAYERS):
        b = f"blocks.{i}."
        if i < GPSA_LAYERS:
            keys += [b + "attn.alpha", b + "attn.qk.weight", b + "attn.v.weight",
                     b + "attn.pos_proj.weight", b + "attn.pos_proj.bias"]
            keys += [b + "attn.qk.bias", b + "attn.v.bias"] if qkv_bias else []
        else:
            keys += [b + "attn.qkv.weight"] + ([b + "attn.qkv.bias"] if qkv_bias else [])
        keys += [b + f"{m}.{p}" for m in ("norm1", "norm2", "attn.proj", "mlp.linear_1",
                                          "mlp.linear_2") for p in ("weight", "bias")]
    return keys + ["norm.weight", "norm.bias"]


# ------------------------------------------------------------------ a forward written out
def linear(x, state, prefix):
    return x @ state[prefix + "weight"].T + state[prefix + "bias"]


def positional_attention(state, prefix, grid):
    """[heads, T, T]: softmax over j of pos_proj([dx]*L + [dy]*L + [dx^2+dy^2]*L) / L."""
    patches = [(r, c) for r in range(grid) for c in range(grid)]
    features = torch.tensor([[[float(cj - ci)] * LOCALITY + [float(rj - ri)] * LOCALITY
                              + [float((cj - ci) ** 2 + (rj - ri) ** 2)] * LOCALITY
                              for (rj, cj) in patches] for (ri, ci) in patches])
    scores = linear(features, state, prefix + "pos_proj.") / LOCALITY  # [T, T, heads]
    return scores.permute(2, 0, 1).softmax(dim=-1)


def reference(state, x, grid=GRID):
    n, width = len(x), D // HEADS
    tokens = F.conv2d(x, state["patch_embed.proj.weight"], state["patch_embed.proj.bias"],
                      stride=PATCH).flatten(2).transpose(1, 2) + state["pos_embedding"]
    for i in range(LAYERS):
        p = f"blocks.{i}."
        if i == GPSA_LAYERS:
            tokens = torch.cat([state["class_token"].expand(n, 1, D), tokens], dim=1)
        h = F.layer_norm(tokens, (D,), state[p + "norm1.weight"], state[p + "norm1.bias"])
        heads = []
        for head in range(HEADS):
            channels = slice(head * width, (head + 1) * width)
            if i < GPSA_LAYERS:
                q = linear(h, state, p + "attn.qk.")[..., :D][..., channels]
                k = linear(h, state, p + "attn.qk.")[..., D:][..., channels]
                v = linear(h, state, p + "attn.v.")[..., channels]
                content = (q @ k.transpose(1, 2) / math.sqrt(width)).softmax(-1)
                gate = torch.sigmoid(state[p + "attn.alpha"].flatten()[head])
                weights = ((1 - gate) * content
                           + gate * positional_attention(state, p + "attn.", grid)[head])
            else:
                q, k, v = (t[..., channels] for t in linear(h, state, p + "attn.qkv.").chunk(3, -1))
                weights = (q @ k.transpose(1, 2) / math.sqrt(width)).softmax(-1)
            heads.append(weights @ v)
        tokens = tokens + linear(torch.cat(heads, dim=-1), state, p + "attn.proj.")
        h = F.layer_norm(tokens, (D,), state[p + "norm2.weight"], state[p + "norm2.bias"])
        tokens = tokens + linear(F.gelu(linear(h, state, p + "mlp.linear_1.")), state,
                                 p + "mlp.linear_2.")
    return F.layer_norm(tokens, (D,), state["norm.weight"], state["norm.bias"])


# ------------------------------------------------------------------ tests
def test_outputs_shapes_names_and_a_forward_written_out():
    model = make_model()
    trunk = model.trunk
    assert sorted(trunk.state_dict()) == sorted(vissl_convit_keys())
    assert trunk.stage_dims == {"lastCLS": D, "lastPOOL": D} and trunk.default_out_feat_key == \
        "lastCLS"
    x = images()
    with torch.no_grad():
        cls, pool = trunk(x, ["lastCLS", "lastPOOL"])
        (default,) = trunk(x)
        (small,) = trunk(images(size=16))  # position embeddings resized to a 2x2 grid
        expected = reference(trunk.state_dict(), x)
    assert cls.shape == pool.shape == small.shape == (2, D)
    torch.testing.assert_close(cls, expected[:, 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(pool, expected.mean(dim=1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(default, cls, rtol=0, atol=0)
    with pytest.raises(ValueError, match="concatCLS4"):
        trunk(x, ["concatCLS4"])
    # CLASSIFIER gap: VISSL's mean of every normed token is the default output
    assert make_model(CLASSIFIER="gap").trunk.default_out_feat_key == "lastPOOL"
    assert sorted(make_model(QKV_BIAS=False).trunk.state_dict()) == sorted(
        vissl_convit_keys(qkv_bias=False))


def test_local_initialisation_makes_each_head_look_at_one_offset():
    torch.manual_seed(0)
    trunk = build_model(convit_cfg(convit=dict(LOCALITY_STRENGTH=4.0), HIDDEN_DIM=36,
                                   NUM_HEADS=9)).trunk
    attention = trunk.blocks[0].attn
    assert torch.equal(attention.v.weight, torch.eye(36))
    # 9 heads: a 3x3 kernel; head h1 + 3*h2 attends from a patch to the one at column offset
    # h2 - 1 and row offset h1 - 1 (the positional part starts as a 3x3 convolution)
    weights = positional_attention(trunk.state_dict(), "blocks.0.attn.", GRID)
    centre = 1 * GRID + 1  # patch (row 1, column 1)
    for h1 in range(3):
        for h2 in range(3):
            head = weights[h1 + 3 * h2, centre]
            assert divmod(head.argmax().item(), GRID) == (1 + h1 - 1, 1 + h2 - 1)
            assert head.max() > 0.9
    # without it the positional projection is a plain truncated-normal layer
    torch.manual_seed(0)
    plain = build_model(convit_cfg(convit=dict(USE_LOCAL_INIT=False))).trunk
    assert plain.blocks[0].attn.pos_proj.weight.abs().max() < 0.1


def test_vissl_checkpoint_loads_and_names_pass_the_checks():
    heads = [["mlp", {"dims": [D, 5]}]]
    source = make_model(seed=3, heads=heads)
    written = vissl_checkpoint(source.get_classy_state()["model"], vissl_key_prefix("convit"))
    vissl_model = written["classy_state_dict"]["base_model"]["model"]
    assert sorted(vissl_model["trunk"]) == sorted(vissl_convit_keys())
    target = make_model(seed=4, heads=heads)
    load_vissl_model_weights(target, written)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(target(x), source(x), rtol=0, atol=0)
    cfg = copy.deepcopy(DEFAULTS)
    cfg.DATA.TRAIN.DATA_SOURCES = cfg.DATA.TEST.DATA_SOURCES = ["synthetic"]
    assert "convit" not in UNSUPPORTED_NAMES.get("config.MODEL.TRUNK.NAME", {})
    cfg.MODEL.TRUNK.NAME = "convit"
    check_registered_names("train", cfg)


@pytest.mark.parametrize("convit, vit, message", [
    (dict(CLASS_TOKEN_IN_LOCAL_LAYERS=True), {}, "CONVIT.CLASS_TOKEN_IN_LOCAL_LAYERS=true is not"),
    (dict(N_GPSA_LAYERS=2), {}, "CONVIT.N_GPSA_LAYERS=2 must be in"),
    ({}, dict(IMAGE_SIZE=36), "VISION_TRANSFORMERS.IMAGE_SIZE=36 must be a multiple of"),
    ({}, dict(CLASSIFIER="pool"), "VISION_TRANSFORMERS.CLASSIFIER='pool' must be token or gap"),
])
def test_bad_settings_are_refused_naming_the_key(convit, vit, message):
    with pytest.raises(ValueError, match=f"config.MODEL.TRUNK.{message}"):
        build_model(convit_cfg(convit=convit, **vit))


def test_checkpointed_gpsa_blocks_recompute_on_their_own_grid_after_a_second_resolution():
    """Multi-crop under activation checkpointing: 32-pixel then 16-pixel images before one
    backward give the gradients of the run without checkpointing."""
    def make_model(checkpointed):
        cfg = convit_cfg()
        cfg.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING = checkpointed
        cfg.ACTIVATION_CHECKPOINTING.NUM_ACTIVATION_CHECKPOINTING_SPLITS = 1
        torch.manual_seed(0)
        return build_model(cfg).eval()

    assert_checkpointing_keeps_gradients(make_model, [images(2, seed=3),
                                                      images(2, seed=4, size=16)])
