"""Config: Hydra composition, validation against defaults.yaml, derived settings."""
from typing import Sequence, Tuple

from omegaconf import OmegaConf

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.config.compose import compose_hydra_configuration, config_dir, load_defaults
from ssl_engine.config.derive import derive_settings, global_batch_size
from ssl_engine.config.validate import validate_config, validate_overrides
from ssl_engine.utils.derivations import require_components
from ssl_engine.utils.errors import ConfigError

__all__ = [
    "AttrDict",
    "ConfigError",
    "compose_config",
    "config_dir",
    "global_batch_size",
    "load_config",
]


def compose_config(overrides: Sequence[str]) -> Tuple[str, AttrDict]:
    """Compose and validate, without derived settings: (engine_name, cfg under ``config``).
    The losses and trunks must be imported first (their key rules count in validation)."""
    require_components()
    schema = load_defaults()
    schema.pop("defaults", None)
    validate_overrides(overrides, schema)
    composed = OmegaConf.to_container(compose_hydra_configuration(overrides), resolve=True)
    validate_config(composed, schema)
    return composed["engine_name"], AttrDict(composed["config"])


def load_config(overrides: Sequence[str]) -> Tuple[str, AttrDict]:
    """The full path from command-line arguments to a checked config with derived settings."""
    engine_name, cfg = compose_config(overrides)
    return engine_name, derive_settings(cfg)
