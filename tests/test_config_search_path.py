"""A user's own configs outside the engine's configs/ tree, used from a folder outside the
checkout: ``config=<path to a .yaml>``, and a folder of configs added with
$SSL_ENGINE_CONFIG_PATH or ``hydra.searchpath`` whose files name the engine's configs in
their ``defaults:`` lists."""
import pytest

import ssl_engine.losses  # noqa: F401  (the losses derive their settings)
import ssl_engine.models  # noqa: F401
from ssl_engine.config import ConfigError, compose_config

# a config of the user's own: three epochs of the engine's SimCLR digits quickstart
ON_TOP_OF_QUICKSTART = """# @package _global_
defaults:
  - /config/quickstart/simclr_digits
  - _self_
config:
  OPTIMIZER:
    num_epochs: 3
"""
STANDALONE = """# @package _global_
config:
  OPTIMIZER:
    num_epochs: 7
"""


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A working folder outside the checkout, holding my_run.yaml and my_configs/config/."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SSL_ENGINE_CONFIG_PATH", raising=False)
    (tmp_path / "my_run.yaml").write_text(STANDALONE)
    (tmp_path / "my_configs" / "config" / "mine").mkdir(parents=True)
    (tmp_path / "my_configs" / "config" / "mine" / "simclr_3ep.yaml").write_text(
        ON_TOP_OF_QUICKSTART)
    return tmp_path


def test_a_yaml_file_anywhere_is_a_config(elsewhere):
    _, cfg = compose_config([f"config={elsewhere / 'my_run.yaml'}"])
    assert cfg.OPTIMIZER.num_epochs == 7
    _, cfg = compose_config(["config=my_run.yaml", "config.OPTIMIZER.num_epochs=2"])
    assert cfg.OPTIMIZER.num_epochs == 2  # relative to the current folder; overrides still win


def test_a_yaml_file_can_build_on_an_engine_config(elsewhere):
    _, quickstart = compose_config(["config=quickstart/simclr_digits"])
    _, cfg = compose_config(["config=./my_configs/config/mine/simclr_3ep.yaml"])
    assert cfg.OPTIMIZER.num_epochs == 3 and quickstart.OPTIMIZER.num_epochs != 3
    assert cfg.LOSS.name == quickstart.LOSS.name and cfg.DATA.TRAIN == quickstart.DATA.TRAIN


def test_a_folder_on_the_search_path_adds_its_configs(elsewhere, monkeypatch):
    with pytest.raises(ConfigError, match="Could not find 'config/mine/simclr_3ep'.*"
                                          "SSL_ENGINE_CONFIG_PATH or hydra.searchpath"):
        compose_config(["config=mine/simclr_3ep"])
    _, by_hydra = compose_config(["config=mine/simclr_3ep",
                                  f"hydra.searchpath=[file://{elsewhere / 'my_configs'}]"])
    monkeypatch.setenv("SSL_ENGINE_CONFIG_PATH", "my_configs")
    _, by_env = compose_config(["config=mine/simclr_3ep"])
    assert by_env == by_hydra and by_env.OPTIMIZER.num_epochs == 3
    assert by_env.LOSS.name == "simclr_info_nce_loss"  # from the engine's quickstart
    _, engine_own = compose_config(["config=quickstart/simclr_digits"])  # still found
    assert engine_own.OPTIMIZER.num_epochs != 3


def test_bad_paths_are_refused_in_one_line(elsewhere, monkeypatch):
    with pytest.raises(ConfigError, match=r"^config=/no/such/run.yaml: no such file "):
        compose_config(["config=/no/such/run.yaml"])
    (elsewhere / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="the file must hold a mapping of keys"):
        compose_config(["config=list.yaml"])
    (elsewhere / "broken.yaml").write_text("config:\n  OPTIMIZER: [\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not a readable YAML file: .*\(line 3"):
        compose_config(["config=broken.yaml"])
    (elsewhere / "typo.yaml").write_text("defaults:\n  - /config/quickstart/simclr_digit\n")
    with pytest.raises(ConfigError, match=rf"^In {elsewhere / 'typo.yaml'}: Could not load "
                                          "'config/quickstart/simclr_digit'"):
        compose_config(["config=typo.yaml"])
    monkeypatch.setenv("SSL_ENGINE_CONFIG_PATH", str(elsewhere))  # no config/ folder in it
    with pytest.raises(ConfigError, match="has no config/ folder: put your configs in"):
        compose_config(["config=quickstart/simclr_digits"])


def test_an_engine_config_name_with_its_suffix_still_names_it(elsewhere):
    _, with_suffix = compose_config(["config=quickstart/simclr_digits.yaml"])
    _, plain = compose_config(["config=quickstart/simclr_digits"])
    assert with_suffix == plain
