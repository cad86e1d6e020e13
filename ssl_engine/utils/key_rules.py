"""Rules about a component's own config keys, declared by the component when it is imported.

Validation (config/validate.py) applies them beside its own, general rules, so the config layer
names no loss and no trunk: a component that has such a key says so in its own module.

- ``ignore_published_key``: a key that VISSL's published config files carry but VISSL never read
  (e.g. a setting a VISSL loss never had). It is dropped before validation, with one warning.
- ``refuse_key``: a VISSL key the engine does not implement. It takes only its default (and the
  ``accepted`` values); any other value is refused before launch with the reason.
- ``refuse_name``: a component name VISSL knows that the engine has not got, refused with a hint.
- ``accept_number_or_false``: keys whose default ``false`` means "off" and that take a number
  otherwise (YAML 1.1 reads "1e-5" as a string: that is accepted too).

A key declared again replaces its earlier rule (a module imported twice declares the same).
"""
from typing import Any, Dict, FrozenSet, NamedTuple, Sequence, Tuple


class Refusal(NamedTuple):
    reason: str
    accepted: Tuple[Any, ...] = ()  # values accepted besides the default


NEVER_READ = "VISSL never read this key (its run ignored it)"  # how an ignored key's why begins

_IGNORED: Dict[str, str] = {}
_REFUSED: Dict[str, Refusal] = {}
_REFUSED_NAMES: Dict[str, Dict[str, str]] = {}
_NUMBER_OR_FALSE: set = set()


def ignore_published_key(path: str, why: str) -> None:
    """``path`` (dotted, from the top: ``config.LOSS.<name>.<key>``) is dropped with a warning
    saying ``why`` VISSL never read it."""
    _IGNORED[path] = why


def refuse_key(path: str, reason: str, accepted: Sequence[Any] = ()) -> None:
    """``path`` (``*`` stands for one part) takes only its default and ``accepted``."""
    _REFUSED[path] = Refusal(reason, tuple(accepted))


def refuse_name(key: str, name: str, reason: str) -> None:
    """The value ``name`` of ``key`` (e.g. ``config.LOSS.name``) is refused with ``reason``."""
    _REFUSED_NAMES.setdefault(key, {})[name] = reason


def accept_number_or_false(*paths: str) -> None:
    _NUMBER_OR_FALSE.update(paths)


def ignored_keys() -> Dict[str, str]:
    return dict(_IGNORED)


def refused_keys() -> Dict[str, Refusal]:
    return dict(_REFUSED)


def refused_names() -> Dict[str, Dict[str, str]]:
    return {key: dict(names) for key, names in _REFUSED_NAMES.items()}


def number_or_false_keys() -> FrozenSet[str]:
    return frozenset(_NUMBER_OR_FALSE)
