"""The swin_transformer trunk: its output, VISSL's parameter names, the offset index and the
shifted-window mask against computations written here, the outputs against a forward written
out window by window from the state dict, VISSL checkpoint layouts."""
import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from ssl_engine.checkpoint.formats import (load_vissl_model_weights, vissl_checkpoint,
                                           vissl_key_prefix)
from ssl_engine.config import ConfigError
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.unsupported import UNSUPPORTED_NAMES
from ssl_engine.config.validate import validate_config
from ssl_engine.engines.registered_names import check_registered_names
from ssl_engine.models import build_model
from ssl_engine.models.trunks.swin_transformer import (shifted_window_mask, to_windows,
                                                       window_relative_position_index)

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    SCHEMA = yaml.safe_load(f)
DEFAULTS = AttrDict(copy.deepcopy(SCHEMA)["config"])

# a 32-pixel image in 4-pixel patches: an 8 x 8 grid (windows of 4, the second block shifted
# by 2), then 4 x 4 (one window: nothing shifts)
D, SIZE, PATCH, WINDOW = 8, 32, 4, 4
TINY = dict(IMAGE_SIZE=SIZE, PATCH_SIZE=PATCH, EMBED_DIM=D, DEPTHS=[2, 2], NUM_HEADS=[2, 4],
            WINDOW_SIZE=WINDOW, MLP_RATIO=2.0, DROP_PATH_RATE=0.0)


def swin_cfg(heads=(), **overrides):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.NAME = "swin_transformer"
    cfg.TRUNK.SWIN_TRANSFORMER.update(TINY, **overrides)
    cfg.HEAD.PARAMS = [list(head) for head in heads]
    return cfg


def make_model(seed=0, heads=(), **overrides):
    """A tiny Swin whose every parameter is random (norm weights and variances near 1)."""
    torch.manual_seed(seed)
    model = build_model(swin_cfg(heads, **overrides))
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            if not tensor.is_floating_point():
                continue
            if ("norm" in key and key.endswith("weight")) or key.endswith("running_var"):
                tensor.uniform_(0.5, 1.5)
            else:
                tensor.normal_(0, 0.3)
    return model.eval()


def images(n=2, seed=1, size=(SIZE, SIZE)):
    return torch.randn(n, 3, *size, generator=torch.Generator().manual_seed(seed))


def vissl_swin_keys(depths):
    """The state-dict keys of VISSL's SwinTransformer, from its layout: layers[i] is a
    BasicLayer of blocks (each: norm1, a WindowAttention, norm2, an Mlp) and, but in the last
    layer, a PatchMerging downsample; the avgpool has no parameters."""
    wb = ("weight", "bias")
    keys = [f"patch_embed.{m}.{p}" for m in ("proj", "norm") for p in wb]
    for i, depth in enumerate(depths):
        for j in range(depth):
            b = f"layers.{i}.blocks.{j}."
            keys += [b + "attn.relative_position_bias_table", b + "attn.relative_position_index"]
            keys += [b + f"{m}.{p}" for m in ("norm1", "attn.qkv", "attn.proj", "norm2",
                                              "mlp.fc1", "mlp.fc2") for p in wb]
        if i < len(depths) - 1:
            keys += [f"layers.{i}.downsample.reduction.weight",
                     f"layers.{i}.downsample.norm.weight", f"layers.{i}.downsample.norm.bias"]
    return keys + ["norm.weight", "norm.bias"]


# ------------------------------------------------------------------ windows, one pair at a time
def offset_row(i, j, window):
    """The bias-table row of tokens i and j (row-major) of a window: their offset."""
    dr, dc = i // window - j // window, i % window - j % window
    return (dr + window - 1) * (2 * window - 1) + (dc + window - 1)


def test_relative_position_index_is_the_offset_of_each_pair():
    for window in (1, 2, 3, 7):
        index = window_relative_position_index(window)
        expected = [[offset_row(i, j, window) for j in range(window ** 2)]
                    for i in range(window ** 2)]
        assert index.tolist() == expected
        assert index.max() == (2 * window - 1) ** 2 - 1  # every row of the table is read


@pytest.mark.parametrize("height, width, window, shift", [(8, 8, 4, 2), (6, 9, 3, 1)])
def test_shifted_window_mask_separates_tokens_from_opposite_edges(height, width, window, shift):
    mask = shifted_window_mask(height, width, window, shift)
    per_row = width // window
    assert mask.shape == ((height // window) * per_row, window ** 2, window ** 2)
    for w in range(mask.shape[0]):
        top, left = (w // per_row) * window, (w % per_row) * window
        for i in range(window ** 2):
            for j in range(window ** 2):
                # positions on the rolled grid; a token came across the edge if rolling it
                # back by `shift` wraps it around
                ri, ci = top + i // window, left + i % window
                rj, cj = top + j // window, left + j % window
                wrapped_i = (ri + shift >= height, ci + shift >= width)
                wrapped_j = (rj + shift >= height, cj + shift >= width)
                assert mask[w, i, j] == (0.0 if wrapped_i == wrapped_j else -100.0)
    # windows away from the last row and column of windows attend freely
    assert not mask[0].any()


def test_windows_are_row_major_squares():
    grid = torch.arange(2 * 4 * 6, dtype=torch.float32).reshape(2, 4, 6, 1)
    windows = to_windows(grid, 2)[..., 0]
    assert windows.shape == (2 * 2 * 3, 4)
    assert windows[1].tolist() == [2.0, 3.0, 8.0, 9.0]  # first image, window (0, 1)
    assert windows[6 + 3].tolist() == [24 + 12, 24 + 13, 24 + 18, 24 + 19]  # second, (1, 0)


# ------------------------------------------------------------------ a forward written out
def layer_norm(x, state, prefix):
    return F.layer_norm(x, x.shape[-1:], state[prefix + "weight"], state[prefix + "bias"])


def linear(x, state, prefix):
    out = x @ state[prefix + "weight"].T
    return out + state[prefix + "bias"] if prefix + "bias" in state else out


def reference_block(x, state, prefix, heads, built_window, built_shift):
    """One block on ``[N, H, W, C]``: every window of the rolled, padded grid, token pair by
    token pair of its rows and columns."""
    n, height, width, dim = x.shape
    if min(height, width) <= built_window:
        window, shift = min(height, width, built_window), 0
    else:
        window, shift = built_window, built_shift
    padded_h, padded_w = math.ceil(height / window) * window, math.ceil(width / window) * window
    normed = torch.zeros(n, padded_h, padded_w, dim)
    normed[:, :height, :width] = layer_norm(x, state, prefix + "norm1.")
    table = state[prefix + "attn.relative_position_bias_table"]
    q, k, v = linear(normed, state, prefix + "attn.qkv.").chunk(3, dim=-1)
    width_h = dim // heads
    attended = torch.zeros(n, padded_h, padded_w, dim)
    tokens = window * window
    bias = torch.tensor([[offset_row(i, j, built_window) for j in range(tokens)]
                         for i in range(tokens)])  # the built window's rows, as VISSL reads them
    for top in range(0, padded_h, window):
        for left in range(0, padded_w, window):
            # the positions (on the unrolled grid) of the window's tokens, row-major
            places = [((top + a + shift) % padded_h, (left + b + shift) % padded_w)
                      for a in range(window) for b in range(window)]
            wrapped = [(top + a + shift >= padded_h, left + b + shift >= padded_w)
                       for a in range(window) for b in range(window)]
            rows = torch.tensor([p[0] for p in places])
            cols = torch.tensor([p[1] for p in places])
            blocked = torch.tensor([[wi != wj for wj in wrapped] for wi in wrapped])
            for h in range(heads):
                ch = slice(h * width_h, (h + 1) * width_h)
                qw, kw, vw = (t[:, rows, cols, ch] for t in (q, k, v))  # [n, T, d]
                scores = qw @ kw.transpose(1, 2) / math.sqrt(width_h) + table[bias, h]
                scores = scores.masked_fill(blocked, -100.0)
                attended[:, rows, cols, ch] = scores.softmax(-1) @ vw
    x = x + linear(attended, state, prefix + "attn.proj.")[:, :height, :width]
    hidden = F.gelu(linear(layer_norm(x, state, prefix + "norm2."), state, prefix + "mlp.fc1."))
    return x + linear(hidden, state, prefix + "mlp.fc2.")


def reference_merge(x, state, prefix):
    n, height, width, dim = x.shape
    padded = torch.zeros(n, height + height % 2, width + width % 2, dim)
    padded[:, :height, :width] = x
    rows, cols = padded.shape[1] // 2, padded.shape[2] // 2
    out = torch.empty(n, rows, cols, 4 * dim)
    for r in range(rows):
        for c in range(cols):
            out[:, r, c] = torch.cat([padded[:, 2 * r, 2 * c], padded[:, 2 * r + 1, 2 * c],
                                      padded[:, 2 * r, 2 * c + 1],
                                      padded[:, 2 * r + 1, 2 * c + 1]], dim=-1)
    return linear(layer_norm(out, state, prefix + "norm."), state, prefix + "reduction.")


def reference(state, image):
    height, width = image.shape[-2:]
    image = F.pad(image, (0, -width % PATCH, 0, -height % PATCH))
    x = F.conv2d(image, state["patch_embed.proj.weight"], state["patch_embed.proj.bias"],
                 stride=PATCH).permute(0, 2, 3, 1)
    x = layer_norm(x, state, "patch_embed.norm.")
    grid = SIZE // PATCH
    for i, heads in enumerate(TINY["NUM_HEADS"]):
        # built at IMAGE_SIZE: the stage's grid is grid >> i tokens a side
        built_window = min(WINDOW, grid >> i)
        shifts = built_window < grid >> i
        for j in range(TINY["DEPTHS"][i]):
            x = reference_block(x, state, f"layers.{i}.blocks.{j}.", heads, built_window,
                                WINDOW // 2 if j % 2 and shifts else 0)
        if i == 0:
            x = reference_merge(x, state, "layers.0.downsample.")
    return layer_norm(x, state, "norm.").mean(dim=(1, 2))


@pytest.mark.parametrize("size", [(SIZE, SIZE), (20, 26)])
def test_output_equals_a_forward_written_out(size):
    """32 x 32: the built windows; 20 x 26 (5 x 7 patches after padding the image): padded
    windows, an odd grid merged, a smaller last window reading the built window's index."""
    model = make_model()
    x = images(size=size)
    with torch.no_grad():
        (out,) = model.trunk(x)
        expected = reference(model.trunk.state_dict(), x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------ the trunk
def test_the_output_has_its_shape_for_any_input_size():
    trunk = make_model().trunk
    assert trunk.stage_dims == {"lastCLS": 2 * D} and trunk.output_dim == 2 * D
    with torch.no_grad():
        (out,) = trunk(images(), ["lastCLS"])
        (small,) = trunk(images(size=(8, 12)))  # a 2 x 3 grid, then 1 x 2
    assert out.shape == (2, 2 * D) and small.shape == (2, 2 * D)
    with pytest.raises(ValueError, match="lastMAP"):
        trunk(images(), ["lastMAP"])


def test_parameter_names_and_table_sizes_are_those_of_vissl_swin():
    torch.manual_seed(0)
    # 3 stages of 8, 4 and 2 tokens a side, windows of 3: the last stage's window is its grid
    trunk = build_model(swin_cfg(DEPTHS=[2, 1, 2], NUM_HEADS=[1, 2, 4], WINDOW_SIZE=3)).trunk
    assert sorted(trunk.state_dict()) == sorted(vissl_swin_keys([2, 1, 2]))
    assert trunk.layers[0].blocks[0].attn.relative_position_bias_table.shape == (25, 1)
    assert trunk.layers[2].blocks[1].attn.relative_position_bias_table.shape == (9, 4)
    assert [b.shift for b in trunk.layers[0].blocks] == [0, 1]
    assert [b.shift for b in trunk.layers[2].blocks] == [0, 0]
    assert trunk.layers[1].downsample.reduction.weight.shape == (4 * D, 8 * D)
    assert trunk.layers[2].downsample is None
    assert vissl_key_prefix("swin_transformer") == ""


def test_activation_checkpointing_gives_the_same_gradients():
    grads = []
    for on in (False, True):
        cfg = swin_cfg()
        cfg.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING = on
        torch.manual_seed(0)
        trunk = build_model(cfg).trunk.train()
        assert trunk.checkpoint_splits == (2 if on else 0)  # segments of each stage's blocks
        trunk(images())[0].pow(2).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in trunk.parameters()]))
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_vissl_checkpoints_load():
    heads = [["eval_mlp", {"in_channels": 2 * D, "dims": [2 * D, 5]}]]
    source = make_model(seed=3, heads=heads)
    state = source.get_classy_state()["model"]
    written = vissl_checkpoint(state, vissl_key_prefix("swin_transformer"))
    vissl_model = written["classy_state_dict"]["base_model"]["model"]
    assert sorted(vissl_model["trunk"]) == sorted(vissl_swin_keys(TINY["DEPTHS"]))
    # VISSL's linear evaluation wraps the trunk in base_model
    vissl_model["trunk"] = {f"base_model.{k}": v for k, v in vissl_model["trunk"].items()}
    target = make_model(seed=4, heads=heads)
    load_vissl_model_weights(target, written)
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(target(x), source(x), rtol=0, atol=0)


def test_swin_name_passes_the_checks_and_qk_scale_reads_as_a_number():
    cfg = copy.deepcopy(DEFAULTS)
    cfg.DATA.TRAIN.DATA_SOURCES = cfg.DATA.TEST.DATA_SOURCES = ["synthetic"]
    assert "swin_transformer" not in UNSUPPORTED_NAMES.get("config.MODEL.TRUNK.NAME", {})
    cfg.MODEL.TRUNK.NAME = "swin_transformer"
    check_registered_names("train", cfg)
    raw = copy.deepcopy(SCHEMA)
    raw["config"]["MODEL"]["TRUNK"]["SWIN_TRANSFORMER"]["QK_SCALE"] = "0.125"
    validate_config(raw, SCHEMA)
    raw["config"]["MODEL"]["TRUNK"]["SWIN_TRANSFORMER"]["QK_SCALE"] = "large"
    with pytest.raises(ConfigError, match="SWIN_TRANSFORMER.QK_SCALE"):
        validate_config(raw, SCHEMA)
    torch.manual_seed(0)
    assert build_model(swin_cfg(QK_SCALE="0.125")).trunk.layers[1].blocks[0].attn.scale == 0.125


@pytest.mark.parametrize("overrides, message", [
    (dict(NUM_HEADS=[2]), r"NUM_HEADS=\[2\] must have one entry per stage"),
    (dict(NUM_HEADS=[3, 4]), r"NUM_HEADS\[0\]=3 must divide"),
    (dict(DEPTHS=[2, 0]), r"DEPTHS=\[2, 0\] must be a list of integers >= 1"),
    (dict(IMAGE_SIZE=4, DEPTHS=[1, 1, 1], NUM_HEADS=[1, 1, 1]), "IMAGE_SIZE=4 is too small"),
    (dict(name="swin_t"), "name='swin_t' is not supported"),
    (dict(DROP_PATH_RATE=1.0), "DROP_PATH_RATE=1.0 must be in"),
])
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=f"config.MODEL.TRUNK.SWIN_TRANSFORMER.{message}"):
        build_model(swin_cfg(**overrides))
