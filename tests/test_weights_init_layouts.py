"""MODEL.WEIGHTS_INIT reads a plain timm or torchvision state dict (torch or safetensors file)
without any prefix: the layout is named in the log from the keys, the file's classifier is
reported unexpected, and the features are the library's; a run folder exports its latest
checkpoint."""
import importlib.util
import json
import logging

import torch
import torchvision
from safetensors.torch import load_file, save_file
from timm.models.vision_transformer import VisionTransformer

from counterpart_utils import (ROOT, TOLERANCE, engine_model, images, max_diff, model_cfg,
                               randomize)
from ssl_engine.checkpoint.formats import engine_checkpoint
from ssl_engine.checkpoint.weights_init import load_weights_init

RESNET18 = model_cfg("resnet", "RESNETS", DEPTH=18)


def test_torchvision_file_with_its_classifier_loads_and_names_its_layout(tmp_path, caplog):
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None)
    randomize(net, 1)
    path = tmp_path / "resnet18.pth"
    torch.save(net.state_dict(), path)
    model = engine_model(RESNET18, seed=3)
    with caplog.at_level(logging.INFO, logger="ssl_engine.checkpoint.weights_init"):
        report = load_weights_init(model, {"PARAMS_FILE": str(path), "STATE_DICT_KEY_NAME": ""})
    assert f"{path} is in the timm/torchvision ResNet layout" in caplog.text
    assert report.unexpected == ["fc.weight", "fc.bias"] and report.missing == []
    net.fc = torch.nn.Identity()
    x = images(2, 64)
    with torch.no_grad():
        assert max_diff(model.eval().trunk(x)[0], net.eval()(x)) <= TOLERANCE


def test_timm_safetensors_file_loads(tmp_path, caplog):
    torch.manual_seed(0)
    net = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                            mlp_ratio=2.0, qkv_bias=False, num_classes=5).eval()
    path = tmp_path / "vit.safetensors"
    save_file(net.state_dict(), str(path))
    cfg = model_cfg("vision_transformer", "VISION_TRANSFORMERS", IMAGE_SIZE=32, PATCH_SIZE=8,
                    NUM_LAYERS=2, NUM_HEADS=2, HIDDEN_DIM=64, MLP_DIM=128)
    model = engine_model(cfg, seed=2)
    with caplog.at_level(logging.INFO, logger="ssl_engine.checkpoint.weights_init"):
        report = load_weights_init(model, {"PARAMS_FILE": str(path), "STATE_DICT_KEY_NAME": "",
                                           "SKIP_LAYERS": ["head."]})
    assert "timm VisionTransformer layout" in caplog.text
    assert sorted(report.skipped) == ["head.bias", "head.weight"] and report.missing == []
    x = images(2, 32)
    with torch.no_grad():
        assert max_diff(model.trunk(x)[0], net.forward_head(net.forward_features(x),
                                                            pre_logits=True)) <= TOLERANCE


def test_a_run_folder_exports_its_latest_checkpoint(tmp_path):
    spec = importlib.util.spec_from_file_location("export_model", ROOT / "tools/export_model.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    run = tmp_path / "run"
    run.mkdir()
    for phase, seed in ((0, 0), (1, 1)):
        model = engine_model(RESNET18, seed=seed)
        torch.save(engine_checkpoint(model.get_classy_state()["model"],
                                     config={"MODEL": RESNET18.to_dict()}),
                   run / f"model_phase{phase}.torch")
    (run / "checkpoint.torch").symlink_to(run / "model_phase1.torch")
    out = tmp_path / "resnet18.pth"
    assert tool.main([str(run), "--to", "torchvision", "--out", str(out)]) == 0
    assert json.loads(out.with_suffix(".json").read_text())["model_name"] == "resnet18"
    net = torchvision.models.resnet18(weights=None)
    net.fc = torch.nn.Identity()
    net.load_state_dict(torch.load(out, weights_only=True))  # strict
    x = images(2, 64)
    with torch.no_grad():
        assert max_diff(model.trunk(x)[0], net.eval()(x)) == 0  # the last phase's model


def test_vissl_and_weights_only_resnets_export_with_a_given_config(tmp_path):
    """A VISSL ResNet (``_feature_blocks.``) and a weights-only file of this engine (its own
    names) hold no config: both export with ``--config`` and give the same torchvision file."""
    from ssl_engine.checkpoint.formats import vissl_checkpoint

    spec = importlib.util.spec_from_file_location("export_model", ROOT / "tools/export_model.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    model = engine_model(RESNET18, seed=0)
    state = model.get_classy_state()["model"]
    files = {"vissl": vissl_checkpoint(state, "_feature_blocks."),
             "engine": engine_checkpoint(state)}
    written = {}
    for name, checkpoint in files.items():
        torch.save(checkpoint, tmp_path / f"{name}.torch")
        out = tmp_path / f"{name}_resnet18.safetensors"
        assert tool.main([str(tmp_path / f"{name}.torch"), "--to", "torchvision", "--out",
                          str(out), "--config", "config=test/quick_simclr_synthetic",
                          "config.MODEL.TRUNK.RESNETS.DEPTH=18",
                          "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=1.0",
                          "config.MODEL.TRUNK.RESNETS.SMALL_IMAGE_STEM=false"]) == 0
        written[name] = load_file(str(out))
    assert set(written["vissl"]) == set(written["engine"]) == set(
        k for k in torchvision.models.resnet18().state_dict() if not k.startswith("fc."))
    assert all(torch.equal(v, written["engine"][k]) for k, v in written["vissl"].items())
