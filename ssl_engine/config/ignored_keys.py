"""Keys that VISSL's own published config files carry but VISSL never read: dropped before
validation, with one warning each.

VISSL merged a config file into its defaults without checking its keys, so a few of its files
hold keys no VISSL code reads (a misspelling, a key of another project, an indentation slip).
VISSL ran those files as if the keys were absent; so does the engine, saying so. Only the keys
listed here are dropped: any other key the schema lacks is still refused as unknown (a typo in
a user's own file), and a listed key that the schema gains later is read, not dropped.
"""
import logging
from typing import Dict, List

logger = logging.getLogger(__name__)

_UNREAD = "VISSL never read this key (its run ignored it)"

# path -> why VISSL ignored it (the warning says the engine ignores it too)
IGNORED_KEYS: Dict[str, str] = {
    "config.LOSS.dino_loss.normalize_last_layer":
        f"{_UNREAD}: dino_loss has no such setting (DINO's last layer is weight-normalised by "
        "dino_head)",
    "config.LOSS.swav_loss.shk_powerlaw": f"{_UNREAD}: swav_loss has no such setting",
    "config.MODEL.WEIGHTS_INIT.PARAM_FILE":
        "a misspelling of MODEL.WEIGHTS_INIT.PARAMS_FILE: VISSL loaded no weights from it "
        "(write PARAMS_FILE to load them)",
    "config.MODEL.TRUNK.VISION_TRANSFORMERS.CONVIT":
        f"{_UNREAD}: ConViT is the convit trunk, set by MODEL.TRUNK.CONVIT",
    "config.MODEL.TRUNK.CONVIT.QKV_BIAS":
        f"{_UNREAD}: the convit trunk reads MODEL.TRUNK.VISION_TRANSFORMERS.QKV_BIAS",
    "config.MODEL.TRUNK.CONVIT.QK_SCALE":
        f"{_UNREAD}: the convit trunk reads MODEL.TRUNK.VISION_TRANSFORMERS.QK_SCALE",
    "config.DATA.TRANSFORMS":
        f"{_UNREAD}: transforms are read from DATA.TRAIN.TRANSFORMS and DATA.TEST.TRANSFORMS",
    "engine": f"{_UNREAD}: the engine is chosen by engine_name (train by default)",
    "DISTRIBUTED": f"{_UNREAD} (outside the config: section): the settings are "
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
    for path, why in IGNORED_KEYS.items():
        if _pop(cfg, path, schema):
            logger.warning("%s is ignored: %s; the engine ignores it too (delete it to silence "
                           "this)", path, why)
            dropped.append(path)
    return dropped
