"""Collators: a list of samples -> {"input", "target", "data_idx", "data_valid"} (and
"input_momentum" for moco_collator; "input" is a dict of named inputs for the masking
collator)."""
import functools

from ssl_engine.data.collators import (  # noqa: F401  (importing registers them)
    cutmixup,
    default,
    ijepa,
    masking,
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
