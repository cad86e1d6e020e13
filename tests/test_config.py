"""Config composition, validation messages and derived settings."""
import subprocess
import sys
from pathlib import Path

import pytest

import ssl_engine.losses  # noqa: F401  (the losses derive their settings: derive_config)
from ssl_engine.config import ConfigError, compose_config, load_config
from ssl_engine.config.derive import derive_settings
from ssl_engine.models.trunks import check_trunk_config

REPO = Path(__file__).resolve().parents[1]
QUICK = "config=test/quick_simclr_synthetic"


def test_compose_picks_file_then_overrides():
    engine, cfg = compose_config([QUICK, "config.OPTIMIZER.num_epochs=3"])
    assert engine == "train"
    assert cfg.OPTIMIZER.num_epochs == 3  # command line beats the file
    assert cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA == 8  # the file beats the defaults
    assert cfg.OPTIMIZER.nesterov is False  # untouched defaults stay
    assert cfg.DATA.TRAIN.TRANSFORMS[0].name == "ImgReplicatePil"  # attribute access in lists


def test_engine_name_override():
    engine, _ = compose_config([QUICK, "engine_name=extract_features"])
    assert engine == "extract_features"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("config.OPTIMIZER.num_epoch=3",
         "unknown config key 'config.OPTIMIZER.num_epoch': "
         "did you mean 'config.OPTIMIZER.num_epochs'?"),
        ("config.DATA.TRAIN.BATCHSIZE_PER_REPLIKA=4",
         "did you mean 'config.DATA.TRAIN.BATCHSIZE_PER_REPLICA'?"),
        ("config.LOSS.simclr_info_nce_loss.temprature=2",
         "did you mean 'config.LOSS.simclr_info_nce_loss.temperature'?"),
    ],
)
def test_typo_names_closest_key(override, expected):
    with pytest.raises(ConfigError) as err:
        compose_config([QUICK, override])
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("config.OPTIMIZER.num_epochs=abc",
         "config key 'config.OPTIMIZER.num_epochs' expects an int like 90, got 'abc'"),
        ("config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=1.5",
         "config key 'config.DATA.TRAIN.BATCHSIZE_PER_REPLICA' expects an int"),
        ("config.TEST_MODEL=3", "config key 'config.TEST_MODEL' expects a bool"),
        ("config.DATA.TRAIN.DATA_PATHS=/x", "config key 'config.DATA.TRAIN.DATA_PATHS' expects a list"),
    ],
)
def test_wrong_type_is_refused(override, expected):
    with pytest.raises(ConfigError) as err:
        compose_config([QUICK, override])
    assert expected in str(err.value)


def test_int_accepted_for_float_key():
    _, cfg = compose_config([QUICK, "config.OPTIMIZER.weight_decay=0"])
    assert cfg.OPTIMIZER.weight_decay == 0


def test_unknown_key_in_config_file(tmp_path, monkeypatch):
    configs = tmp_path / "configs" / "config"
    (configs / "mine").mkdir(parents=True)
    (configs / "defaults.yaml").write_text((REPO / "configs/config/defaults.yaml").read_text())
    (configs / "mine" / "bad.yaml").write_text(
        "# @package _global_\nconfig:\n  OPTIMIZER:\n    nesterv: true\n")
    monkeypatch.setenv("SSL_ENGINE_CONFIG_DIR", str(tmp_path / "configs"))
    with pytest.raises(ConfigError, match="'config.OPTIMIZER.nesterv': did you mean "
                                          "'config.OPTIMIZER.nesterov'"):
        compose_config(["config=mine/bad"])


def test_defaults_are_parsed_once_per_version_of_the_file(tmp_path, monkeypatch):
    """defaults.yaml is cached (start-up): a caller's changes to what it got do not leak into
    the next load, and an edited file is read again."""
    from ssl_engine.config.compose import load_defaults

    configs = tmp_path / "configs" / "config"
    configs.mkdir(parents=True)
    text = (REPO / "configs/config/defaults.yaml").read_text()
    (configs / "defaults.yaml").write_text(text)
    monkeypatch.setenv("SSL_ENGINE_CONFIG_DIR", str(tmp_path / "configs"))
    first = load_defaults()
    assert first["config"]["SEED_VALUE"] == 0
    first["config"]["SEED_VALUE"] = 123
    assert load_defaults()["config"]["SEED_VALUE"] == 0
    (configs / "defaults.yaml").write_text(text.replace("SEED_VALUE: 0", "SEED_VALUE: 7", 1))
    assert load_defaults()["config"]["SEED_VALUE"] == 7
    assert compose_config([])[1].SEED_VALUE == 7


def test_missing_config_file_is_named():
    with pytest.raises(ConfigError, match="config/nope/missing"):
        compose_config(["config=nope/missing"])


def test_open_sections_accept_new_keys():
    _, cfg = compose_config([QUICK, "+config.DATA.TRAIN.COLLATE_FUNCTION_PARAMS.foo=2",
                             "+config.LOSS.my_loss.alpha=0.5"])
    assert cfg.DATA.TRAIN.COLLATE_FUNCTION_PARAMS.foo == 2
    assert cfg.LOSS.my_loss.alpha == 0.5


def test_bad_choice_and_device():
    _, cfg = compose_config([QUICK, "config.MACHINE.DEVICE=tpu"])
    with pytest.raises(ConfigError, match="config.MACHINE.DEVICE='tpu' is not one of cpu, gpu"):
        derive_settings(cfg)


def test_nccl_on_a_cpu_run_uses_gloo_with_a_warning(caplog):
    _, cfg = compose_config([QUICK, "config.DISTRIBUTED.BACKEND=nccl", "config.MACHINE.DEVICE=cpu"])
    with caplog.at_level("WARNING", logger="ssl_engine.config.derive"):
        derive_settings(cfg)
    assert cfg.DISTRIBUTED.BACKEND == "gloo"
    assert [r.getMessage() for r in caplog.records] == [
        "config.DISTRIBUTED.BACKEND=nccl needs GPUs; this run has config.MACHINE.DEVICE=cpu "
        "and uses gloo instead"]


def test_derived_backend_and_absolute_dir():
    _, cfg = load_config([QUICK, "config.CHECKPOINT.DIR=relative/dir"])
    assert cfg.DISTRIBUTED.BACKEND == "gloo"
    assert Path(cfg.CHECKPOINT.DIR).is_absolute()


def test_every_default_key_has_a_comment():
    lines = (REPO / "configs/config/defaults.yaml").read_text().splitlines()
    keyed = [ln for ln in lines if ":" in ln and not ln.lstrip().startswith(("#", "-"))
             and ln.strip() not in ("config:", "defaults:")]
    missing = [ln for ln in keyed if "#" not in ln and not ln.rstrip().endswith(":")]
    assert not missing, f"keys without a comment: {missing}"


def test_command_line_error_exits_nonzero_with_one_message(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"), QUICK,
         "config.OPTIMIZER.num_epoch=3", f"config.CHECKPOINT.DIR={tmp_path}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )
    assert proc.returncode == 2
    assert "did you mean 'config.OPTIMIZER.num_epochs'?" in proc.stderr
    assert "Traceback" not in proc.stderr


def shipped_configs():
    root = REPO / "configs" / "config"
    return sorted(str(path.relative_to(root).with_suffix("")) for path in root.rglob("*.yaml")
                  if path.name != "defaults.yaml" and path.relative_to(root).parts[0] != "exp")


def test_every_shipped_config_composes_and_every_recipe_builds():
    """Every file under configs/config is a valid config; every pretraining recipe's and
    linear-evaluation config's model builds (on the meta device: no memory) and its loss
    accepts that model."""
    import torch

    from ssl_engine.losses import build_loss
    from ssl_engine.models import build_model

    names = shipped_configs()
    assert "quickstart/simclr_digits" in names and "pretrain/swav/swav_resnet50" in names
    for name in names:
        _, cfg = compose_config([f"config={name}"])
        if name.startswith(("pretrain/", "benchmark/linear_image_classification/")):
            with torch.device("meta"):
                model = build_model(cfg.MODEL)
                loss = build_loss(cfg.LOSS)
                if hasattr(loss, "bind_model"):
                    loss.bind_model(model)


def test_multi_processing_method_is_checked_and_logged_when_not_the_default(caplog):
    _, cfg = compose_config([QUICK, "config.MULTI_PROCESSING_METHOD=fork"])
    with caplog.at_level("INFO", logger="ssl_engine.config.derive"):
        derive_settings(cfg)
    assert "config.MULTI_PROCESSING_METHOD=fork: the engine starts its processes with forkserver" \
        in caplog.text
    _, cfg = compose_config([QUICK, "config.MULTI_PROCESSING_METHOD=threads"])
    with pytest.raises(ConfigError, match="MULTI_PROCESSING_METHOD='threads' is not one of"):
        derive_settings(cfg)


def test_every_label_type_the_dataset_reads_passes_the_config_check():
    from ssl_engine.data.ssl_dataset import LABEL_TYPES

    for label_type in LABEL_TYPES:
        _, cfg = compose_config([QUICK, f"config.DATA.TRAIN.LABEL_TYPE={label_type}",
                                 f"config.DATA.TEST.LABEL_TYPE={label_type}"])
        derive_settings(cfg)


def test_swav_sizes_without_a_queue_follow_the_head_as_vissl_ignored_them(caplog):
    """VISSL's swav_loss sized only its queue with num_prototypes and embedding_dim: without a
    queue values unlike the head's ran (its iNaturalist ablations, its heads files); with one
    they are refused later, by the loss."""
    swav = "config=test/quick_swav_synthetic"
    overrides = ["config.LOSS.swav_loss.num_prototypes=[3000]",
                 "config.LOSS.swav_loss.embedding_dim=128"]
    with caplog.at_level("WARNING", logger="ssl_engine.config.derive"):
        _, cfg = compose_config([swav, *overrides, "config.LOSS.swav_loss.queue.queue_length=0"])
        derive_settings(cfg)
    assert list(cfg.LOSS.swav_loss.num_prototypes) == [10]
    assert cfg.LOSS.swav_loss.embedding_dim == 16 and "embedding_dim=128 differs" in caplog.text
    assert "num_prototypes=[3000] differs from the swav_head's ([10])" in caplog.text
    _, cfg = compose_config([swav, *overrides])
    derive_settings(cfg)
    assert list(cfg.LOSS.swav_loss.num_prototypes) == [3000]
    assert cfg.LOSS.swav_loss.embedding_dim == 128


def test_a_regnet_preset_beside_parameters_builds_the_preset_with_one_warning(caplog):
    """VISSL built a RegNet preset from its name alone (its instance-retrieval model files name
    a preset over a base that gives depth, widths and block type): the parameters are cleared
    and named once; a preset alone stays silent."""
    regnet = [QUICK, "config.MODEL.TRUNK.NAME=regnet",
              "config.MODEL.TRUNK.REGNET.name=regnet_y_400mf"]
    with caplog.at_level("WARNING", logger="ssl_engine.config.derive"):
        _, cfg = compose_config([*regnet, "config.MODEL.TRUNK.REGNET.depth=27",
                                 "config.MODEL.TRUNK.REGNET.w_0=1744",
                                 "config.MODEL.TRUNK.REGNET.block_type=res_basic_block",
                                 "config.MODEL.TRUNK.REGNET.stage_checkpoints=[[2],[7],[]]"])
        derive_settings(cfg)
    assert cfg.MODEL.TRUNK.REGNET.depth is None and cfg.MODEL.TRUNK.REGNET.w_0 is None
    assert cfg.MODEL.TRUNK.REGNET.block_type == "res_bottleneck_block"
    assert cfg.MODEL.TRUNK.REGNET.stage_checkpoints == []
    check_trunk_config(cfg.MODEL)  # the refusal of the two together no longer applies
    assert [r.getMessage() for r in caplog.records] == [
        "config.MODEL.TRUNK.REGNET: depth=27, w_0=1744, stage_checkpoints=[[2], [7], []], "
        "block_type='res_basic_block' ignored: "
        "name='regnet_y_400mf' is a preset that sets the whole network (VISSL built it from "
        "the name alone too); set name to null to build from the parameters"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="ssl_engine.config.derive"):
        _, cfg = compose_config(regnet)
        derive_settings(cfg)
    assert caplog.records == []


def test_a_test_only_config_without_train_data_extracts_its_test_split():
    """VISSL's task of a TEST_ONLY config had the TEST split alone (its geolocalization files
    name no TRAIN data): extraction takes TEST; with TRAIN data both splits stay."""
    test_only = [QUICK, "config.TEST_ONLY=true", "config.TEST_MODEL=true",
                 "config.DATA.TEST.DATA_SOURCES=[synthetic]"]
    _, cfg = compose_config([*test_only, "config.DATA.TRAIN.DATA_SOURCES=[]"])
    derive_settings(cfg)
    assert list(cfg.EXTRACT_FEATURES.SPLITS) == ["TEST"]
    _, cfg = compose_config(test_only)
    derive_settings(cfg)
    assert list(cfg.EXTRACT_FEATURES.SPLITS) == ["TRAIN", "TEST"]
