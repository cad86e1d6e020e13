"""Losses, registered in classy_vision's loss registry, and ``build_loss`` for ``cfg.LOSS``.

Call convention: ``loss(output, target)`` with ``output`` the model's list of output tensors
(a lone tensor is accepted) and ``target`` a LongTensor.
"""
import warnings

from ssl_engine.utils.registry import lookup

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from classy_vision.losses import LOSS_REGISTRY, ClassyLoss

from ssl_engine.losses.cross_entropy_multiple_output_single_target import (  # noqa: E402
    CrossEntropyMultipleOutputSingleTargetLoss,
)
from ssl_engine.losses.simclr_info_nce_loss import SimclrInfoNCELoss  # noqa: E402
from ssl_engine.losses.moco_loss import MoCoLoss  # noqa: E402
from ssl_engine.losses.moco_v3_loss import MoCoV3Loss  # noqa: E402
from ssl_engine.losses.byol_loss import BYOLLoss  # noqa: E402
from ssl_engine.losses.simsiam_loss import SimSiamLoss  # noqa: E402
from ssl_engine.losses.barlow_twins_loss import BarlowTwinsLoss  # noqa: E402
from ssl_engine.losses.vicreg_loss import VICRegLoss  # noqa: E402
from ssl_engine.losses.swav_loss import SwAVLoss  # noqa: E402
from ssl_engine.losses.dino_loss import DINOLoss  # noqa: E402


def build_loss(loss_cfg) -> ClassyLoss:
    """The loss named ``loss_cfg.name``, built from its settings ``loss_cfg[name]``."""
    name = loss_cfg["name"]
    loss_class = lookup(LOSS_REGISTRY, name, "loss")
    return loss_class.from_config(loss_cfg.get(name) or {})


__all__ = [
    "build_loss",
    "LOSS_REGISTRY",
    "BarlowTwinsLoss",
    "BYOLLoss",
    "DINOLoss",
    "MoCoLoss",
    "MoCoV3Loss",
    "SimSiamLoss",
    "SwAVLoss",
    "VICRegLoss",
    "CrossEntropyMultipleOutputSingleTargetLoss",
    "SimclrInfoNCELoss",
]
