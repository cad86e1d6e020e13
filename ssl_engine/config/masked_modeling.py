"""The masking collator's input and target names, filled in before launch from INPUT_KEY_NAMES
and TARGET_KEY_NAMES, as VISSL auto-completes them (the losses and trunks of masked image
modelling derive their own settings: their ``derive_config``)."""
from ssl_engine.config.attr_dict import AttrDict

MASKING_COLLATOR = "ibot_multicrop_masking_collator"


def derive_collator_keys(cfg: AttrDict) -> None:
    for split in ("TRAIN", "TEST"):
        split_cfg = cfg.DATA[split]
        if split_cfg.COLLATE_FUNCTION != MASKING_COLLATOR:
            continue
        params = dict(split_cfg.COLLATE_FUNCTION_PARAMS or {})
        if list(split_cfg.INPUT_KEY_NAMES) != ["data"]:  # "data": the default, not set
            params.setdefault("input_keys", list(split_cfg.INPUT_KEY_NAMES))
        params.setdefault("target_keys", list(split_cfg.TARGET_KEY_NAMES))
        split_cfg.COLLATE_FUNCTION_PARAMS = AttrDict(params)
