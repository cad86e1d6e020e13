"""VISSL and torchvision checkpoints in and out: MODEL.WEIGHTS_INIT from VISSL files, a VISSL
training checkpoint as a resume point, and extra_scripts/convert_checkpoint.py both ways.

The VISSL files are made here: torchvision weights (random init) renamed the way VISSL's ResNet
trunk names them (``_feature_blocks.`` + torchvision's key)."""
import copy
import importlib.util
from pathlib import Path

import pytest
import torch
import torchvision
import yaml

from ssl_engine.checkpoint import CheckpointError, load_checkpoint, load_weights_init
from ssl_engine.config import load_config
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model
from ssl_engine.trainer.task import SelfSupervisionTask

REPO = Path(__file__).resolve().parents[1]
with open(REPO / "configs/config/defaults.yaml") as f:
    DEFAULTS = AttrDict(yaml.safe_load(f)["config"])


def load_script():
    spec = importlib.util.spec_from_file_location(
        "convert_checkpoint", REPO / "extra_scripts/convert_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def randomize_batch_norms(net, seed):
    """Non-trivial batch-norm statistics and affines, so that loading them is checked."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                for tensor, low, high in ((module.running_mean, -0.1, 0.1),
                                          (module.running_var, 0.5, 1.5),
                                          (module.weight, 0.5, 1.5), (module.bias, -0.1, 0.1)):
                    tensor.copy_(torch.rand(tensor.shape, generator=gen) * (high - low) + low)
    return net


def torchvision_resnet(depth, seed):
    torch.manual_seed(seed)
    return randomize_batch_norms(getattr(torchvision.models, f"resnet{depth}")(weights=None), seed)


def our_model(depth, heads, seed=0):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.RESNETS.DEPTH = depth
    cfg.HEAD.PARAMS = heads
    torch.manual_seed(seed)
    return build_model(cfg)


def vissl_file(path, trunk, heads):
    """A VISSL training checkpoint: trunk keys under _feature_blocks., as VISSL saves them."""
    torch.save({"type": "consolidated", "phase_idx": 4, "iteration": 500, "train_phase_idx": 4,
                "classy_state_dict": {"base_model": {"model": {
                    "trunk": {f"_feature_blocks.{k}": v for k, v in trunk.items()},
                    "heads": dict(heads)}}}}, path)
    return path


def weights_cfg(path, **overrides):
    cfg = copy.deepcopy(DEFAULTS.MODEL.WEIGHTS_INIT)
    cfg.PARAMS_FILE = str(path)
    cfg.update(overrides)
    return cfg


IMAGES = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- (a) VISSL ResNet-50 in
def test_vissl_resnet50_checkpoint_gives_torchvision_features(tmp_path):
    net = torchvision_resnet(50, seed=1)
    trunk = {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}
    head = {"0.clf.0.weight": torch.randn(16, 2048), "0.clf.0.bias": torch.randn(16)}
    path = vissl_file(tmp_path / "vissl_rn50.torch", trunk, head)

    model = our_model(50, [["mlp", {"dims": [2048, 16]}]], seed=2)
    # VISSL's fulltune configs set APPEND_PREFIX=trunk. with classy_state_dict: not applied
    report = load_weights_init(model, weights_cfg(path, APPEND_PREFIX="trunk."))
    tracked = {f"trunk.{k}" for k in trunk if k.endswith("num_batches_tracked")}
    assert set(report.loaded) == {f"trunk.{k}" for k in trunk} - tracked | {
        "heads.0.clf.0.weight", "heads.0.clf.0.bias"}
    assert report.missing == [] and report.unexpected == []
    assert torch.equal(model.heads[0].clf[0].weight, head["0.clf.0.weight"])

    net.fc = torch.nn.Identity()
    with torch.no_grad():
        ours = model.eval().trunk(IMAGES, ["res5avg"])[0]
        expected = net.eval()(IMAGES)
    assert ours.shape == (2, 2048)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)


def test_plain_file_with_vissls_trunk_prefix_and_skip_layers(tmp_path):
    """A torchvision state dict loaded the VISSL way: APPEND_PREFIX=trunk._feature_blocks.,
    SKIP_LAYERS spelt with VISSL's names."""
    net = torchvision_resnet(18, seed=3)
    torch.save(net.state_dict(), tmp_path / "rn18.pth")
    model = our_model(18, [], seed=4)
    report = load_weights_init(model, weights_cfg(
        tmp_path / "rn18.pth", STATE_DICT_KEY_NAME="", APPEND_PREFIX="trunk._feature_blocks.",
        SKIP_LAYERS=["num_batches_tracked", "_feature_blocks.layer4."]))
    assert "trunk.conv1.weight" in report.loaded
    assert {k for k in report.skipped if "layer4" in k} == {
        f"trunk.{k}" for k in net.state_dict() if k.startswith("layer4.")}
    assert report.unexpected == ["trunk.fc.weight", "trunk.fc.bias"]
    assert torch.equal(model.trunk.layer3[1].conv2.weight, net.layer3[1].conv2.weight)
    assert not torch.equal(model.trunk.layer4[1].conv2.weight, net.layer4[1].conv2.weight)


# ---------------------------------------------------------------- (b) round trips
def our_checkpoint(path, seed=5):
    """A checkpoint of this engine's layout: ResNet-18 with an mlp and an eval_mlp head."""
    model = our_model(18, [["mlp", {"dims": [512, 8]}],
                           ["eval_mlp", {"in_channels": 512, "dims": [512, 4]}]], seed)
    randomize_batch_norms(model, seed)
    torch.save({"phase_idx": 3, "iteration": 40, "config": {"MODEL": {"TRUNK": {"NAME": "resnet"}}},
                "classy_state_dict": {"base_model": model.get_classy_state()}}, path)
    return model.get_classy_state()["model"]


def assert_same_state(actual, expected):
    assert list(actual) == list(expected)
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


def test_ours_to_vissl_to_ours_is_exact(tmp_path):
    script = load_script()
    expected = our_checkpoint(tmp_path / "ours.torch")
    assert script.main(["to-vissl", str(tmp_path / "ours.torch"), str(tmp_path / "vissl.torch")]) == 0
    vissl = load_checkpoint(tmp_path / "vissl.torch")
    vissl_model = vissl["classy_state_dict"]["base_model"]["model"]
    assert all(k.startswith("_feature_blocks.") for k in vissl_model["trunk"])
    assert "_feature_blocks.layer4.1.bn2.running_var" in vissl_model["trunk"]
    assert "1.clf.clf.0.weight" in vissl_model["heads"]  # VISSL's eval_mlp
    assert "0.clf.0.weight" in vissl_model["heads"]
    assert (vissl["type"], vissl["phase_idx"], vissl["iteration"]) == ("consolidated", 3, 40)

    assert script.main(["from-vissl", str(tmp_path / "vissl.torch"), str(tmp_path / "back.torch")]) == 0
    back = load_checkpoint(tmp_path / "back.torch")["classy_state_dict"]["base_model"]["model"]
    assert_same_state(back["trunk"], expected["trunk"])
    assert_same_state(back["heads"], expected["heads"])


def test_ours_to_torchvision_to_ours_is_exact(tmp_path):
    script = load_script()
    expected = our_checkpoint(tmp_path / "ours.torch")
    assert script.main(["to-torchvision", str(tmp_path / "ours.torch"), str(tmp_path / "tv.pth")]) == 0
    state = load_checkpoint(tmp_path / "tv.pth")
    net = torchvision.models.resnet18(weights=None)
    net.fc = torch.nn.Identity()
    net.load_state_dict(state, strict=True)  # every torchvision key but fc, nothing else

    model = our_model(18, [], seed=6)
    model.trunk.load_state_dict(expected["trunk"])
    with torch.no_grad():
        torch.testing.assert_close(net.eval()(IMAGES), model.eval().trunk(IMAGES, ["res5avg"])[0],
                                   rtol=0, atol=0)

    assert script.main(["from-torchvision", str(tmp_path / "tv.pth"), str(tmp_path / "back.torch")]) == 0
    back = load_checkpoint(tmp_path / "back.torch")["classy_state_dict"]["base_model"]["model"]
    assert_same_state(back["trunk"], expected["trunk"])
    assert back["heads"] == {}


# ---------------------------------------------------------------- (c) files that do not fit
def test_mismatched_files_are_refused_with_one_message_naming_the_keys(tmp_path, capsys):
    script = load_script()
    state = torchvision_resnet(18, seed=7).state_dict()
    state.pop("layer4.1.conv2.weight")
    state["layer5.0.conv1.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "bad_tv.pth")
    assert script.main(["from-torchvision", str(tmp_path / "bad_tv.pth"), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {tmp_path / 'bad_tv.pth'}: ")
    assert ("missing keys (1): layer4.1.conv2.weight; unexpected keys (1): "
            "layer5.0.conv1.weight") in err
    assert not (tmp_path / "o").exists()

    torch.save({"classy_state_dict": {"base_model": {"model": {"heads": {}, "trunk": {
        "_feature_blocks.conv1.weight": torch.zeros(1), "module.stem.weight": torch.zeros(1)}}}}},
        tmp_path / "bad_vissl.torch")  # a trunk key outside _feature_blocks.
    assert script.main(["from-vissl", str(tmp_path / "bad_vissl.torch"), str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unexpected keys (1): module.stem.weight" in err


# ---------------------------------------------------------------- resume from VISSL
def test_auto_resume_from_a_vissl_checkpoint_loads_its_model_weights(tmp_path, caplog):
    _, cfg = load_config(["config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={tmp_path}"])
    torch.manual_seed(8)
    source = build_model(cfg.MODEL).get_classy_state()["model"]
    checkpoint = {"classy_state_dict": {"base_model": {"model": {
        "trunk": {f"_feature_blocks.{k}": v for k, v in source["trunk"].items()},
        "heads": source["heads"]}}}, "phase_idx": 1, "iteration": 9}

    task = SelfSupervisionTask(cfg, torch.device("cpu"))
    task.prepare(checkpoint=checkpoint)
    assert_same_state(task.base_model.trunk.state_dict(), source["trunk"])
    assert_same_state(task.base_model.heads.state_dict(), source["heads"])
    assert task.iteration == 0  # the run starts at the beginning of its own schedule
    assert "not restored: optimizer state" in caplog.text

    checkpoint["classy_state_dict"]["base_model"]["model"]["trunk"].pop("_feature_blocks.conv1.weight")
    with pytest.raises(CheckpointError, match=r"does not fit the model .*missing keys \(1\): "
                                              r"conv1.weight"):
        SelfSupervisionTask(cfg, torch.device("cpu")).prepare(checkpoint=checkpoint)


def test_a_vissl_checkpoint_that_does_not_convert_is_refused_before_launch(tmp_path):
    from ssl_engine.checkpoint import check_resume_files
    from ssl_engine.checkpoint.formats import CheckpointFormatError

    _, cfg = load_config(["config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={tmp_path}"])
    vissl_file(tmp_path / "model_phase4.torch", {"conv1.weight": torch.zeros(1)}, {})
    check_resume_files(cfg)  # a VISSL checkpoint is a valid start
    torch.save({"classy_state_dict": {"base_model": {"model": {"heads": {}, "trunk": {
        "_feature_blocks.conv1.weight": torch.zeros(1), "extra.weight": torch.zeros(1)}}}}},
        tmp_path / "model_phase4.torch")
    with pytest.raises(CheckpointFormatError, match=r"unexpected keys \(1\): extra.weight"):
        check_resume_files(cfg)


def test_trunks_named_as_vissl_names_them_load_resume_and_convert_unchanged(tmp_path):
    """A RegNet holds VISSL's own names (its _feature_blocks included): this engine's checkpoint
    of it is not taken for VISSL's, loads as WEIGHTS_INIT, and converts to VISSL's layout and
    back with its names unchanged."""
    from ssl_engine.checkpoint.formats import is_vissl_checkpoint, vissl_key_prefix

    _, cfg = load_config(["config=test/quick_simclr_synthetic", "config.MODEL.TRUNK.NAME=regnet",
                          "config.MODEL.TRUNK.REGNET.depth=6", "config.MODEL.TRUNK.REGNET.w_0=8",
                          "config.MODEL.TRUNK.REGNET.w_a=8.0", "config.MODEL.TRUNK.REGNET.w_m=2.0",
                          "config.MODEL.TRUNK.REGNET.group_width=8",
                          "config.MODEL.TRUNK.REGNET.stem_width=8",
                          "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,8]}]]"])
    assert vissl_key_prefix("regnet") == "" and vissl_key_prefix("resnet") == "_feature_blocks."
    torch.manual_seed(2)
    model = build_model(cfg.MODEL)
    state = model.get_classy_state()["model"]
    assert all(key.startswith("_feature_blocks.") for key in state["trunk"])
    checkpoint = {"phase_idx": 0, "iteration": 4, "rng_states": [], "config": cfg.to_dict(),
                  "classy_state_dict": {"base_model": model.get_classy_state()}}
    assert not is_vissl_checkpoint(checkpoint)  # resumed as this engine's, exactly
    torch.save(checkpoint, tmp_path / "ours.torch")
    torch.manual_seed(3)
    fresh = build_model(cfg.MODEL)
    report = load_weights_init(fresh, weights_cfg(tmp_path / "ours.torch"))
    assert not report.missing and not report.unexpected
    assert_same_state(fresh.trunk.state_dict(), state["trunk"])

    script = load_script()
    assert script.main(["to-vissl", str(tmp_path / "ours.torch"), str(tmp_path / "vissl.torch")]) == 0
    vissl = load_checkpoint(tmp_path / "vissl.torch")
    assert is_vissl_checkpoint(vissl)
    assert_same_state(vissl["classy_state_dict"]["base_model"]["model"]["trunk"], state["trunk"])
    assert script.main(["from-vissl", "--trunk", "regnet", str(tmp_path / "vissl.torch"),
                        str(tmp_path / "back.torch")]) == 0
    back = load_checkpoint(tmp_path / "back.torch")["classy_state_dict"]["base_model"]["model"]
    assert_same_state(back["trunk"], state["trunk"])
