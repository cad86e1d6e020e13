"""Compose a run's config with Hydra: defaults.yaml + ``config=<group>/<name>`` + overrides."""
import copy
import functools
import os
from pathlib import Path
from typing import List, Sequence, Tuple

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
    except RecursionError:  # a defaults list that includes its own config
        raise ConfigError(_recursion_message(overrides)) from None
    except (HydraException, OmegaConfBaseException) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        message = " ".join(lines[:2]) if lines else type(err).__name__
        if "Could not find" in str(err) or "Could not load" in str(err):
            message = f"{message}. Configs live in {config_dir() / 'config'}"
        raise ConfigError(message) from None
    OmegaConf.set_struct(cfg, False)
    cfg.pop("defaults", None)
    return cfg


def _defaults_entries(path: Path, group: str) -> List[Tuple[str, str]]:
    """(config path, its group) of each config that the ``defaults:`` list of the YAML file
    ``path`` (chosen in config group ``group``) includes, as Hydra addresses them: ``/a/b``
    from the top; ``b`` (a config) and ``{a: b}`` (a group and its option) relative to
    ``group``. ``_self_``, ``???`` and unreadable entries are left out."""
    import yaml

    try:
        entries = (yaml.safe_load(path.read_text()) or {}).get("defaults") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return []

    def under(base: str, name: str) -> str:
        return name.lstrip("/") if name.startswith("/") else f"{base}/{name}".strip("/")

    found = []
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, str) and entry != "_self_":
            config = under(group, entry.split("@")[0])
            found.append((config, config.rsplit("/", 1)[0] if "/" in config else ""))
        elif isinstance(entry, dict):
            for key, value in entry.items():
                key = str(key).split("@")[0].replace("optional ", "").replace("override ", "")
                child_group = under(group, key.strip())
                for option in value if isinstance(value, list) else [value]:
                    if isinstance(option, str) and option not in ("_self_", "???"):
                        found.append((f"{child_group}/{option.split('@')[0]}", child_group))
    return found


def _defaults_cycle(start: str, group: str) -> List[Path]:
    """The files of a cycle of ``defaults:`` lists reached from config ``start`` (e.g.
    ``config/pretrain/x``, chosen in group ``config``), the first file repeated at the end;
    empty if none is found."""
    root = config_dir()

    def visit(name: str, name_group: str, trail: List[str]) -> List[str]:
        if name in trail:
            return trail[trail.index(name):] + [name]
        path = root / f"{name}.yaml"
        if not path.is_file():
            return []
        for child, child_group in _defaults_entries(path, name_group):
            cycle = visit(child, child_group, trail + [name])
            if cycle:
                return cycle
        return []

    return [root / f"{name}.yaml" for name in visit(start, group, [])]


def _recursion_message(overrides: Sequence[str]) -> str:
    chosen = [item.split("=", 1)[1] for item in overrides if item.startswith("config=")]
    for name in chosen:
        cycle = _defaults_cycle(f"config/{name}", "config")
        if cycle:
            files = " -> ".join(str(path) for path in cycle)
            return (f"the defaults lists of the configs include each other without end: {files}. "
                    "Remove the entry that includes a config already in the chain")
    return (f"the defaults lists of config={', '.join(chosen) or '(none)'} include each other "
            f"without end (a config's defaults: list includes itself, directly or through "
            f"another config under {config_dir() / 'config'})")
