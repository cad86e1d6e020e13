"""The convnext trunk: VISSL's parameter names, its output against a forward written out here,
a VISSL feature-evaluation checkpoint loaded."""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from ssl_engine.checkpoint.formats import (load_vissl_model_weights, vissl_checkpoint,
                                           vissl_key_prefix)
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])

DEPTH, DIMS = [1, 1, 2, 1], [8, 16, 16, 32]


def make_model(seed=0, **overrides):
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = "convnext"
    cfg.TRUNK.CONVNEXT.update(dict(DEPTH=DEPTH, DIMS=DIMS), **overrides)
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():  # random norms, biases and layer scales: loading them is checked
        for name, parameter in model.named_parameters():
            if name.endswith("gamma") or "norm" in name or "downsample_layers.0.1" in name:
                parameter.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                parameter.normal_(0, 0.1)
    return model.eval()


def vissl_convnext_keys():
    keys = ["downsample_layers.0.0.weight", "downsample_layers.0.0.bias",
            "downsample_layers.0.1.weight", "downsample_layers.0.1.bias"]
    for i in range(1, 4):
        keys += [f"downsample_layers.{i}.{j}.{p}" for j in (0, 1) for p in ("weight", "bias")]
    for i, depth in enumerate(DEPTH):
        for j in range(depth):
            keys += [f"stages.{i}.{j}.gamma"] + [f"stages.{i}.{j}.{m}.{p}" for m in (
                "dwconv", "norm", "pwconv1", "pwconv2") for p in ("weight", "bias")]
    return keys + ["norm.weight", "norm.bias"]


def reference(state, x):
    """The trunk's output computed from the state dict alone."""
    def channel_norm(t, prefix):
        mean = t.mean(1, keepdim=True)
        var = (t - mean).pow(2).mean(1, keepdim=True)
        t = (t - mean) / torch.sqrt(var + 1e-6)
        return state[prefix + ".weight"][:, None, None] * t + state[prefix + ".bias"][:, None, None]

    x = F.conv2d(x, state["downsample_layers.0.0.weight"], state["downsample_layers.0.0.bias"],
                 stride=4)
    x = channel_norm(x, "downsample_layers.0.1")
    for i, depth in enumerate(DEPTH):
        if i:
            x = channel_norm(x, f"downsample_layers.{i}.0")
            x = F.conv2d(x, state[f"downsample_layers.{i}.1.weight"],
                         state[f"downsample_layers.{i}.1.bias"], stride=2)
        for j in range(depth):
            p = f"stages.{i}.{j}."
            h = F.conv2d(x, state[p + "dwconv.weight"], state[p + "dwconv.bias"], padding=3,
                         groups=x.shape[1]).permute(0, 2, 3, 1)
            h = F.layer_norm(h, (x.shape[1],), state[p + "norm.weight"], state[p + "norm.bias"],
                             eps=1e-6)
            h = F.gelu(h @ state[p + "pwconv1.weight"].T + state[p + "pwconv1.bias"])
            h = state[p + "gamma"] * (h @ state[p + "pwconv2.weight"].T + state[p + "pwconv2.bias"])
            x = x + h.permute(0, 3, 1, 2)
    return F.layer_norm(x.mean((2, 3)), (DIMS[-1],), state["norm.weight"], state["norm.bias"],
                        eps=1e-6)


def test_names_shape_and_output_equal_a_forward_written_out():
    model = make_model()
    trunk = model.trunk
    assert sorted(trunk.state_dict()) == sorted(vissl_convnext_keys())
    assert trunk.stage_dims == {"lastCLS": DIMS[-1]} and trunk.output_dim == DIMS[-1]
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        (out,) = trunk(x, ["lastCLS"])
        expected = reference(trunk.state_dict(), x)
    assert out.shape == (2, DIMS[-1])
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    # a VISSL feature-evaluation checkpoint (trunk under base_model.) loads as it is
    written = vissl_checkpoint(model.get_classy_state()["model"], vissl_key_prefix("convnext"))
    vissl_model = written["classy_state_dict"]["base_model"]["model"]
    assert sorted(vissl_model["trunk"]) == sorted(vissl_convnext_keys())
    vissl_model["trunk"] = {f"base_model.{k}": v for k, v in vissl_model["trunk"].items()}
    target = make_model(seed=2)
    load_vissl_model_weights(target, written)
    with torch.no_grad():
        torch.testing.assert_close(target.trunk(x)[0], out, rtol=0, atol=0)


@pytest.mark.parametrize("overrides, message", [
    (dict(DEPTH=[3, 3, 9]), r"DEPTH=\[3, 3, 9\] must be 4 integers"),
    (dict(DIMS=[8, 16, 0, 32]), "DIMS=.* must be 4 integers"),
    (dict(DROP_PATH_RATE=1.0), "DROP_PATH_RATE=1.0 must be in"),
])
def test_bad_settings_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=f"config.MODEL.TRUNK.CONVNEXT.{message}"):
        make_model(**overrides)
