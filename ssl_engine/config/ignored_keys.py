"""Keys that VISSL's own published config files carry but VISSL never read: dropped before
validation, with one warning each.

VISSL merged a config file into its defaults without checking its keys, so a few of its files
hold keys no VISSL code reads (a misspelling, a key of another project, an indentation slip).
VISSL ran those files as if the keys were absent; so does the engine, saying so. Only the keys
listed here are dropped: any other key the schema lacks is still refused as unknown (a typo in
a user's own file), and a listed key that the schema gains later is read, not dropped. A component's own such keys are
declared by the component (``ssl_engine.utils.key_rules.ignore_published_key``).
"""
import logging
from typing import Dict, List

from ssl_engine.utils.key_rules import NEVER_READ as UNREAD, ignored_keys

logger = logging.getLogger(__name__)

# path -> why VISSL ignored it (the warning says the engine ignores it too)
IGNORED_KEYS: Dict[str, str] = {
    "config.MODEL.WEIGHTS_INIT.PARAM_FILE":
        "a misspelling of MODEL.WEIGHTS_INIT.PARAMS_FILE: VISSL loaded no weights from it "
        "(write PARAMS_FILE to load them)",
    "config.DATA.TRANSFORMS":
        f"{UNREAD}: transforms are read from DATA.TRAIN.TRANSFORMS and DATA.TEST.TRANSFORMS",
    "engine": f"{UNREAD}: the engine is chosen by engine_name (train by default)",
    "DISTRIBUTED": f"{UNREAD} (outside the config: section): the settings are "
                   "config.DISTRIBUTED",
}


def _pop(node: dict, path: str, schema: dict):
    """Remove ``path`` from ``node`` when present there and absent from ``schema``; True if
    removed."""
    *parents, last = path.split(".")
    for part in parents:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            return False
        node = node[part]
        schema = schema.get(part) if isinstance(schema, dict) else None
    if not isinstance(node, dict) or last not in node:
        return False
    if isinstance(schema, dict) and last in schema:  # the engine reads it: keep it
        return False
    node.pop(last)
    return True


def drop_ignored_keys(cfg: dict, schema: dict) -> List[str]:
    """Remove the keys of ``IGNORED_KEYS`` that ``cfg`` (a composed config, plain dicts) holds,
    in place, warning once for each; returns their paths.  Called by ``validate_config``."""
    dropped = []
    for path, why in {**IGNORED_KEYS, **ignored_keys()}.items():
        if _pop(cfg, path, schema):
            logger.warning("%s is ignored: %s; the engine ignores it too (delete it to silence "
                           "this)", path, why)
            dropped.append(path)
    return dropped
