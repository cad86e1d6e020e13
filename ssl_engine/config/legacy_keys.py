"""Keys of older VISSL versions that VISSL's own config files still use, moved to their current
place before validation (one warning per move).

- ``config.MODEL.TRUNK.TRUNK_PARAMS.<SECTION>...`` -> ``config.MODEL.TRUNK.<SECTION>...``
  (e.g. ``TRUNK_PARAMS.RESNETS.DEPTH`` -> ``TRUNK.RESNETS.DEPTH``), key by key;
- ``config.MONITOR_PERF_STATS`` -> ``config.HOOKS.PERF_STATS.MONITOR_PERF_STATS``.

A current key already set to another value than its default and than the old key's keeps its
value (VISSL reads only the current key), with a warning naming both keys.
"""
import logging
from typing import Any, Iterator, List, Tuple


logger = logging.getLogger(__name__)

_MISSING = object()
# old path -> new path; a section moves key by key
MOVED = {
    "config.MODEL.TRUNK.TRUNK_PARAMS": "config.MODEL.TRUNK",
    "config.MONITOR_PERF_STATS": "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS",
}


def _get(node: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _set(node: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


def _pop(node: dict, path: str) -> Any:
    *parents, last = path.split(".")
    for part in parents:
        node = node[part]
    return node.pop(last)


def _leaves(value: Any, path: str) -> Iterator[Tuple[str, Any]]:
    """(path, value) of every key under ``value`` that is not a non-empty dict."""
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from _leaves(sub, f"{path}.{key}")
    else:
        yield path, value


def move_legacy_keys(cfg: dict, schema: dict) -> List[Tuple[str, str]]:
    """Move the older keys of ``cfg`` (a composed config, plain dicts) to their current place,
    in place; returns the (old, new) paths moved.  ``schema`` gives the defaults that tell a
    current key the user set from one left alone."""
    moved = []
    for old_root, new_root in MOVED.items():
        value = _get(cfg, old_root)
        if value is _MISSING:
            continue
        _pop(cfg, old_root)
        section_moves = []
        for old, leaf in _leaves(value, old_root):
            if old == old_root and isinstance(leaf, dict):  # an empty section: nothing to move
                continue
            new = new_root + old[len(old_root):]
            current, default = _get(cfg, new), _get(schema, new)
            if current is not _MISSING and current != default and current != leaf:
                logger.warning("%s=%r (VISSL's older key) and %s=%r are both set: %s is used, "
                               "as VISSL would", old, leaf, new, current, new)
                continue
            _set(cfg, new, leaf)
            section_moves.append((old, new))
        if section_moves:
            if len(section_moves) == 1:
                names = f"{section_moves[0][0]} is now {section_moves[0][1]}"
            else:
                names = f"{old_root}.<key> is now {new_root}.<key> (" + ", ".join(
                    old[len(old_root) + 1:] for old, _ in section_moves) + ")"
            logger.warning("older VISSL key: %s; moved there (write the new key to silence "
                           "this)", names)
        moved.extend(section_moves)
    return moved
