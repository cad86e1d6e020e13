"""Models: the SSL model (trunk + heads), its trunks and heads, and ``build_model``."""
from ssl_engine.models import heads, trunks  # noqa: F401  (fill the registries)
from ssl_engine.models.base_ssl_model import BaseSSLMultiInputOutputModel, build_model
from ssl_engine.models.fsdp_names import register_fsdp_names
from ssl_engine.models.registry import (
    MODEL_HEADS,
    MODEL_TRUNKS,
    register_model_head,
    register_model_trunk,
)

register_fsdp_names()  # VISSL's regnet_fsdp, swav_head_fsdp ...: the ordinary components

__all__ = [
    "BaseSSLMultiInputOutputModel",
    "MODEL_HEADS",
    "MODEL_TRUNKS",
    "build_model",
    "register_model_head",
    "register_model_trunk",
]
