"""VISSL's GPU configs on a CPU (SyncBN, apex AMP, FORCE_SYNC_CUDA), the keys VISSL's own files
carry but VISSL never read, FSDP-wrapped names in TEMP_FROZEN_PARAMS_ITER_MAP, and the model
settings VISSL's linear evaluations write (a stage pooled twice, eval_mlp over a pooled map,
swav_head without prototypes)."""
import copy
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import ssl_engine.losses  # noqa: F401  (the losses derive their settings: derive_config)
from ssl_engine.config import ConfigError, compose_config, derive_settings
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.hooks.frozen_params_hook import parse_frozen_params
from ssl_engine.models import build_model
from ssl_engine.models.heads.eval_mlp import EvalMLP
from ssl_engine.models.heads.swav_head import SwAVPrototypesHead

REPO = Path(__file__).resolve().parents[1]
QUICK = "config=test/quick_simclr_synthetic"
CPU = "config.MACHINE.DEVICE=cpu"


def _compose(tmp_path, monkeypatch, body: str, *overrides: str):
    """Compose ``body`` (the text under ``config:``) as a VISSL file over QUICK."""
    configs = tmp_path / "configs" / "config"
    (configs / "test").mkdir(parents=True)
    (configs / "vissl").mkdir()
    (configs / "defaults.yaml").write_text((REPO / "configs/config/defaults.yaml").read_text())
    quick = REPO / "configs/config/test/quick_simclr_synthetic.yaml"
    (configs / "test/quick_simclr_synthetic.yaml").write_text(quick.read_text())
    (configs / "vissl/extra.yaml").write_text(f"# @package _global_\nconfig:\n{body}\n")
    monkeypatch.setenv("SSL_ENGINE_CONFIG_DIR", str(tmp_path / "configs"))
    return compose_config([QUICK, "+config/vissl=extra", *overrides])[1]


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def test_gpu_settings_on_a_cpu_run_are_rewritten_with_one_warning_each(tmp_path, monkeypatch,
                                                                        caplog):
    body = ("  MODEL:\n"
            "    SYNC_BN_CONFIG: {CONVERT_BN_TO_SYNC_BN: true, SYNC_BN_TYPE: apex}\n"
            "    AMP_PARAMS: {USE_AMP: true, AMP_TYPE: apex, AMP_ARGS: {opt_level: O1, "
            "loss_scale: dynamic}}\n"
            "    FSDP_CONFIG: {FORCE_SYNC_CUDA: true}")
    with caplog.at_level("WARNING", logger="ssl_engine.config"):
        cfg = _compose(tmp_path, monkeypatch, body, CPU)
    assert cfg.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE == "all_reduce"
    assert cfg.MODEL.AMP_PARAMS.AMP_TYPE == "pytorch"
    assert dict(cfg.MODEL.AMP_PARAMS.AMP_ARGS) == {}
    assert cfg.MODEL.FSDP_CONFIG.FORCE_SYNC_CUDA is False
    warnings = _warnings(caplog)
    assert len(warnings) == 4, warnings
    assert warnings[0].startswith("config.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE=apex is for GPUs "
                                  "(apex refuses CPU tensors): on this CPU run")
    assert "synchronised with all_reduce" in warnings[0]
    assert warnings[1].startswith("config.MODEL.AMP_PARAMS.AMP_TYPE=apex needs CUDA")
    assert warnings[2].startswith("config.MODEL.AMP_PARAMS.AMP_ARGS opt_level, loss_scale: "
                                  "only apex read these")
    assert "FORCE_SYNC_CUDA=true has no effect on a CPU run" in warnings[3]


def test_sync_bn_types_per_device(tmp_path, monkeypatch, caplog):
    body = "  MODEL: {SYNC_BN_CONFIG: {CONVERT_BN_TO_SYNC_BN: true, SYNC_BN_TYPE: pytorch}}"
    with caplog.at_level("WARNING", logger="ssl_engine.config"):
        cfg = _compose(tmp_path, monkeypatch, body, CPU)
    assert cfg.MODEL.SYNC_BN_CONFIG.SYNC_BN_TYPE == "all_reduce"
    assert len(_warnings(caplog)) == 1
    assert "torch's SyncBatchNorm refuses CPU tensors" in _warnings(caplog)[0]
    from ssl_engine.config.gpu_settings import adapt_gpu_settings

    gpu = {"config": {"MACHINE": {"DEVICE": "gpu"}, "MODEL": {"SYNC_BN_CONFIG": {
        "CONVERT_BN_TO_SYNC_BN": True, "SYNC_BN_TYPE": "apex"}}}}
    assert len(adapt_gpu_settings(gpu)) == 1
    assert gpu["config"]["MODEL"]["SYNC_BN_CONFIG"]["SYNC_BN_TYPE"] == "pytorch"
    off = {"config": {"MACHINE": {"DEVICE": "cpu"}, "MODEL": {"SYNC_BN_CONFIG": {
        "CONVERT_BN_TO_SYNC_BN": False, "SYNC_BN_TYPE": "pytorch"}}}}
    assert adapt_gpu_settings(off) == []  # not converted: nothing to say
    # on GPUs FORCE_SYNC_CUDA is still refused by name
    with pytest.raises(ConfigError, match="FORCE_SYNC_CUDA=True is not supported"):
        compose_config([QUICK, "config.MACHINE.DEVICE=gpu",
                        "config.MODEL.FSDP_CONFIG.FORCE_SYNC_CUDA=true"])


def test_keys_vissl_never_read_are_dropped_with_a_warning_and_typos_refused(
        tmp_path, monkeypatch, caplog):
    body = ("  MODEL: {WEIGHTS_INIT: {PARAM_FILE: /weights.torch}}\n"
            "  LOSS: {simclr_info_nce_loss: {temperature: 0.2}, swav_loss: {shk_powerlaw: true},"
            " dino_loss: {normalize_last_layer: true}}")
    with caplog.at_level("WARNING", logger="ssl_engine.config"):
        cfg = _compose(tmp_path, monkeypatch, body, CPU)
    assert "normalize_last_layer" not in cfg.LOSS.dino_loss
    assert "PARAM_FILE" not in cfg.MODEL.WEIGHTS_INIT and cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE == ""
    assert "shk_powerlaw" not in cfg.LOSS.swav_loss
    warnings = sorted(_warnings(caplog))  # the general table's keys, then the components'
    assert len(warnings) == 3, warnings
    assert warnings[0].startswith("config.LOSS.dino_loss.normalize_last_layer is ignored: VISSL "
                                  "never read this key")
    assert warnings[0].endswith("the engine ignores it too (delete it to silence this)")
    assert warnings[1].startswith("config.LOSS.swav_loss.shk_powerlaw is ignored")
    assert warnings[2] == (
        "config.MODEL.WEIGHTS_INIT.PARAM_FILE is ignored: a misspelling of "
        "MODEL.WEIGHTS_INIT.PARAMS_FILE: VISSL loaded no weights from it (write PARAMS_FILE to "
        "load them); the engine ignores it too (delete it to silence this)")
    with pytest.raises(ConfigError, match="unknown config key 'config.OPTIMIZER.exclude_bias_"
                                          "and_norms': did you mean"):
        _compose(tmp_path / "typo", monkeypatch, "  OPTIMIZER: {exclude_bias_and_norms: true}")


def test_lars_settings_given_to_another_optimizer_are_ignored_with_a_warning(
        tmp_path, monkeypatch, caplog):
    # VISSL's lars optimizer reads OPTIMIZER.eta and exclude_bias_and_norm; its sgd did not
    with caplog.at_level("WARNING", logger="ssl_engine.config"):
        cfg = derive_settings(_compose(tmp_path, monkeypatch,
                                       "  OPTIMIZER: {exclude_bias_and_norm: true}", CPU))
    assert cfg.OPTIMIZER.name == "sgd" and cfg.OPTIMIZER.exclude_bias_and_norm is True
    assert _warnings(caplog) == ["config.OPTIMIZER.exclude_bias_and_norm=True is read by the "
                                 "lars optimizer only: the sgd optimizer ignores it (as VISSL's "
                                 "did)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="ssl_engine.config"):
        derive_settings(_compose(tmp_path / "lars", monkeypatch,
                                 "  OPTIMIZER: {name: lars, exclude_bias_and_norm: true}", CPU))
    assert _warnings(caplog) == []


def test_fsdp_wrapped_names_are_the_plain_names_and_checked_before_launch(tmp_path, capsys):
    assert parse_frozen_params([
        ["module._fsdp_wrapped_module._fpw_module.heads.0._fsdp_wrapped_module.prototypes0."
         "weight", 3],
        ["_fsdp_wrapped_module.heads.0.prototypes1.weight", 2],
        ["module.heads.0.module.x", 1]]) == {
        "heads.0.prototypes0.weight": 3, "heads.0.prototypes1.weight": 2, "heads.0.module.x": 1}
    from ssl_engine.engines.launcher import main

    code = main([QUICK, f"config.CHECKPOINT.DIR={tmp_path}",
                 "config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP=[[module._fsdp_wrapped_module."
                 "heads.0.clf.0.weigth,2]]"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "error: config.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP names 'heads.0.clf.0.weigth', which is "
        "not a parameter of the model; did you mean 'heads.0.clf.0.weight'?")
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------ model settings
with open(REPO / "configs/config/defaults.yaml") as f:
    MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])


def test_a_stage_pooled_twice_feeds_one_head_per_entry():
    """VISSL's linear evaluations list a stage twice, pooled two ways, each with its head."""
    cfg = copy.deepcopy(MODEL_CFG)
    cfg.TRUNK.RESNETS.update(DEPTH=18, WIDTH_MULTIPLIER=0.25, SMALL_IMAGE_STEM=True)
    cfg.HEAD.PARAMS = [["eval_mlp", {"in_channels": 64, "dims": [128, 3]}],
                       ["eval_mlp", {"in_channels": 64, "dims": [128, 3]}],
                       ["eval_mlp", {"in_channels": 128, "dims": [128, 3]}]]
    cfg.FEATURE_EVAL_SETTINGS.update(EVAL_MODE_ON=True, LINEAR_EVAL_FEAT_POOL_OPS_MAP=[
        ["res4", ["AdaptiveAvgPool2d", [[2, 1]]]], ["res4", ["AdaptiveAvgPool2d", [[1, 2]]]],
        ["res5avg", ["Identity", []]]])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        outputs = model(x)
        res4, res5avg = model.trunk(x, ["res4", "res5avg"])
        pooled = [nn.functional.adaptive_avg_pool2d(res4, (2, 1)).flatten(1),
                  nn.functional.adaptive_avg_pool2d(res4, (1, 2)).flatten(1), res5avg]
        expected = [head(feature) for head, feature in zip(model.heads, pooled)]
    assert not torch.allclose(pooled[0], pooled[1])
    assert len(outputs) == 3
    for output, reference in zip(outputs, expected):
        torch.testing.assert_close(output, reference)
    cfg.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY = True  # features named by stage
    with pytest.raises(ValueError, match="lists res4 2 times"):  # one res4 would replace the other
        build_model(cfg)


@pytest.mark.parametrize("train_mode", [True, False])
def test_eval_mlp_over_a_pooled_map_is_batchnorm2d_then_linear(train_mode):
    """dims[0] = in_channels x positions: VISSL's BatchNorm2d over [N, C, H, W], flattened."""
    torch.manual_seed(0)
    head = EvalMLP(in_channels=3, dims=[12, 5])
    reference = nn.Sequential(nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 5))
    with torch.no_grad():
        head.channel_bn.weight.uniform_(0.5, 2.0)
        head.channel_bn.bias.uniform_(-1.0, 1.0)
        head.channel_bn.running_var.uniform_(0.5, 2.0)
    reference.load_state_dict({"0." + k: v for k, v in head.channel_bn.state_dict().items()}
                              | {"2." + k: v for k, v in head.mlp.clf[0].state_dict().items()})
    head.train(train_mode)
    reference.train(train_mode)
    x = torch.randn(6, 3, 2, 2)
    torch.testing.assert_close(head(x), reference(x))
    torch.testing.assert_close(head(x.flatten(1)), reference(x))
    torch.testing.assert_close(head.channel_bn.running_mean, reference[0].running_mean)
    with pytest.raises(ValueError, match=r"expects 12 input features \(in_channels=3 x 4 "
                                         r"positions\), got 9"):
        head(torch.randn(2, 9))
    with pytest.raises(ValueError, match=r"dims must start with in_channels=3, got dims=\[10, 5\]"):
        EvalMLP(in_channels=3, dims=[10, 5])


def test_swav_head_without_prototypes_outputs_its_embedding():
    torch.manual_seed(0)
    head = SwAVPrototypesHead(dims=[8, 6, 4], use_bn=False, num_clusters=[])
    x = torch.randn(5, 8)
    (embedding,) = head(x)
    expected = nn.functional.normalize(head.projection_head(x), dim=1)
    torch.testing.assert_close(embedding, expected)
    assert head.num_outputs == 1 and not list(head.prototype_layers())
    with pytest.raises(ValueError, match="needs return_embeddings: true"):
        SwAVPrototypesHead(dims=[8, 4], num_clusters=[], return_embeddings=False)
