"""The registries of model trunks and heads, filled by ``register_model_trunk/head``."""
from ssl_engine.utils.registry import Registry

MODEL_TRUNKS = Registry("model trunk")
MODEL_HEADS = Registry("model head")

register_model_trunk = MODEL_TRUNKS.register
register_model_head = MODEL_HEADS.register
