"""Refuse unknown keys, wrong types and unsupported VISSL settings before any process starts.

Every key of a composed config must exist in defaults.yaml with a value of the same kind.
Sections whose default is ``{}`` are open (their keys belong to the component they configure),
as are the few listed in ``OPEN_SUBTREES``; lists are not looked into. VISSL keys the engine
does not implement take only their defaults (``ssl_engine.config.unsupported``).
"""
import fnmatch
import re
from typing import Any, Iterator, List, Sequence, Tuple

from ssl_engine.config.gpu_settings import adapt_gpu_settings
from ssl_engine.config.ignored_keys import drop_ignored_keys
from ssl_engine.config.legacy_keys import move_legacy_keys
from ssl_engine.config.unsupported import unsupported_keys, unsupported_names
from ssl_engine.utils.errors import ConfigError
from ssl_engine.utils.key_rules import number_or_false_keys
from ssl_engine.utils.registry import closest_name

# Sections with a non-empty default whose children are free as well.
OPEN_SUBTREES = ("config.DATA.*.COLLATE_FUNCTION_PARAMS", "config.MODEL.AMP_PARAMS.AMP_ARGS",
                 "config.SLURM.ADDITIONAL_PARAMETERS", "config.DISTILLATION.TEACHER_MODEL.TRUNK")
_OPEN = re.compile("|".join(fnmatch.translate(p) for p in OPEN_SUBTREES))
# Keys that take an int or the word "auto" (their default).
INT_OR_AUTO = ("config.DATA.NUM_DATALOADER_WORKERS",)
# Keys that take a number or the word "inf" (VISSL's NORM_TYPE of clipping: inf is the max-norm).
NUMBER_OR_INF = ("config.MODEL.GRAD_CLIP.NORM_TYPE",)
# Keys whose default false means "off" and that take a number otherwise: declared by the
# components they configure (utils/key_rules.py, ``accept_number_or_false``).
# Keys that take a string or an int (a count that VISSL's configs write either way).
STR_OR_INT = ("config.DISTRIBUTED.NCCL_SOCKET_NTHREADS",)
# Keys that take a number or a list of numbers (VISSL's low-shot LAMBDA: one, or several tried).
NUMBER_OR_LIST = ("config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.LAMBDA",)
# Keys that take a string or a list of strings (VISSL's STATE_DICT_KEY_NAME: one key, or the
# path of keys to the weights in a nested checkpoint, e.g. [loss, teacher]).
STR_OR_STR_LIST = ("config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME",
                   "config.DISTILLATION.TEACHER_MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME")
# Sections whose *new* sub-sections are accepted (settings of a component registered by a user,
# or another scheduled parameter), while the keys of the known sub-sections are still checked.
EXTENSIBLE_SECTIONS = ("config.LOSS", "config.METERS", "config.OPTIMIZER.param_schedulers")


def _is_open(path: str, schema: dict) -> bool:
    """Whether ``path`` lies inside an open section (below it, not the section itself)."""
    parts = path.split(".")
    node = schema
    for depth, part in enumerate(parts[:-1], start=1):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
        if (isinstance(node, dict) and not node) or _OPEN.match(".".join(parts[:depth])):
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


def _is_number(value: Any) -> bool:
    """An int or float (not a bool), or a string that reads as one."""
    if _kind(value) in ("int", "float"):
        return True
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


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
    if _is_open(path, schema) or _under_new_extension(path, schema):
        return
    try:
        get_dotted(schema, path)
    except KeyError:
        raise _unknown_key_error(path, schema) from None


def _matches(pattern: str, cfg: dict) -> Iterator[Tuple[str, Any]]:
    """(path, value) of every key of ``cfg`` that ``pattern`` names (``*``: any one part)."""
    found = [("", cfg)]
    for part in pattern.split("."):
        step = []
        for prefix, node in found:
            if isinstance(node, dict):
                keys = node if part == "*" else ((part,) if part in node else ())
                step.extend((f"{prefix}.{k}" if prefix else str(k), node[k]) for k in keys)
        found = step
    return iter(found)


def _first_change(path: str, value: Any, default: Any) -> Tuple[str, Any]:
    """The first key under ``path`` whose value differs from the default (a section's own path
    when it gained or lost keys)."""
    if isinstance(value, dict) and isinstance(default, dict) and default:
        for key, sub in value.items():
            if key in default and sub != default[key]:
                return _first_change(f"{path}.{key}", sub, default[key])
    return path, value


def check_unsupported(cfg: dict, schema: dict) -> None:
    """Refuse VISSL settings the engine does not implement (the defaults are accepted)."""
    for key, names in unsupported_names().items():
        for path, value in _matches(key, cfg):
            for name in value if isinstance(value, list) else [value]:
                if isinstance(name, str) and name in names:
                    raise ConfigError(f"{path}={name} is not supported: {names[name]}")
    for pattern, refusal in unsupported_keys().items():
        for path, value in _matches(pattern, cfg):
            try:
                default = get_dotted(schema, path)
            except KeyError:
                continue  # an unknown key: named by validate_config
            if value == default or any(value == ok for ok in refusal.accepted):
                continue
            path, value = _first_change(path, value, default)
            raise ConfigError(f"{path}={value!r} is not supported: {refusal.reason}")


def _check_value(path: str, default: Any, value: Any) -> None:
    if path in INT_OR_AUTO and (value == "auto" or _kind(value) == "int"):
        return
    if path in NUMBER_OR_INF and value == "inf":
        return
    if path in number_or_false_keys() and _is_number(value):
        return
    if path in STR_OR_INT and _kind(value) in ("str", "int"):
        return
    if path in NUMBER_OR_LIST and _kind(value) == "list" and all(map(_is_number, value)):
        return
    if path in STR_OR_STR_LIST and _kind(value) == "list" and all(
            _kind(part) == "str" for part in value):
        return
    if not _type_ok(default, value):
        raise ConfigError(
            f"config key '{path}' expects {_article(_kind(default))} like {default!r}, "
            f"got {value!r} ({_kind(value)})"
        )


def _check_section(node: dict, schema_node: dict, prefix: str, schema: dict) -> None:
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in schema_node:
            if _under_new_extension(path, schema):
                continue
            raise _unknown_key_error(path, schema)
        default = schema_node[key]
        _check_value(path, default, value)
        if isinstance(value, dict) and isinstance(default, dict) and default \
                and not _OPEN.match(path):
            _check_section(value, default, path, schema)


def validate_config(cfg: dict, schema: dict) -> None:
    """Move older VISSL keys to their current place, drop the keys VISSL's own files carry but
    VISSL never read and rewrite GPU-only settings for the run's device (in place, with a
    warning each), refuse the VISSL settings the engine does not implement, then check every
    key and value type of a composed config (plain dicts) against the schema."""
    move_legacy_keys(cfg, schema)
    drop_ignored_keys(cfg, schema)
    adapt_gpu_settings(cfg)
    check_unsupported(cfg, schema)  # first: an unsupported value may also be of another type
    _check_section(cfg, schema, "", schema)


def validate_overrides(overrides: Sequence[str], schema: dict) -> None:
    """Check command-line ``key=value`` overrides name existing keys (``+key`` adds on purpose)."""
    for item in overrides:
        if item.startswith("~"):  # Hydra's deletion: "~key" or "~key=value"
            continue
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key = item.split("=", 1)[0]
        if key.startswith(("+", "~")) or key in ("config",) or key.startswith("hydra"):
            continue
        check_key(key, schema)
