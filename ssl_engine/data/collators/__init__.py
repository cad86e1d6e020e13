"""Collators: a list of samples -> {"input", "target", "data_idx", "data_valid"} (and
"input_momentum" for moco_collator)."""
import functools

from ssl_engine.data.collators import (  # noqa: F401  (importing registers them)
    cutmixup,
    default,
    moco,
    multicrop,
    patch_and_image,
    siamese,
    simclr,
)
from ssl_engine.data.registry import COLLATOR_REGISTRY


def build_collator(name: str, params=None):
    """The collator registered as ``name`` with keyword ``params`` bound (picklable for workers)."""
    collator = COLLATOR_REGISTRY.get(name)
    return functools.partial(collator, **dict(params)) if params else collator
