"""Trunks: the backbone networks, each registered by name with ``register_model_trunk``."""
from ssl_engine.models.trunks.resnet import ResNetTrunk  # noqa: F401  (registers "resnet")
# registers "vision_transformer"
from ssl_engine.models.trunks.vision_transformer import VisionTransformerTrunk  # noqa: F401
