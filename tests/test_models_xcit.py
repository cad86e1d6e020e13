"""The xcit trunk: named outputs, VISSL's parameter names (xcit and xcit_fsdp), the outputs
against a forward written out here from the formulas, VISSL checkpoint layouts."""
import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from engine_utils import assert_checkpointing_keeps_gradients
from ssl_engine.checkpoint import load_weights_init
from ssl_engine.checkpoint.formats import (load_vissl_model_weights, vissl_checkpoint,
                                           vissl_key_prefix)
from ssl_engine.config import ConfigError
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.unsupported import UNSUPPORTED_NAMES
from ssl_engine.config.validate import validate_config
from ssl_engine.engines.registered_names import check_registered_names
from ssl_engine.models import build_model

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    SCHEMA = yaml.safe_load(f)
DEFAULTS = AttrDict(copy.deepcopy(SCHEMA)["config"])

D, HEADS, LAYERS, SIZE, PATCH = 32, 2, 2, 32, 8
GRID = SIZE // PATCH
TINY = dict(IMAGE_SIZE=SIZE, PATCH_SIZE=PATCH, HIDDEN_DIM=D, NUM_LAYERS=LAYERS, NUM_HEADS=HEADS,
            MLP_RATIO=2.0, DROP_PATH_RATE=0.0, ETA=0.5)


def xcit_cfg(name="xcit", heads=(), **overrides):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.NAME = name
    cfg.TRUNK.XCIT.update(TINY, **overrides)
    cfg.HEAD.PARAMS = [list(head) for head in heads]
    return cfg


def make_model(seed=0, name="xcit", heads=(), **overrides):
    """A tiny XCiT whose every parameter and batch-norm statistic is random."""
    torch.manual_seed(seed)
    model = build_model(xcit_cfg(name, heads, **overrides))
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if key.endswith("num_batches_tracked"):
                continue
            if "gamma" in key or "temperature" in key or key.endswith("running_var") or (
                    ("norm" in key or ".bn." in key or key.endswith(".1.weight"))
                    and key.endswith("weight") and tensor.dim() == 1):
                tensor.uniform_(0.5, 1.5)
            else:
                tensor.normal_(0, 0.2)
    return model.eval()


def images(n=2, seed=1, size=(SIZE, SIZE)):
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(seed))


def vissl_xcit_keys(layers, class_blocks, patch=PATCH):
    """The state-dict keys of VISSL's XCiT module, from its layout."""
    bn = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    keys = ["cls_token", "pos_embeder.token_projection.weight",
            "pos_embeder.token_projection.bias"]
    for i in range({16: 4, 8: 3}[patch]):  # conv3x3 (Sequential(conv, bn)) at 0, 2, 4 (, 6)
        keys += [f"patch_embed.proj.{2 * i}.0.weight"]
        keys += [f"patch_embed.proj.{2 * i}.1.{p}" for p in bn]
    linear = ("weight", "bias")
    for i in range(layers):
        b = f"blocks.{i}."
        keys += [b + g for g in ("gamma1", "gamma2", "gamma3", "attn.temperature")]
        keys += [b + f"{m}.{p}" for m in ("norm1", "norm2", "norm3", "attn.qkv", "attn.proj",
                                          "mlp.fc1", "mlp.fc2", "local_mp.conv1",
                                          "local_mp.conv2") for p in linear]
        keys += [b + f"local_mp.bn.{p}" for p in bn]
    for i in range(class_blocks):
        b = f"cls_attn_blocks.{i}."
        keys += [b + "gamma1", b + "gamma2"]
        keys += [b + f"{m}.{p}" for m in ("norm1", "norm2", "attn.qkv", "attn.proj", "mlp.fc1",
                                          "mlp.fc2") for p in linear]
    return keys + ["norm.weight", "norm.bias"]


# ------------------------------------------------------------------ a forward written out
def fourier_encoding(state, height, width):
    """[h*w, D]: each patch's 64 sines and cosines, one by one, through the 1x1 projection."""
    rows = []
    for r in range(1, height + 1):
        for c in range(1, width + 1):
            y, x = 2 * math.pi * r / (height + 1e-6), 2 * math.pi * c / (width + 1e-6)
            values = []
            for coordinate in (y, x):
                for i in range(32):
                    angle = coordinate / 10000 ** (2 * (i // 2) / 32)
                    values.append(math.sin(angle) if i % 2 == 0 else math.cos(angle))
            rows.append(values)
    features = torch.tensor(rows)
    weight = state["pos_embeder.token_projection.weight"].flatten(1)
    return features @ weight.T + state["pos_embeder.token_projection.bias"]


def batch_norm(x, state, prefix):
    return F.batch_norm(x, state[prefix + "running_mean"], state[prefix + "running_var"],
                        state[prefix + "weight"], state[prefix + "bias"], eps=1e-5)


def layer_norm(x, state, prefix):
    return F.layer_norm(x, (D,), state[prefix + "weight"], state[prefix + "bias"], eps=1e-6)


def linear(x, state, prefix):
    return x @ state[prefix + "weight"].T + state[prefix + "bias"]


def mlp(x, state, prefix):
    return linear(F.gelu(linear(x, state, prefix + "fc1.")), state, prefix + "fc2.")


def cross_covariance_attention(x, state, prefix):
    """Per head: softmax over the d x d Gram matrix of the token-wise l2-normalised query and
    key channels, times the head's temperature; it mixes the value channels."""
    n, tokens, _ = x.shape
    q, k, v = linear(x, state, prefix + "qkv.").chunk(3, dim=-1)
    width = D // HEADS
    out = torch.empty(n, tokens, D)
    for h in range(HEADS):
        channels = slice(h * width, (h + 1) * width)
        qh, kh, vh = (t[:, :, channels].transpose(1, 2) for t in (q, k, v))  # [n, d, tokens]
        qh = qh / qh.norm(dim=-1, keepdim=True)
        kh = kh / kh.norm(dim=-1, keepdim=True)
        gram = torch.einsum("nit,njt->nij", qh, kh) * state[prefix + "temperature"][h]
        out[:, :, channels] = torch.einsum("nij,njt->nti", gram.softmax(dim=-1), vh)
    return linear(out, state, prefix + "proj.")


def class_attention(x, state, prefix):
    """The class token's dot-product attention to every token, per head."""
    q, k, v = linear(x, state, prefix + "qkv.").chunk(3, dim=-1)
    width = D // HEADS
    out = []
    for h in range(HEADS):
        channels = slice(h * width, (h + 1) * width)
        scores = torch.einsum("nc,ntc->nt", q[:, 0, channels], k[:, :, channels]) / math.sqrt(width)
        out.append(torch.einsum("nt,ntc->nc", scores.softmax(-1), v[:, :, channels]))
    return linear(torch.cat(out, dim=1), state, prefix + "proj.")[:, None]


def reference(state, x, tokens_norm, class_blocks=2):
    """(class token, patch grid) after the final norm, from the state dict alone."""
    for i in range(3):  # patch embedding: conv, bn, GELU between
        if i:
            x = F.gelu(x)
        x = F.conv2d(x, state[f"patch_embed.proj.{2 * i}.0.weight"], stride=2, padding=1)
        x = batch_norm(x, state, f"patch_embed.proj.{2 * i}.1.")
    n, _, height, width = x.shape
    tokens = x.flatten(2).transpose(1, 2) + fourier_encoding(state, height, width)
    for i in range(LAYERS):
        p = f"blocks.{i}."
        tokens = tokens + state[p + "gamma1"] * cross_covariance_attention(
            layer_norm(tokens, state, p + "norm1."), state, p + "attn.")
        grid = layer_norm(tokens, state, p + "norm3.").transpose(1, 2).reshape(n, D, height, width)
        grid = F.conv2d(grid, state[p + "local_mp.conv1.weight"], state[p + "local_mp.conv1.bias"],
                        padding=1, groups=D)
        grid = batch_norm(F.gelu(grid), state, p + "local_mp.bn.")
        grid = F.conv2d(grid, state[p + "local_mp.conv2.weight"], state[p + "local_mp.conv2.bias"],
                        padding=1, groups=D)
        tokens = tokens + state[p + "gamma3"] * grid.flatten(2).transpose(1, 2)
        tokens = tokens + state[p + "gamma2"] * mlp(layer_norm(tokens, state, p + "norm2."),
                                                    state, p + "mlp.")
    tokens = torch.cat([state["cls_token"].expand(n, 1, D), tokens], dim=1)
    for i in range(class_blocks):
        p = f"cls_attn_blocks.{i}."
        normed = layer_norm(tokens, state, p + "norm1.")
        cls = tokens[:, :1] + state[p + "gamma1"] * class_attention(normed, state, p + "attn.")
        patches = tokens[:, 1:] + state[p + "gamma1"] * normed[:, 1:]
        if tokens_norm:
            patches = layer_norm(patches, state, p + "norm2.")
        cls = layer_norm(cls, state, p + "norm2.")
        cls = cls + state[p + "gamma2"] * mlp(cls, state, p + "mlp.")
        tokens = torch.cat([cls, 2 * patches], dim=1)  # the MLP branch adds the patches again
    tokens = layer_norm(tokens, state, "norm.")
    return tokens[:, 0], tokens[:, 1:].reshape(n, height, width, D)


# ------------------------------------------------------------------ tests
def test_named_outputs_have_their_shapes():
    trunk = make_model().trunk
    assert trunk.stage_dims == {"lastCLS": D, "lastMAP": D} and trunk.output_dim == D
    with torch.no_grad():
        cls, grid = trunk(images(), ["lastCLS", "lastMAP"])
        (default,) = trunk(images())
        # another input size: the position encodings follow its patch grid
        (wide,) = trunk(images(size=(16, 48)), ["lastMAP"])
    assert cls.shape == (2, D) and grid.shape == (2, GRID, GRID, D)
    assert wide.shape == (2, 2, 6, D)
    torch.testing.assert_close(default, cls, rtol=0, atol=0)
    with pytest.raises(ValueError, match="lastPOOL"):
        trunk(images(), ["lastPOOL"])


@pytest.mark.parametrize("name, layers, patch", [("xcit", 3, 8), ("xcit_fsdp", 3, 16)])
def test_parameter_names_are_those_of_vissl_xcit(name, layers, patch):
    torch.manual_seed(0)
    trunk = build_model(xcit_cfg(name, NUM_LAYERS=layers, PATCH_SIZE=patch)).trunk
    # VISSL's xcit_fsdp builds NUM_LAYERS class-attention blocks, its xcit 2
    class_blocks = layers if name == "xcit_fsdp" else 2
    assert sorted(trunk.state_dict()) == sorted(vissl_xcit_keys(layers, class_blocks, patch))
    assert torch.equal(trunk.blocks[0].gamma3, torch.full((D,), 0.5))
    assert vissl_key_prefix(name) == ""


@pytest.mark.parametrize("tokens_norm", [True, False])
def test_outputs_equal_a_forward_written_out(tokens_norm):
    model = make_model(TOKENS_NORM=tokens_norm)
    x = images()
    with torch.no_grad():
        cls, grid = model.trunk(x, ["lastCLS", "lastMAP"])
        expected_cls, expected_grid = reference(model.trunk.state_dict(), x, tokens_norm)
    torch.testing.assert_close(cls, expected_cls, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grid, expected_grid, rtol=1e-4, atol=1e-4)


def test_vissl_checkpoints_load(tmp_path):
    heads = [["eval_mlp", {"in_channels": D, "dims": [D, 5]}]]
    source = make_model(seed=3, heads=heads)
    state = source.get_classy_state()["model"]
    written = vissl_checkpoint(state, vissl_key_prefix("xcit"))
    vissl_model = written["classy_state_dict"]["base_model"]["model"]
    assert sorted(vissl_model["trunk"]) == sorted(vissl_xcit_keys(LAYERS, 2))
    # VISSL's linear evaluation wraps the trunk in base_model.
    vissl_model["trunk"] = {f"base_model.{k}": v for k, v in vissl_model["trunk"].items()}
    target = make_model(seed=4, heads=heads)
    load_vissl_model_weights(target, written)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(target.trunk(x, ["lastMAP"]), source.trunk(x, ["lastMAP"]),
                                   rtol=0, atol=0)
    # a DINO teacher's state dict, read with WEIGHTS_INIT's key name and prefix removal
    torch.save({"teacher": {f"module.backbone.{k}": v for k, v in state["trunk"].items()}},
               tmp_path / "dino.pth")
    fresh = make_model(seed=5)
    report = load_weights_init(fresh, {"PARAMS_FILE": str(tmp_path / "dino.pth"),
                                       "STATE_DICT_KEY_NAME": "teacher",
                                       "REMOVE_PREFIX": "module.backbone.",
                                       "APPEND_PREFIX": "trunk."})
    assert len(report.loaded) == len(state["trunk"]) and not report.missing
    with torch.no_grad():
        torch.testing.assert_close(fresh.trunk(x), source.trunk(x), rtol=0, atol=0)


def test_xcit_names_pass_the_checks_and_eta_reads_as_a_number():
    cfg = copy.deepcopy(DEFAULTS)
    cfg.DATA.TRAIN.DATA_SOURCES = cfg.DATA.TEST.DATA_SOURCES = ["synthetic"]
    for name in ("xcit", "xcit_fsdp"):
        assert name not in UNSUPPORTED_NAMES.get("config.MODEL.TRUNK.NAME", {})
        cfg.MODEL.TRUNK.NAME = name
        check_registered_names("train", cfg)
    # VISSL's configs write ETA: 1e-5, a string to YAML 1.1
    raw = copy.deepcopy(SCHEMA)
    raw["config"]["MODEL"]["TRUNK"]["XCIT"].update(ETA="1e-5", QK_SCALE=False)
    validate_config(raw, SCHEMA)
    raw["config"]["MODEL"]["TRUNK"]["XCIT"]["ETA"] = "small"
    with pytest.raises(ConfigError, match="XCIT.ETA"):
        validate_config(raw, SCHEMA)
    torch.manual_seed(0)
    trunk = build_model(xcit_cfg(ETA="1e-5")).trunk
    assert torch.equal(trunk.cls_attn_blocks[1].gamma2, torch.full((D,), 1e-5))


@pytest.mark.parametrize("overrides, message", [
    (dict(PATCH_SIZE=4), "PATCH_SIZE=4 must be 16 or 8"),
    (dict(NUM_HEADS=3), "NUM_HEADS=3 must divide HIDDEN_DIM=32"),
    (dict(HIDDEN_DIM=36, NUM_HEADS=3, PATCH_SIZE=16), "HIDDEN_DIM=36 must be a multiple of 8"),
    (dict(ETA=None), "ETA=None must be a number"),
    (dict(DROP_PATH_RATE=1.0), "DROP_PATH_RATE=1.0 must be in"),
])
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=f"config.MODEL.TRUNK.XCIT.{message}"):
        build_model(xcit_cfg(**overrides))


def test_checkpointed_blocks_recompute_on_their_own_grid_after_a_second_resolution():
    """Multi-crop: the trunk runs on 32-pixel then 16-pixel images before one backward; the
    checkpointed blocks of the first call are recomputed on their own 4x4 grid (not the
    second call's 2x2), giving the gradients of the run without checkpointing."""
    assert_checkpointing_keeps_gradients(
        lambda checkpointed: make_model(CHECKPOINT_XCA_BLOCK=checkpointed,
                                        CHECKPOINT_ATTN_BLOCK=checkpointed),
        [images(2, seed=3), images(2, seed=4, size=(16, 16))])
