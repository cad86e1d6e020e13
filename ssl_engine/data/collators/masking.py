"""The collator of masked image modelling (iBOT, MAE): named inputs for
MODEL.MULTI_INPUT_HEAD_MAPPING."""
from typing import Dict, Sequence

import torch

from ssl_engine.data.collators.common import num_views, view_major, view_major_meta
from ssl_engine.data.collators.multicrop import resolution_groups
from ssl_engine.data.registry import register_collator
from ssl_engine.utils.derivations import register_config_derivation

GLOBAL, LOCAL, MASK, LABEL = "global_views", "local_views", "mask", "label"
NAMES = (GLOBAL, LOCAL, MASK)


def _masks(samples, views) -> torch.Tensor:
    if any("mask" not in sample for sample in samples):
        raise ValueError("the masking collator needs patch masks: end DATA.TRAIN.TRANSFORMS "
                         "with MaskedImageModeling (iBOT) or RandomPatchMasking (MAE)")
    return torch.stack([sample["mask"][v] for v in views for sample in samples])


COLLATOR_NAME = "ibot_multicrop_masking_collator"


def derive_collator_keys(cfg) -> None:
    """The collator's input and target names, filled in before launch from each split's
    INPUT_KEY_NAMES and TARGET_KEY_NAMES (as VISSL auto-completes them), unless given in
    COLLATE_FUNCTION_PARAMS."""
    for split in ("TRAIN", "TEST"):
        split_cfg = cfg.DATA[split]
        if split_cfg.COLLATE_FUNCTION != COLLATOR_NAME:
            continue
        params = dict(split_cfg.COLLATE_FUNCTION_PARAMS or {})
        if list(split_cfg.INPUT_KEY_NAMES) != ["data"]:  # "data": the default, not set
            params.setdefault("input_keys", list(split_cfg.INPUT_KEY_NAMES))
        params.setdefault("target_keys", list(split_cfg.TARGET_KEY_NAMES))
        split_cfg.COLLATE_FUNCTION_PARAMS = params


register_config_derivation("masking_collator", derive_collator_keys)


@register_collator(COLLATOR_NAME)
def multicrop_masking_collator(samples, input_keys: Sequence[str] = NAMES,
                               target_keys: Sequence[str] = (MASK,)):
    """Views grouped by resolution, as multicrop_collator: the first group is
    ``global_views`` ([G*B, C, H, W], view-major), the next (if any) ``local_views``; ``mask``
    is the patch masks of the global views ([G*B, h, w], same rows).  "input" holds the
    entries named by ``input_keys`` (DATA.TRAIN.INPUT_KEY_NAMES), "target" the one named by
    ``target_keys`` (TARGET_KEY_NAMES; a dict of them when several; "label" names the labels),
    "label" the labels; data_idx and data_valid cover every row of every group."""
    num_views(samples)
    groups = resolution_groups(samples[0])
    if len(groups) > 2:
        raise ValueError(f"the masking collator takes views of at most two sizes (global and "
                         f"local crops), got {len(groups)} sizes")
    meta = view_major_meta(samples, [v for group in groups for v in group])
    named: Dict[str, torch.Tensor] = {GLOBAL: torch.stack(view_major(samples, groups[0])),
                                      LABEL: meta.pop("target")}
    if len(groups) > 1:
        named[LOCAL] = torch.stack(view_major(samples, groups[1]))
    if MASK in input_keys or MASK in target_keys:
        named[MASK] = _masks(samples, groups[0])
    for key in list(input_keys) + list(target_keys):
        if key not in named and key != LOCAL:
            raise ValueError(f"the masking collator has no input named {key!r}: it makes "
                             f"{', '.join(NAMES + (LABEL,))}")
    targets = {key: named[key] for key in target_keys}
    return {
        "input": {key: named[key] for key in input_keys if key in named},
        "target": targets[target_keys[0]] if len(targets) == 1 else targets,
        "label": named[LABEL],
        **meta,
    }
