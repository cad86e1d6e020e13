"""Gradient clipping before every optimizer step: ``MODEL.GRAD_CLIP`` (VISSL's keys
``USE_GRAD_CLIP``, ``NORM_TYPE``, ``MAX_NORM``), as ``torch.nn.utils.clip_grad_norm_`` does it:
when the norm of all the model's gradients together exceeds ``MAX_NORM``, every gradient is
scaled by ``MAX_NORM / norm``.  The train step clips after the backward hooks (a parameter
frozen for now has no gradient and does not count) and after float16 gradients are unscaled.
With DDP every rank holds the same averaged gradients, so every rank clips alike.
"""
import math
from typing import Iterable, Mapping, Optional

import torch

KEY = "config.MODEL.GRAD_CLIP"


def norm_type_of(value) -> float:
    """``NORM_TYPE`` as a float: a positive number, or ``inf`` (the largest absolute value)."""
    try:
        norm_type = float(value)
    except (TypeError, ValueError):
        norm_type = math.nan
    if not norm_type > 0:
        raise ValueError(f"{KEY}.NORM_TYPE must be a positive number or inf, got {value!r}")
    return norm_type


class GradClip:
    """Clips the total ``norm_type``-norm of the gradients of some parameters to ``max_norm``."""

    def __init__(self, max_norm: float, norm_type=2.0):
        self.norm_type = norm_type_of(norm_type)
        self.max_norm = float(max_norm)
        if not self.max_norm > 0 or math.isinf(self.max_norm):
            raise ValueError(f"{KEY}.MAX_NORM must be a positive number, got {max_norm!r}")

    @classmethod
    def from_config(cls, clip_cfg: Optional[Mapping]) -> Optional["GradClip"]:
        """The clipping ``MODEL.GRAD_CLIP`` asks for, or None when ``USE_GRAD_CLIP`` is off."""
        if not clip_cfg or not clip_cfg.get("USE_GRAD_CLIP", False):
            return None
        return cls(clip_cfg.get("MAX_NORM", 1.0), clip_cfg.get("NORM_TYPE", 2.0))

    def __call__(self, parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor:
        """Clip in place; returns the total norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(parameters, self.max_norm, self.norm_type)
