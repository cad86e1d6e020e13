"""One deterministic view per image for feature extraction.

A pretraining config's TRAIN split makes several random views of each image (``ImgReplicatePil``
or ``ImgPilToMultiCrop`` with a multi-view collator); feature extraction needs one row per
image, the same on every run. With ``EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW`` (the default)
each extracted split's pipeline is rewritten by this rule:

- a transform that makes views is dropped; ``ImgPilToMultiCrop`` becomes ``Resize`` +
  ``CenterCrop`` at its first (largest) crop size;
- ``RandomResizedCrop(size)`` becomes ``Resize(size)`` + ``CenterCrop(size)`` (the largest
  centred square at the crop's output size) and ``RandomCrop(size)`` becomes
  ``CenterCrop(size)``;
- every other random augmentation is dropped: torchvision classes named ``Random*`` and
  ``ColorJitter``, ``GaussianBlur``, ``ElasticTransform``, ``AutoAugment``, ``RandAugment``,
  ``TrivialAugmentWide``, ``AugMix``, and any transform class with
  ``random_augmentation = True`` (the SSL colour, blur and solarize transforms; set it on your
  own random transforms);
- the multi-view collators (simclr, moco, multicrop) become ``default``.

Everything else (Resize, CenterCrop, ToTensor, Normalize, user transforms not marked random)
is kept in order.

Used by the extraction (``extractor.py``), its pre-launch check (``engines/extract_features.py``)
and the record of what a split was extracted from (``files.extraction_signature``). The data
transforms only declare the class flags this rule reads (``random_augmentation``,
``makes_views``): ``ssl_engine.data`` imports nothing of the extraction.
"""
import copy
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ssl_engine.data.transforms import known_transforms

RANDOM_TORCHVISION = frozenset({"ColorJitter", "GaussianBlur", "ElasticTransform", "AutoAugment",
                                "RandAugment", "TrivialAugmentWide", "AugMix"})
MULTI_VIEW_COLLATORS = frozenset({"simclr_collator", "moco_collator", "multicrop_collator"})


class OneView(NamedTuple):
    transforms: List[Dict[str, Any]]  # the rewritten TRANSFORMS list
    collator: str                     # the rewritten COLLATE_FUNCTION
    changes: List[str]                # what was changed, for the log ([] when nothing)


def is_random(name: str, cls: Optional[type]) -> bool:
    """Whether the transform ``name`` (class ``cls``, None when unknown) draws random numbers."""
    if cls is not None and getattr(cls, "random_augmentation", False):
        return True
    return name.startswith("Random") or name in RANDOM_TORCHVISION


def makes_views(cls: Optional[type]) -> bool:
    return cls is not None and bool(getattr(cls, "makes_views", False))


def _deterministic_crop(spec: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
    """The deterministic counterpart of a random crop, or None when it has none."""
    name = spec["name"]
    if name == "RandomResizedCrop":
        size = spec.get("size")
        extra = {"interpolation": spec["interpolation"]} if "interpolation" in spec else {}
        return [{"name": "Resize", "size": size, **extra}, {"name": "CenterCrop", "size": size}]
    if name == "RandomCrop":
        return [{"name": "CenterCrop", "size": spec.get("size")}]
    if name == "ImgPilToMultiCrop":
        size = list(spec.get("size_crops") or [None])[0]
        return [{"name": "Resize", "size": size}, {"name": "CenterCrop", "size": size}]
    return None


def one_view(transforms: List[Dict[str, Any]], collator: str, where: str) -> OneView:
    """The rule above applied to a split's TRANSFORMS and COLLATE_FUNCTION; ``where`` is the
    split's key (``config.DATA.TRAIN``) for the messages. Raises ValueError when views are made
    and the collator is one of the user's own (it may expect views: the rule cannot tell)."""
    known = known_transforms()
    kept, changes, dropped_views = [], [], False
    for spec in transforms:
        spec = dict(spec)
        name = spec.get("name", "")
        cls = known.get(name)
        replacement = _deterministic_crop(spec)
        if replacement is not None:
            kept += replacement
            changes.append(f"{name} -> {' + '.join(r['name'] for r in replacement)}")
        elif makes_views(cls) or is_random(name, cls):
            changes.append(f"dropped {name}")
        else:
            kept.append(spec)
            continue
        dropped_views = dropped_views or makes_views(cls)
    if collator in MULTI_VIEW_COLLATORS:
        changes.append(f"collator {collator} -> default")
        collator = "default"
    elif dropped_views and collator != "default":
        raise ValueError(
            f"{where}.COLLATE_FUNCTION={collator}: extraction reads one view per image, but this "
            f"collator may expect the views {where}.TRANSFORMS makes; set "
            f"{where}.COLLATE_FUNCTION=default (or give the split one-view TRANSFORMS)")
    return OneView(kept, collator, changes)


def check_extraction_pipeline(transforms: List[Dict[str, Any]], collator: str,
                              where: str) -> List[str]:
    """For ``EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=false``: ValueError if the split makes
    several views per image (extraction needs one row per image); else the names of the random
    augmentations left in it (each run then extracts different features)."""
    known = known_transforms()
    for index, spec in enumerate(transforms):
        if makes_views(known.get(spec.get("name", ""))):
            raise ValueError(
                f"{where}.TRANSFORMS[{index}] ({spec['name']}) makes several views per image, "
                "and extraction writes one row per image: remove it, or set "
                "config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=true")
    if collator in MULTI_VIEW_COLLATORS:
        raise ValueError(
            f"{where}.COLLATE_FUNCTION={collator} batches several views per image, and "
            f"extraction writes one row per image: set {where}.COLLATE_FUNCTION=default, or "
            "config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=true")
    return [spec.get("name", "") for spec in transforms
            if is_random(spec.get("name", ""), known.get(spec.get("name", "")))]


def extraction_config(cfg, splits: Sequence[str]) -> Tuple[Any, Dict[str, List[str]]]:
    """``cfg`` as extraction reads ``splits``: with EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW a
    copy whose splits have the one-view TRANSFORMS and COLLATE_FUNCTION, and {split: changes};
    without it ``cfg`` itself and {}."""
    if not cfg.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW:
        return cfg, {}
    cfg, changes = copy.deepcopy(cfg), {}
    for split in (split.upper() for split in splits):
        data = cfg.DATA[split]
        view = one_view(data.TRANSFORMS, data.COLLATE_FUNCTION, f"config.DATA.{split}")
        data.TRANSFORMS, data.COLLATE_FUNCTION = view.transforms, view.collator
        changes[split] = view.changes
    return cfg, changes


def check_extraction_splits(cfg, splits: Sequence[str]) -> Dict[str, List[str]]:
    """Before launch: ValueError for a split extraction cannot read one view per image from;
    else {split: the random augmentations left in it} (only without ONE_DETERMINISTIC_VIEW)."""
    if cfg.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW:
        extraction_config(cfg, splits)
        return {}
    left = {}
    for split in (split.upper() for split in splits):
        data = cfg.DATA[split]
        left[split] = check_extraction_pipeline(data.TRANSFORMS, data.COLLATE_FUNCTION,
                                                f"config.DATA.{split}")
    return {split: names for split, names in left.items() if names}
