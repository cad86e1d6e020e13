"""VISSL's ViT checkpoints, laid out as VISSL saved them (the trunk's layers at its top level,
``class_token`` and ``pos_embedding`` for timm's ``cls_token`` and ``pos_embed``), load into
the vision_transformer trunk as MODEL.WEIGHTS_INIT and as the starting point of a resumed run;
``--to vissl`` writes that layout back."""
import importlib.util

import torch
from timm.models.vision_transformer import VisionTransformer

from counterpart_utils import ROOT, TOLERANCE, engine_model, images, max_diff, model_cfg
from ssl_engine.checkpoint.formats import (engine_checkpoint, is_vissl_checkpoint,
                                           load_vissl_model_weights, vissl_key_prefix)
from ssl_engine.checkpoint.weights_init import load_weights_init

SIZES = dict(IMAGE_SIZE=32, PATCH_SIZE=8, NUM_LAYERS=2, NUM_HEADS=2, HIDDEN_DIM=64,
             MLP_DIM=256, QKV_BIAS=True)
HEAD = {"0.clf.0.weight": torch.full((10, 64), 0.01), "0.clf.0.bias": torch.arange(10.0)}


def vissl_vit(seed=1):
    """A ViT as VISSL's trunk holds it (timm's network, VISSL's two names), and the network."""
    torch.manual_seed(seed)
    net = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                            mlp_ratio=4.0, qkv_bias=True, num_classes=0).eval()
    renames = {"cls_token": "class_token", "pos_embed": "pos_embedding"}
    trunk = {renames.get(k, k): v.clone() for k, v in net.state_dict().items()}
    assert {"class_token", "pos_embedding", "blocks.1.attn.qkv.weight", "norm.weight"} <= set(trunk)
    return trunk, net


def vissl_file(tmp_path, trunk, under=""):
    checkpoint = {"type": "consolidated", "phase_idx": 3, "iteration": 40,
                  "classy_state_dict": {"base_model": {"model": {
                      "trunk": {under + k: v for k, v in trunk.items()}, "heads": dict(HEAD)}}}}
    path = tmp_path / "model_final_checkpoint_phase3.torch"
    torch.save(checkpoint, path)
    return path, checkpoint


def vit_model(seed=0):
    cfg = model_cfg("vision_transformer", "VISION_TRANSFORMERS", **SIZES)
    cfg.HEAD.PARAMS = [["mlp", {"dims": [64, 10]}]]
    return engine_model(cfg, seed=seed), cfg


def test_vissl_vit_checkpoint_loads_as_weights(tmp_path):
    trunk, net = vissl_vit()
    x = images(2, 32)
    for under in ("", "base_model."):  # a pretraining and a feature-evaluation checkpoint
        path, _ = vissl_file(tmp_path, trunk, under)
        model, _ = vit_model()
        report = load_weights_init(model, {"PARAMS_FILE": str(path),
                                           "STATE_DICT_KEY_NAME": "classy_state_dict"})
        assert report.missing == [] and report.unexpected == [], report.summary()
        assert len(report.loaded) == len(trunk) + len(HEAD)
        with torch.no_grad():
            diff = max_diff(model.trunk(x)[0], net(x))
        assert diff <= TOLERANCE, diff
        assert torch.equal(model.heads[0].clf[0].bias, HEAD["0.clf.0.bias"])


def test_vissl_vit_checkpoint_starts_a_resumed_run(tmp_path):
    trunk, net = vissl_vit(seed=2)
    _, checkpoint = vissl_file(tmp_path, trunk)
    assert is_vissl_checkpoint(checkpoint, vissl_key_prefix("vision_transformer"))
    model, _ = vit_model()
    load_vissl_model_weights(model, checkpoint)  # strict: every key placed, none left over
    x = images(2, 32)
    with torch.no_grad():
        assert max_diff(model.trunk(x)[0], net(x)) <= TOLERANCE


def test_export_to_vissl_writes_vissls_vit_names(tmp_path):
    spec = importlib.util.spec_from_file_location("export_model", ROOT / "tools/export_model.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    model, cfg = vit_model(seed=3)
    run_cfg = {"MODEL": cfg.to_dict()}
    source = tmp_path / "checkpoint.torch"
    torch.save(engine_checkpoint(model.get_classy_state()["model"], config=run_cfg), source)
    out = tmp_path / "vissl.torch"
    assert tool.main([str(source), "--to", "vissl", "--out", str(out), "--heads"]) == 0
    written = torch.load(out, weights_only=True)
    vissl_trunk = written["classy_state_dict"]["base_model"]["model"]["trunk"]
    assert {"class_token", "pos_embedding", "patch_embed.proj.weight"} <= set(vissl_trunk)
    assert not any(k.startswith("vit.") for k in vissl_trunk)
    again, _ = vit_model(seed=9)
    load_vissl_model_weights(again, written)
    x = images(2, 32)
    with torch.no_grad():
        assert max_diff(again(x)[0], model(x)[0]) == 0


def test_vissl_vit_checkpoint_exports_to_timm_with_the_config_that_built_it(tmp_path):
    from safetensors.torch import load_file

    trunk, net = vissl_vit(seed=4)
    path, _ = vissl_file(tmp_path, trunk)
    spec = importlib.util.spec_from_file_location("export_model", ROOT / "tools/export_model.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    sizes = [f"config.MODEL.TRUNK.VISION_TRANSFORMERS.{k}={v}" for k, v in SIZES.items()]
    out = tmp_path / "vit.safetensors"
    assert tool.main([str(path), "--to", "timm", "--out", str(out), "--config",
                      "config=pretrain/dino/dino_vit_s16", *sizes]) == 0
    again = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=2,
                              mlp_ratio=4.0, qkv_bias=True, num_classes=0).eval()
    again.load_state_dict(load_file(str(out)))  # strict
    x = images(2, 32)
    with torch.no_grad():
        assert max_diff(again(x), net(x)) == 0
