"""Refuse unknown keys and wrong types before any process starts.

Every key of a composed config must exist in defaults.yaml with a value of the same kind.
A few subtrees are open (their keys depend on the component they configure) and are listed
in ``OPEN_SUBTREES``; lists are not looked into.
"""
import fnmatch
from typing import Any, Iterator, List, Sequence, Tuple

from ssl_engine.config.errors import ConfigError
from ssl_engine.utils.registry import closest_name

# Patterns of sections whose children are free: keyword arguments of a component chosen by name.
OPEN_SUBTREES = ("config.DATA.*.COLLATE_FUNCTION_PARAMS", "config.MODEL.AMP_PARAMS.AMP_ARGS",
                 "config.SLURM.ADDITIONAL_PARAMETERS")
# Keys that take an int or the word "auto" (their default).
INT_OR_AUTO = ("config.DATA.NUM_DATALOADER_WORKERS",)
# Keys that take a number or the word "inf" (VISSL's NORM_TYPE of clipping: inf is the max-norm).
NUMBER_OR_INF = ("config.MODEL.GRAD_CLIP.NORM_TYPE",)
# Sections whose *new* sub-sections are accepted (settings of a component registered by a user,
# or another scheduled parameter), while the keys of the known sub-sections are still checked.
EXTENSIBLE_SECTIONS = ("config.LOSS", "config.METERS", "config.OPTIMIZER.param_schedulers")


def _is_open(path: str) -> bool:
    parts = path.split(".")
    for pattern in OPEN_SUBTREES:
        depth = pattern.count(".") + 1
        if len(parts) > depth and fnmatch.fnmatch(".".join(parts[:depth]), pattern):
            return True
    return False


def _walk(node: Any, prefix: str) -> Iterator[Tuple[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path, value
            if isinstance(value, dict):
                yield from _walk(value, path)


def _flat_keys(node: Any) -> List[str]:
    return [path for path, _ in _walk(node, "")]


def get_dotted(node: Any, path: str):
    """``node[a][b][c]`` for ``path`` "a.b.c"; KeyError if any part is missing."""
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(path)
        node = node[part]
    return node


def _kind(value: Any) -> str:
    if value is None:
        return "any"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "float" if isinstance(value, float) else "int"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "dict"
    return type(value).__name__


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _type_ok(default: Any, value: Any) -> bool:
    expected, got = _kind(default), _kind(value)
    if expected == "any" or got == "any":
        return True
    if expected == "float":
        return got in ("int", "float")
    return expected == got


def _unknown_key_error(path: str, schema: dict) -> ConfigError:
    parent = path.rsplit(".", 1)[0]
    siblings = []
    try:
        siblings = [f"{parent}.{k}" for k in get_dotted(schema, parent)]
    except KeyError:
        pass
    suggestion = closest_name(path, siblings) or closest_name(path, _flat_keys(schema))
    message = f"unknown config key '{path}'"
    if suggestion:
        message += f": did you mean '{suggestion}'?"
    return ConfigError(message)


def _under_new_extension(path: str, schema: dict) -> bool:
    for section in EXTENSIBLE_SECTIONS:
        if path.startswith(section + "."):
            sub = path[len(section) + 1:].split(".")[0]
            try:
                get_dotted(schema, f"{section}.{sub}")
            except KeyError:
                return True
    return False


def check_key(path: str, schema: dict) -> None:
    """Raise if ``path`` names no key of the schema (and lies in no open subtree)."""
    if _is_open(path) or _under_new_extension(path, schema):
        return
    try:
        get_dotted(schema, path)
    except KeyError:
        raise _unknown_key_error(path, schema) from None


def validate_config(cfg: dict, schema: dict) -> None:
    """Check every key and value type of a composed config (plain dicts) against the schema."""
    for path, value in _walk(cfg, ""):
        if _is_open(path) or _under_new_extension(path, schema):
            continue
        try:
            default = get_dotted(schema, path)
        except KeyError:
            raise _unknown_key_error(path, schema) from None
        if path in INT_OR_AUTO and (value == "auto" or _kind(value) == "int"):
            continue
        if path in NUMBER_OR_INF and value == "inf":
            continue
        if not _type_ok(default, value):
            raise ConfigError(
                f"config key '{path}' expects {_article(_kind(default))} like {default!r}, "
                f"got {value!r} ({_kind(value)})"
            )


def validate_overrides(overrides: Sequence[str], schema: dict) -> None:
    """Check command-line ``key=value`` overrides name existing keys (``+key`` adds on purpose)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key = item.split("=", 1)[0]
        if key.startswith(("+", "~")) or key in ("config",) or key.startswith("hydra"):
            continue
        check_key(key, schema)
