"""Models: the SSL model (trunk + heads), its trunks and heads, and ``build_model``."""
from ssl_engine.models import heads, trunks  # noqa: F401  (fill the registries)
from ssl_engine.models.base_ssl_model import BaseSSLMultiInputOutputModel, build_model
from ssl_engine.models.registry import (
    MODEL_HEADS,
    MODEL_TRUNKS,
    register_model_head,
    register_model_trunk,
)

__all__ = [
    "BaseSSLMultiInputOutputModel",
    "MODEL_HEADS",
    "MODEL_TRUNKS",
    "build_model",
    "register_model_head",
    "register_model_trunk",
]
