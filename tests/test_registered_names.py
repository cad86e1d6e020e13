"""Every registered name a config refers to is checked before any process starts, with one
line naming the key, the bad value and the closest registered name."""
import copy

import pytest

from ssl_engine.config import ConfigError, load_config
from ssl_engine.engines.launcher import main
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.engines.registered_names import nearest_registered

QUICK = "config=test/quick_simclr_synthetic"


@pytest.fixture(scope="module")
def quick_cfg():
    return load_config([QUICK])[1]


def set_key(cfg, path, value):
    *parents, last = path.split(".")
    for part in parents:
        cfg = cfg[int(part)] if part.isdigit() else cfg[part]
    if last.isdigit():
        cfg[int(last)] = value
    else:
        cfg[last] = value


@pytest.mark.parametrize("path, value, message", [
    ("DATA.TRAIN.COLLATE_FUNCTION", "default_collator",
     "config.DATA.TRAIN.COLLATE_FUNCTION=default_collator: no collator is registered under this "
     "name; the closest registered one is 'default_collate'"),
    ("OPTIMIZER.name", "sgdm", "config.OPTIMIZER.name=sgdm: no optimizer is registered "
                               "under this name; the closest registered one is 'sgd'"),
    ("DATA.TRAIN.TRANSFORMS.2.name", "RandomHorizontalFlp",
     "config.DATA.TRAIN.TRANSFORMS[2].name=RandomHorizontalFlp: no transform is registered under "
     "this name; the closest registered one is 'RandomHorizontalFlip'"),
    ("DATA.TRAIN.DATA_SOURCES.0", "synthtic", "config.DATA.TRAIN.DATA_SOURCES[0]=synthtic: "
                                              "no data source"),
    ("LOSS.name", "simclr_loss", "the closest registered one is 'simclr_info_nce_loss'"),
    ("OPTIMIZER.param_schedulers.lr.name", "cosin",
     "config.OPTIMIZER.param_schedulers.lr.name=cosin: no param scheduler"),
    ("MODEL.TRUNK.NAME", "resnt", "config.MODEL.TRUNK.NAME=resnt: no model trunk"),
    ("MODEL.HEAD.PARAMS.0.0", "mpl", "config.MODEL.HEAD.PARAMS[0][0]=mpl: no model head is "
                                     "registered under this name; the closest registered one is 'mlp'"),
    ("METERS.names", ["accuracy_list"], "config.METERS.names[0]=accuracy_list: no meter is "
     "registered under this name; the closest registered one is 'accuracy_list_meter'"),
    ("TRAINER.TRAIN_STEP_NAME", "standard_step", "config.TRAINER.TRAIN_STEP_NAME=standard_step"),
    ("TRAINER.TASK_NAME", "ssl_task", "config.TRAINER.TASK_NAME=ssl_task: no task"),
])
def test_an_unknown_name_is_refused_before_launch_in_one_line(quick_cfg, tmp_path, path, value,
                                                              message):
    cfg = copy.deepcopy(quick_cfg)
    cfg.CHECKPOINT.DIR = str(tmp_path)
    set_key(cfg, path, value)
    with pytest.raises(ConfigError) as refused:
        check_before_launch("train", cfg)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_nested_scheduler_and_engine_names_are_checked(quick_cfg, tmp_path):
    cfg = copy.deepcopy(quick_cfg)
    cfg.CHECKPOINT.DIR = str(tmp_path)
    with pytest.raises(ConfigError, match="^engine_name=extract_feature: .* 'extract_features'"):
        check_before_launch("extract_feature", cfg)
    cfg.OPTIMIZER.param_schedulers.lr.update(
        name="composite", lengths=[0.5, 0.5], interval_scaling=["rescaled", "fixed"],
        schedulers=[{"name": "linear", "start_value": 0, "end_value": 1},
                    {"name": "cosine_decay", "start_value": 1, "end_value": 0}])
    with pytest.raises(ConfigError, match=r"lr.schedulers\[1\].name=cosine_decay: .* 'cosine'"):
        check_before_launch("train", cfg)


def test_names_registered_by_plugins_count(tmp_path, monkeypatch, capsys):
    """The command line imports $SSL_ENGINE_PLUGINS before the check: the plugin's collator
    passes, and the next bad name is the one reported."""
    monkeypatch.setenv("SSL_ENGINE_PLUGINS", "plugins.pairs_collator")
    status = main([QUICK, f"config.CHECKPOINT.DIR={tmp_path}",
                   "config.DATA.TRAIN.COLLATE_FUNCTION=pairs_collator",
                   "config.OPTIMIZER.name=sgdm"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: config.OPTIMIZER.name=sgdm:")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing started


def test_nearest_registered_always_names_one():
    assert nearest_registered("sgd_fsdp", ["adam", "adamw", "sgd"]) == "sgd"
    assert nearest_registered("Normalise", ["Normalize", "Resize", "ToTensor"]) == "Normalize"
    assert nearest_registered("zzz", ["linear", "step"]) in ("linear", "step")
    assert nearest_registered("x", []) == ""
