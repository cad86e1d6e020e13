"""tools/export_model.py: a ViT-S/16 of the DINO recipe exported to timm loads into
``timm.create_model(..., pretrained=False)`` strictly and gives the trunk's features (its
intermediate layers too); the safetensors target loads back as MODEL.WEIGHTS_INIT with the
heads; bad input ends with one line and exit code 2."""
import copy
import importlib.util
import json

import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file

import ssl_engine.losses  # noqa: F401  (registered before a config is composed)
from counterpart_utils import ROOT, TOLERANCE, engine_model, images, max_diff, model_cfg
from ssl_engine.checkpoint.formats import engine_checkpoint
from ssl_engine.checkpoint.weights_init import load_weights_init
from ssl_engine.config import load_config
from ssl_engine.config.attr_dict import AttrDict

with open(ROOT / "configs/config/defaults.yaml") as f:
    DEFAULT_CFG = yaml.safe_load(f)["config"]


def export_tool():
    spec = importlib.util.spec_from_file_location("export_model", ROOT / "tools/export_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def save_run(model, cfg, path):
    torch.save(engine_checkpoint(model.get_classy_state()["model"], config=cfg), path)
    return str(path)


def test_dino_vit_s16_loads_in_timm_with_equal_features_and_layers(tmp_path):
    _, cfg = load_config(["config=pretrain/dino/dino_vit_s16", "config.MACHINE.DEVICE=cpu"])
    model = engine_model(cfg.MODEL, seed=0)
    source = save_run(model, cfg.to_dict(), tmp_path / "model_final_checkpoint_phase299.torch")
    out = tmp_path / "dino_vit_s16.safetensors"
    assert export_tool()([source, "--to", "timm", "--out", str(out)]) == 0

    net = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=0)
    net.load_state_dict(load_file(str(out)))  # strict: every key, no other
    net.eval()
    description = json.loads(out.with_suffix(".json").read_text())
    assert description["model_name"] == "vit_small_patch16_224"
    assert description["input_size"] == [3, 224, 224]
    assert description["mean"] == [0.485, 0.456, 0.406]
    assert description["layers"]["concatCLS4"] == 4 * 384
    assert description["left_out"] == [] and description["load_strict"]

    x = images(1, 224)
    with torch.no_grad():
        cls, cls4, pool = model.trunk(x, ["lastCLS", "concatCLS4", "lastPOOL"])
        diffs = {"model(x)": max_diff(net(x), cls),
                 "forward_features": max_diff(net.forward_features(x)[:, 0], cls)}
        # blocks 4, 8 and 12 (indices 3, 7, 11), each through the final norm
        blocks = net.get_intermediate_layers(x, n=[3, 7, 11], return_prefix_tokens=True,
                                             norm=True)
        last4 = net.get_intermediate_layers(x, n=4, return_prefix_tokens=True, norm=True)
    diffs["block 12 class token"] = max_diff(blocks[-1][1][:, 0], cls)
    diffs["block 12 patch mean"] = max_diff(blocks[-1][0].mean(dim=1), pool)
    diffs["last 4 class tokens"] = max_diff(torch.cat([p[:, 0] for _, p in last4], dim=1), cls4)
    print(diffs)
    assert len(blocks) == 3 and blocks[0][0].shape == (1, 196, 384)
    assert max(diffs.values()) <= TOLERANCE


def run_cfg(model):
    cfg = copy.deepcopy(DEFAULT_CFG)
    cfg["MODEL"] = model.to_dict() if hasattr(model, "to_dict") else dict(model)
    return cfg


def test_safetensors_export_loads_back_with_its_heads(tmp_path):
    cfg = model_cfg("vision_transformer", "VISION_TRANSFORMERS", IMAGE_SIZE=32, PATCH_SIZE=8,
                    NUM_LAYERS=2, NUM_HEADS=2, HIDDEN_DIM=64, MLP_DIM=128)
    cfg.HEAD.PARAMS = [["mlp", {"dims": [64, 10]}]]
    model = engine_model(cfg, seed=0)
    source = save_run(model, run_cfg(cfg), tmp_path / "checkpoint.torch")
    out = tmp_path / "vit.safetensors"
    assert export_tool()([source, "--out", str(out), "--heads"]) == 0  # safetensors: default
    fresh = engine_model(cfg, seed=4)
    report = load_weights_init(fresh, {"PARAMS_FILE": str(out), "STATE_DICT_KEY_NAME": ""})
    assert report.missing == [] and report.unexpected == []
    x = images(2, 32)
    with torch.no_grad():
        assert max_diff(fresh(x)[0], model(x)[0]) == 0

    timm_out = tmp_path / "vit_timm.safetensors"
    assert export_tool()([source, "--to", "timm", "--out", str(timm_out), "--heads"]) == 0
    heads = load_file(str(tmp_path / "vit_timm.heads.safetensors"))
    assert set(heads) == {"0.clf.0.weight", "0.clf.0.bias"}


@pytest.mark.parametrize("trunk, target, message", [
    ("mobilenetv3_tv", "timm", "the mobilenetv3_tv trunk has no timm counterpart; its targets: "
                               "torchvision"),
    ("convit", "torchvision", "the convit trunk has no torchvision counterpart; its targets: "
                              "none (use --to safetensors or --to vissl)"),
    ("mobilenetv3_tv", "onnx", "unknown --to 'onnx': one of timm, torchvision, safetensors, "
                               "vissl"),
])
def test_bad_targets_are_refused_in_one_line(trunk, target, message, tmp_path, capsys):
    cfg = AttrDict(run_cfg(model_cfg(trunk)))
    with torch.device("meta"):
        from ssl_engine.models import build_model
        state = build_model(cfg.MODEL).get_classy_state()["model"]
    state = {part: {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in tensors.items()}
             for part, tensors in state.items()}
    source = tmp_path / "checkpoint.torch"
    torch.save(engine_checkpoint(state, config=cfg.to_dict()), source)
    assert export_tool()([str(source), "--to", target, "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {message}"
    assert not (tmp_path / "x").exists()


def test_a_checkpoint_without_config_asks_for_one(tmp_path, capsys):
    source = tmp_path / "weights.torch"
    torch.save(engine_checkpoint({"trunk": {"w": torch.zeros(1)}, "heads": {}}), source)
    assert export_tool()([str(source), "--to", "timm", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: the checkpoint holds no config: give the one that built it with --config "
        "config=<group/name> [overrides]")
