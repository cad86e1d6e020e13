"""Compose a run's config with Hydra: defaults.yaml + ``config=<group>/<name>`` + overrides.

Where configs are found, first match wins:

- the engine's ``configs/`` folder (``config_dir()``);
- the folders of ``$SSL_ENGINE_CONFIG_PATH`` (separated by ``os.pathsep``) and of Hydra's
  ``hydra.searchpath=[...]`` override: each is a root like ``configs/``, holding
  ``config/<name>.yaml``, so a user keeps their configs in their own folder and their
  ``defaults:`` lists can name the engine's configs (``- /config/quickstart/simclr_digits``);
- ``config=<path to a .yaml file>`` anywhere on disk: the file is read and offered to Hydra
  as an option of the ``config`` group, exactly as if it sat in ``configs/config/``.
"""
import copy
import functools
import hashlib
import os
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from ssl_engine.utils.errors import ConfigError
from ssl_engine.utils.install_paths import REPOSITORY, data_folder, installed_folder

_PRIMARY_NAME = "ssl_engine_defaults"
SEARCH_PATH_ENV = "SSL_ENGINE_CONFIG_PATH"
_FILE_SUFFIXES = (".yaml", ".yml")
_STORED_FILES = {}  # Hydra's name of each config=<file> stored -> the file, for messages


def config_dir() -> Path:
    """The ``configs/`` folder: ``$SSL_ENGINE_CONFIG_DIR``, else the one beside the package
    (a checkout, an editable install), else the copy a regular install made
    (``utils/install_paths.py``)."""
    env = os.environ.get("SSL_ENGINE_CONFIG_DIR")
    path = Path(env) if env else data_folder("configs")
    if path is None:
        raise ConfigError(f"no configs/ folder beside the package ({REPOSITORY / 'configs'}) "
                          f"nor installed ({installed_folder('configs')}): reinstall, or set "
                          "SSL_ENGINE_CONFIG_DIR to a copy of the repository's configs/")
    if not (path / "config" / "defaults.yaml").is_file():
        raise ConfigError(f"no config/defaults.yaml under the config folder {path}")
    return path


def user_config_roots() -> List[Path]:
    """The folders of ``$SSL_ENGINE_CONFIG_PATH``; each must hold a ``config/`` folder."""
    roots = [Path(entry).expanduser().resolve()
             for entry in os.environ.get(SEARCH_PATH_ENV, "").split(os.pathsep) if entry]
    for root in roots:
        if not (root / "config").is_dir():
            raise ConfigError(f"{SEARCH_PATH_ENV} names {root}, which has no config/ folder: "
                              f"put your configs in {root / 'config'}/<name>.yaml and choose "
                              "them with config=<name>")
    return roots


def config_file(value: str) -> Optional[Path]:
    """The YAML file that ``config=<value>`` names, or None when ``value`` is a config name
    (``group/name``). A value ending in .yaml/.yml that is a file (from the current folder)
    is a file; one that is not, but is a config name with its suffix, is that name; any
    other path-like value (absolute, ``./``, ``~``, a .yaml suffix) must be a file."""
    path = Path(value).expanduser()
    looks_like_path = value.endswith(_FILE_SUFFIXES) or value.startswith(("/", ".", "~"))
    if not looks_like_path:
        return None
    if path.is_file():
        return path.resolve()
    if value.endswith(_FILE_SUFFIXES) and not path.is_absolute() and any(
            (root / "config" / value).is_file() for root in _search_roots()):
        return None  # quickstart/simclr_digits.yaml: the config of that name
    raise ConfigError(f"config={value}: no such file {path.resolve()}")


def _search_roots() -> List[Path]:
    return [config_dir(), *user_config_roots()]


def _package_header(text: str) -> Optional[str]:
    """The ``# @package <name>`` of a YAML file's leading comments, as Hydra reads it."""
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            return None
        if line.startswith("#") and line[1:].strip().startswith("@package"):
            return line[1:].strip()[len("@package"):].strip() or None
    return None


def _store_config_file(path: Path) -> str:
    """Offer the YAML file ``path`` to Hydra as an option of the ``config`` group (with its
    own ``# @package`` header and ``defaults:`` list); return the option's name."""
    from hydra.core.config_store import ConfigStore

    text = path.read_text()
    try:
        node = OmegaConf.to_container(OmegaConf.create(text), resolve=False) or {}
    except Exception as err:  # noqa: BLE001  (any YAML error, in one line)
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        where = next((line.split(", ", 1)[-1].rstrip(":")
                      for line in lines if ", line " in line), "")
        what = lines[0] if lines else type(err).__name__
        raise ConfigError(f"config={path}: not a readable YAML file: {what}"
                          + (f" ({where})" if where else "")) from None
    if not isinstance(node, dict):
        raise ConfigError(f"config={path}: the file must hold a mapping of keys, got "
                          f"{type(node).__name__}")
    name = "file_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    _STORED_FILES[name] = path
    ConfigStore.instance().store(group="config", name=name, node=node,
                                 package=_package_header(text), provider=str(path))
    return name


def load_defaults() -> dict:
    """The schema: configs/config/defaults.yaml as a plain container (a fresh copy; each
    version of the file is parsed once per process)."""
    return copy.deepcopy(_parsed_yaml((config_dir() / "config" / "defaults.yaml").read_text()))


@functools.lru_cache(maxsize=4)
def _parsed_yaml(text: str) -> dict:
    return OmegaConf.to_container(OmegaConf.create(text), resolve=True)


def _hydra_overrides(overrides: Sequence[str]) -> List[str]:
    """``config=<name>`` appends a config group to the defaults list in Hydra's grammar;
    ``config=<file>`` chooses the file stored for it; the folders of $SSL_ENGINE_CONFIG_PATH
    join (before) those of a ``hydra.searchpath=[...]`` override."""
    out, searchpath = [], [f"file://{root}" for root in user_config_roots()]
    for item in overrides:
        if item.startswith("config="):
            path = config_file(item.split("=", 1)[1])
            item = f"config={_store_config_file(path)}" if path else item
        if item.startswith("config=") or item.startswith("config/"):
            item = "+" + item
        if item.startswith("hydra.searchpath="):
            listed = item.split("=", 1)[1].strip()
            listed = listed[1:-1] if listed.startswith("[") and listed.endswith("]") else listed
            searchpath += [entry.strip() for entry in listed.split(",") if entry.strip()]
            continue
        out.append(item)
    if searchpath:
        out.append(f"hydra.searchpath=[{','.join(searchpath)}]")
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
        for name, path in _STORED_FILES.items():
            message = message.replace(f"'config/{name}'", str(path))
        if "Could not find" in str(err) or "Could not load" in str(err):
            folders = ", ".join(str(root / "config") for root in _search_roots())
            message = (f"{message}. Configs live in {folders} (more folders: "
                       f"{SEARCH_PATH_ENV} or hydra.searchpath; a file: config=<path>.yaml)")
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
    roots = _search_roots()

    def file_of(name: str) -> Path:
        return next((root / f"{name}.yaml" for root in roots
                     if (root / f"{name}.yaml").is_file()), roots[0] / f"{name}.yaml")

    def visit(name: str, name_group: str, trail: List[str]) -> List[str]:
        if name in trail:
            return trail[trail.index(name):] + [name]
        path = file_of(name)
        if not path.is_file():
            return []
        for child, child_group in _defaults_entries(path, name_group):
            cycle = visit(child, child_group, trail + [name])
            if cycle:
                return cycle
        return []

    return [file_of(name) for name in visit(start, group, [])]


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
