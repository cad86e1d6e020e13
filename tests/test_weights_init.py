"""MODEL.WEIGHTS_INIT: loading engine checkpoints and torchvision state dicts, and the report."""
import copy
import logging
from pathlib import Path

import pytest
import torch
import torchvision
import yaml

from engine_utils import run_engine
from ssl_engine.checkpoint import load_checkpoint, load_weights_init
from ssl_engine.config import load_config
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model
from ssl_engine.trainer.task import SelfSupervisionTask

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULTS = AttrDict(yaml.safe_load(f)["config"])


def weights_cfg(params_file, **overrides):
    cfg = copy.deepcopy(DEFAULTS.MODEL.WEIGHTS_INIT)
    cfg.PARAMS_FILE = str(params_file)
    cfg.update(overrides)
    return cfg


def resnet_model(heads, seed=0, **resnet):
    cfg = copy.deepcopy(DEFAULTS.MODEL)
    cfg.TRUNK.RESNETS.update(dict(DEPTH=18), **resnet)
    cfg.HEAD.PARAMS = heads
    torch.manual_seed(seed)
    return build_model(cfg)


def tiny_model(seed=0, heads=(("mlp", {"dims": [64, 8]}),)):
    return resnet_model([list(h) for h in heads], seed, WIDTH_MULTIPLIER=0.125,
                        SMALL_IMAGE_STEM=True)


# ---------------------------------------------------------------- torchvision state dict
@pytest.fixture(scope="module")
def torchvision_resnet18(tmp_path_factory):
    torch.manual_seed(3)
    net = torchvision.models.resnet18(weights=None)
    with torch.no_grad():  # non-trivial batch-norm statistics, so that loading them is checked
        for module in net.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
    path = tmp_path_factory.mktemp("tv") / "resnet18.pth"
    torch.save(net.state_dict(), path)
    return net, path


def test_torchvision_resnet18_loads_into_the_trunk(torchvision_resnet18, caplog):
    net, path = torchvision_resnet18
    tv_state = net.state_dict()
    model = resnet_model([["mlp", {"dims": [512, 10]}]])
    with caplog.at_level(logging.INFO, logger="ssl_engine.checkpoint.weights_init"):
        report = load_weights_init(model, weights_cfg(path, APPEND_PREFIX="trunk."))

    tracked = {f"trunk.{k}" for k in tv_state if k.endswith("num_batches_tracked")}
    assert set(report.loaded) == {f"trunk.{k}" for k in tv_state
                                  if not k.startswith("fc.")} - tracked
    assert set(report.skipped) == tracked
    assert set(report.unexpected) == {"trunk.fc.weight", "trunk.fc.bias"}
    assert set(report.missing) == {"heads.0.clf.0.weight", "heads.0.clf.0.bias"}
    for key in report.loaded:
        assert torch.equal(model.state_dict()[key], tv_state[key[len("trunk."):]]), key

    # independent check: the trunk now computes torchvision's pooled features
    net.fc = torch.nn.Identity()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model.eval().trunk(x, ["res5avg"])[0], net.eval()(x))
    assert "has no key 'classy_state_dict'; using the whole file" in caplog.text
    assert "loaded 100: trunk.conv1.weight" in caplog.text
    assert "unexpected 2: trunk.fc.weight, trunk.fc.bias" in caplog.text
    assert "missing 2: heads.0.clf.0.weight, heads.0.clf.0.bias" in caplog.text


# ---------------------------------------------------------------- small hand-made files
def test_report_of_prefixes_skips_missing_and_unexpected(tmp_path):
    source = tiny_model(seed=1)
    state = {f"module.{k}": v for k, v in source.state_dict().items() if k != "heads.0.clf.0.bias"}
    state["module.extra.weight"] = torch.zeros(3)
    torch.save({"state_dict": state, "epoch": 7}, tmp_path / "w.pth")
    model = tiny_model(seed=2)
    before = copy.deepcopy(model.state_dict())

    report = load_weights_init(model, weights_cfg(
        tmp_path / "w.pth", STATE_DICT_KEY_NAME="state_dict", REMOVE_PREFIX="module.",
        SKIP_LAYERS=["num_batches_tracked", "layer4."]))

    keys = list(source.state_dict())
    skipped = {k for k in keys if "num_batches_tracked" in k or "layer4." in k}
    assert set(report.skipped) == skipped
    assert set(report.loaded) == set(keys) - skipped - {"heads.0.clf.0.bias"}
    assert report.missing == ["heads.0.clf.0.bias"]
    assert report.unexpected == ["extra.weight"]
    after = model.state_dict()
    for key in report.loaded:
        assert torch.equal(after[key], source.state_dict()[key])
    for key in skipped | {"heads.0.clf.0.bias"}:
        assert torch.equal(after[key], before[key])
    assert not torch.equal(before["trunk.conv1.weight"], after["trunk.conv1.weight"])


def test_shape_mismatch_names_the_key_and_both_shapes(tmp_path):
    torch.save(tiny_model(heads=[["mlp", {"dims": [64, 5]}]]).state_dict(), tmp_path / "w.pth")
    model = tiny_model(heads=[["mlp", {"dims": [64, 8]}]])
    before = copy.deepcopy(model.state_dict())
    message = (r"heads.0.clf.0.weight: file \(5, 64\) vs model \(8, 64\); "
               r"heads.0.clf.0.bias: file \(5,\) vs model \(8,\)")
    with pytest.raises(ValueError, match=message):
        load_weights_init(model, weights_cfg(tmp_path / "w.pth"))
    for key, value in model.state_dict().items():  # nothing was half-loaded
        assert torch.equal(value, before[key])


def test_a_list_state_dict_key_name_is_the_path_of_keys_into_the_file(tmp_path):
    # VISSL's form, e.g. iBOT's teacher: STATE_DICT_KEY_NAME: ["loss", "teacher"]
    source = tiny_model(seed=1)
    torch.save({"loss": {"teacher": source.state_dict(), "center": torch.zeros(3)},
                "classy_state_dict": {}}, tmp_path / "w.pth")
    model = tiny_model(seed=2)
    report = load_weights_init(model, weights_cfg(tmp_path / "w.pth",
                                                  STATE_DICT_KEY_NAME=["loss", "teacher"]))
    weights = {k: v for k, v in source.state_dict().items() if "num_batches" not in k}
    assert set(report.loaded) == set(weights)  # SKIP_LAYERS: num_batches_tracked
    for key, value in weights.items():
        assert torch.equal(model.state_dict()[key], value)
    from ssl_engine.config import compose_config
    from ssl_engine.utils.errors import ConfigError

    _, cfg = compose_config(["config=test/quick_simclr_synthetic",
                             "config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME=[loss,teacher]"])
    assert list(cfg.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME) == ["loss", "teacher"]
    with pytest.raises(ConfigError, match="STATE_DICT_KEY_NAME' expects a str"):
        compose_config(["config=test/quick_simclr_synthetic",
                        "config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME=[loss,3]"])


def test_missing_file_is_named(tmp_path):
    missing = tmp_path / "nope.torch"
    with pytest.raises(FileNotFoundError, match=f"PARAMS_FILE {missing} does not exist"):
        load_weights_init(tiny_model(), weights_cfg(missing))


# ---------------------------------------------------------------- engine checkpoints
@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    """Two epochs of the tiny SimCLR config: model_phase0.torch and the final checkpoint."""
    folder = tmp_path_factory.mktemp("pretrain")
    cfg = run_engine(folder)
    return folder, cfg


def flat_model_state(path):
    model = load_checkpoint(path)["classy_state_dict"]["base_model"]["model"]
    return {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in model[part].items()}


def test_engine_checkpoint_loads_trunk_and_heads(engine_run):
    folder, cfg = engine_run
    path = folder / "checkpoint.torch"
    expected = flat_model_state(path)
    torch.manual_seed(5)
    model = build_model(cfg.MODEL)
    report = load_weights_init(model, weights_cfg(path))
    tracked = {k for k in expected if k.endswith("num_batches_tracked")}
    assert set(report.loaded) == set(expected) - tracked and report.loaded
    assert set(report.skipped) == tracked
    assert report.missing == [] and report.unexpected == []
    for key in report.loaded:
        assert torch.equal(model.state_dict()[key], expected[key]), key


def test_engine_checkpoint_into_a_linear_eval_model_skips_the_heads(engine_run):
    folder, _ = engine_run
    path = folder / "checkpoint.torch"
    expected = flat_model_state(path)
    model = tiny_model(heads=[["eval_mlp", {"in_channels": 64, "dims": [64, 4]}]])
    report = load_weights_init(model, weights_cfg(
        path, SKIP_LAYERS=["num_batches_tracked", "heads."]))
    assert set(report.skipped) == {k for k in expected
                                   if k.startswith("heads.") or k.endswith("num_batches_tracked")}
    trunk_keys = {k for k in expected if k.startswith("trunk.")}
    assert set(report.loaded) == trunk_keys - set(report.skipped)
    assert set(report.missing) == {k for k in model.state_dict() if k.startswith("heads.")}
    assert report.unexpected == []


def test_task_applies_weights_init_unless_resuming(engine_run):
    folder, _ = engine_run
    _, cfg = load_config([
        "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={folder}",
        f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={folder / 'model_phase0.torch'}",
    ])
    phase0 = flat_model_state(folder / "model_phase0.torch")
    final_path = folder / "checkpoint.torch"
    final = flat_model_state(final_path)
    assert not torch.equal(phase0["trunk.conv1.weight"], final["trunk.conv1.weight"])

    fresh = SelfSupervisionTask(cfg, torch.device("cpu"))
    fresh.prepare(checkpoint=None)
    assert torch.equal(fresh.base_model.trunk.conv1.weight, phase0["trunk.conv1.weight"])

    resumed = SelfSupervisionTask(cfg, torch.device("cpu"))
    resumed.prepare(checkpoint=load_checkpoint(final_path))
    assert torch.equal(resumed.base_model.trunk.conv1.weight, final["trunk.conv1.weight"])
