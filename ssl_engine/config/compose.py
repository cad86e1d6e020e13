"""Compose a run's config with Hydra: defaults.yaml + ``config=<group>/<name>`` + overrides."""
import copy
import functools
import os
from pathlib import Path
from typing import List, Sequence

from omegaconf import DictConfig, OmegaConf

from ssl_engine.utils.errors import ConfigError

_PRIMARY_NAME = "ssl_engine_defaults"


def config_dir() -> Path:
    """The ``configs/`` folder: ``$SSL_ENGINE_CONFIG_DIR`` or the one beside the package."""
    env = os.environ.get("SSL_ENGINE_CONFIG_DIR")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "configs"
    if not (path / "config" / "defaults.yaml").is_file():
        raise ConfigError(f"no config/defaults.yaml under the config folder {path}")
    return path


def load_defaults() -> dict:
    """The schema: configs/config/defaults.yaml as a plain container (a fresh copy; each
    version of the file is parsed once per process)."""
    return copy.deepcopy(_parsed_yaml((config_dir() / "config" / "defaults.yaml").read_text()))


@functools.lru_cache(maxsize=4)
def _parsed_yaml(text: str) -> dict:
    return OmegaConf.to_container(OmegaConf.create(text), resolve=True)


def _hydra_overrides(overrides: Sequence[str]) -> List[str]:
    """``config=<name>`` appends a config group to the defaults list in Hydra's grammar."""
    out = []
    for item in overrides:
        if item.startswith("config=") or item.startswith("config/"):
            item = "+" + item
        out.append(item)
    return out


def compose_hydra_configuration(overrides: Sequence[str]) -> DictConfig:
    """Hydra compose of the defaults, the chosen config file and the command-line overrides."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    defaults = load_defaults()
    ConfigStore.instance().store(name=_PRIMARY_NAME, node=defaults)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            cfg = compose(_PRIMARY_NAME, overrides=_hydra_overrides(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        message = " ".join(lines[:2]) if lines else type(err).__name__
        if "Could not find" in str(err) or "Could not load" in str(err):
            message = f"{message}. Configs live in {config_dir() / 'config'}"
        raise ConfigError(message) from None
    OmegaConf.set_struct(cfg, False)
    cfg.pop("defaults", None)
    return cfg
