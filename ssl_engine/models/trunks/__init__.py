"""Trunks: the backbone networks, each registered by name with ``register_model_trunk``.

A trunk class may define ``derive_config(cfg)``: the settings it derives from the whole
config, filled in place by the config's derivations (``derive_settings``, through
``derive_trunk_config``); and ``check_config(model_cfg)``: the launcher calls it before any
process starts, so that a bad MODEL.TRUNK setting is refused with its key's name;
``StagedTrunk``'s ``__init__`` calls it too, for a trunk built directly.
"""
from ssl_engine.models.registry import MODEL_TRUNKS
# registers alexnet_deepcluster, alexnet_bvlc, alexnet_jigsaw, alexnet_rotnet, alexnet_colorization
from ssl_engine.models.trunks.alexnet import ALEXNET_TRUNKS  # noqa: F401
from ssl_engine.models.trunks.beit import BEiTTrunk  # noqa: F401  (registers "beit")
from ssl_engine.models.trunks.classy_vit import ClassyViTTrunk  # noqa: F401  ("classy_vit")
from ssl_engine.models.trunks.convit import ConViTTrunk  # noqa: F401  ("convit")
from ssl_engine.models.trunks.convnext import ConvNeXtTrunk  # noqa: F401  ("convnext")
from ssl_engine.models.trunks.efficientnet import EfficientNetTrunk  # noqa: F401  ("efficientnet")
from ssl_engine.models.trunks.mobilenet import (  # noqa: F401  ("mobilenetv3_tv", "_timm")
    MobileNetV3TimmTrunk, MobileNetV3TVTrunk)
from ssl_engine.models.trunks.regnet import RegNetTrunk  # noqa: F401  (registers "regnet")
from ssl_engine.models.trunks.resnet import ResNetTrunk  # noqa: F401  (registers "resnet")
from ssl_engine.models.trunks.resnet_sk import ResNetSKTrunk  # noqa: F401  ("resnet_sk")
# registers "swin_transformer"
from ssl_engine.models.trunks.swin_transformer import SwinTransformerTrunk  # noqa: F401
# registers "vision_transformer"
from ssl_engine.models.trunks.vision_transformer import VisionTransformerTrunk  # noqa: F401
from ssl_engine.models.trunks.xcit import XCiTTrunk  # noqa: F401  ("xcit", "xcit_fsdp")
from ssl_engine.utils.derivations import register_config_derivation


def derive_trunk_config(cfg) -> None:
    """What the trunk MODEL.TRUNK.NAME derives from ``cfg`` (its ``derive_config``), in place;
    nothing for a name no trunk has (refused later, with the known names)."""
    if cfg.MODEL.TRUNK.NAME in MODEL_TRUNKS:
        derive = getattr(MODEL_TRUNKS.get(cfg.MODEL.TRUNK.NAME), "derive_config", None)
        if derive is not None:
            derive(cfg)


register_config_derivation("trunk", derive_trunk_config)


def check_trunk_config(model_cfg) -> None:
    """The trunk MODEL.TRUNK.NAME exists and accepts its settings (without building it)."""
    trunk_class = MODEL_TRUNKS.get(model_cfg.TRUNK.NAME)
    check = getattr(trunk_class, "check_config", None)
    if check is not None:
        check(model_cfg)
