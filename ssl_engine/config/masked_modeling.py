"""Settings of masked image modelling (iBOT, MAE) filled in before launch, as VISSL
auto-completes them: the masking collator's input and target names from INPUT_KEY_NAMES and
TARGET_KEY_NAMES, ibot_loss's crop counts, output sizes and epochs, mae_loss's patch size."""
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models.trunks.vision_transformer import NAMED_SIZES

MASKING_COLLATOR = "ibot_multicrop_masking_collator"


def _collator_keys(cfg: AttrDict) -> None:
    for split in ("TRAIN", "TEST"):
        split_cfg = cfg.DATA[split]
        if split_cfg.COLLATE_FUNCTION != MASKING_COLLATOR:
            continue
        params = dict(split_cfg.COLLATE_FUNCTION_PARAMS or {})
        if list(split_cfg.INPUT_KEY_NAMES) != ["data"]:  # "data": the default, not set
            params.setdefault("input_keys", list(split_cfg.INPUT_KEY_NAMES))
        params.setdefault("target_keys", list(split_cfg.TARGET_KEY_NAMES))
        split_cfg.COLLATE_FUNCTION_PARAMS = AttrDict(params)


def _crop_counts(transforms):
    """(crops of the first size, crops of the others) of ImgPilToMultiCrop, or None."""
    for spec in transforms or []:
        if isinstance(spec, dict) and spec.get("name") == "ImgPilToMultiCrop":
            counts = [int(c) for c in spec.get("num_crops", [])]
            return (counts[0], sum(counts[1:])) if counts else None
    return None


def _last_head_params(cfg: AttrDict, name: str):
    heads = cfg.MODEL.HEAD.PARAMS or []
    head = heads[-1] if heads else None
    if isinstance(head, (list, tuple)) and len(head) == 2 and head[0] == name:
        return head[1] or {}
    return None


def _check_class_token(cfg: AttrDict, head) -> None:
    """ibot_head reads the class token first in lastBLK; a ViT without one needs pool_patches."""
    vit = cfg.MODEL.TRUNK.get("VISION_TRANSFORMERS") or {}
    if cfg.MODEL.TRUNK.NAME != "vision_transformer" or vit.get("USE_CLASS_TOKEN", True):
        return
    if not head.get("pool_patches", False):
        raise ValueError("config.MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN=false gives "
                         "ibot_head patch tokens only: set the head's pool_patches: true (the "
                         "image's row is then the mean of the patch tokens) and give the local "
                         "views lastPOOL")


def derive_masked_modeling(cfg: AttrDict) -> None:
    _collator_keys(cfg)
    name = cfg.LOSS.name
    if name == "ibot_loss":
        loss = cfg.LOSS.ibot_loss
        counts = None if cfg.TEST_ONLY else _crop_counts(cfg.DATA.TRAIN.TRANSFORMS)
        if counts:
            loss.num_global_crops, loss.num_local_crops = counts
        head = _last_head_params(cfg, "ibot_head")
        if head is not None:
            _check_class_token(cfg, head)
            loss.out_dim = int(head.get("out_dim", 8192))
            shared = head.get("shared_head", True)
            patch = head.get("patch_out_dim")
            loss.patch_out_dim = int(loss.out_dim if shared or patch is None else patch)
        loss.num_epochs = int(cfg.OPTIMIZER.num_epochs)
    elif name == "mae_loss":
        vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
        named = NAMED_SIZES.get(vit.get("name") or "")
        cfg.LOSS.mae_loss.patch_size = named[0] if named else int(vit.PATCH_SIZE)
