"""Losses, registered in classy_vision's loss registry, and ``build_loss`` for ``cfg.LOSS``.

Every loss derives from ``SSLLoss`` (``losses/base.py``: the call convention and the members
the engine reads, with their defaults); ``build_loss`` gives a plain ``ClassyLoss`` registered
by a user (or by classy_vision) those defaults.
"""
from typing import Optional

from ssl_engine.losses.aim_loss import AIMLoss
from ssl_engine.losses.barlow_twins_loss import BarlowTwinsLoss
from ssl_engine.losses.base import SSLLoss, StepContext, with_contract
from ssl_engine.losses.bce_logits_multiple_output_single_target import (
    BCELogitsMultipleOutputSingleTargetLoss,
)
from ssl_engine.losses.byol_loss import BYOLLoss
from ssl_engine.losses.capi_loss import CAPILoss
from ssl_engine.losses.cross_entropy_multiple_output_single_target import (
    CrossEntropyMultipleOutputSingleTargetLoss,
)
from ssl_engine.losses.data2vec_loss import Data2VecLoss
from ssl_engine.losses.dcl_loss import DCLLoss, DCLWLoss
from ssl_engine.losses.deepclusterv2_loss import DeepClusterV2Loss
from ssl_engine.losses.dino_loss import DINOLoss
from ssl_engine.losses.gram_anchoring import DINOv3Loss
from ssl_engine.losses.distillation import DINODistillationLoss, DistillationLoss
from ssl_engine.losses.ibot_loss import IBOTLoss
from ssl_engine.losses.ijepa_loss import IJEPALoss
from ssl_engine.losses.lejepa_loss import LeJEPALoss
from ssl_engine.losses.mae_loss import MAELoss
from ssl_engine.losses.masked_distillation import IBOTDistillationLoss, MSNDistillationLoss
from ssl_engine.losses.moco_loss import MoCoLoss
from ssl_engine.losses.mmcr_loss import MMCRLoss
from ssl_engine.losses.moco_v3_loss import MoCoV3Loss
from ssl_engine.losses.msn_loss import MSNLoss
from ssl_engine.losses.multicrop_simclr_info_nce_loss import MultiCropSimclrInfoNCELoss
from ssl_engine.losses.nce_loss_with_memory import NCELossWithMemory
from ssl_engine.losses.nnclr_loss import NNCLRLoss
from ssl_engine.losses.pmsn_loss import PMSNLoss
from ssl_engine.losses.simclr_info_nce_loss import SimclrInfoNCELoss
from ssl_engine.losses.simsiam_loss import SimSiamLoss
from ssl_engine.losses.swav_distillation_loss import SwAVDistillationLoss
from ssl_engine.losses.swav_loss import SwAVLoss
from ssl_engine.losses.swav_momentum_loss import SwAVMomentumLoss
from ssl_engine.losses.vicreg_loss import VICRegLoss
from ssl_engine.utils.classy import LOSS_REGISTRY
from ssl_engine.utils.derivations import register_config_derivation
from ssl_engine.utils.registry import lookup


def loss_class(name: str):
    """The loss class registered as ``name``, with the ``SSLLoss`` members (``with_contract``):
    for the class-level ones, ``build_hooks`` and ``check_model_config``."""
    return with_contract(lookup(LOSS_REGISTRY, name, "loss"))


def derive_loss_config(cfg) -> None:
    """What the loss LOSS.name derives from ``cfg`` (its ``derive_config``), in place; nothing
    for a name no loss has (refused later, with the known names)."""
    if cfg.LOSS.name in LOSS_REGISTRY:
        loss_class(cfg.LOSS.name).derive_config(cfg)


register_config_derivation("loss", derive_loss_config)


def build_loss(loss_cfg, num_train_samples: Optional[int] = None) -> SSLLoss:
    """The loss named ``loss_cfg.name``, built from its settings ``loss_cfg[name]``.  A loss
    whose settings have ``num_train_samples`` (a memory bank's size) gets the size of the
    training set in its place when it is given, as VISSL filled it in."""
    name = loss_cfg["name"]
    settings = dict(loss_cfg.get(name) or {})
    if num_train_samples is not None and "num_train_samples" in settings:
        settings["num_train_samples"] = int(num_train_samples)
    return loss_class(name).from_config(settings)


__all__ = [
    "build_loss",
    "derive_loss_config",
    "loss_class",
    "LOSS_REGISTRY",
    "SSLLoss",
    "StepContext",
    "BarlowTwinsLoss",
    "BYOLLoss",
    "CAPILoss",
    "DINOLoss",
    "DINODistillationLoss",
    "DistillationLoss",
    "IBOTLoss",
    "IBOTDistillationLoss",
    "MSNDistillationLoss",
    "MAELoss",
    "MoCoLoss",
    "MoCoV3Loss",
    "MSNLoss",
    "SimSiamLoss",
    "SwAVLoss",
    "SwAVDistillationLoss",
    "VICRegLoss",
    "CrossEntropyMultipleOutputSingleTargetLoss",
    "SimclrInfoNCELoss",
    "MultiCropSimclrInfoNCELoss",
    "SwAVMomentumLoss",
    "BCELogitsMultipleOutputSingleTargetLoss",
    "DeepClusterV2Loss",
    "NCELossWithMemory",
    "NNCLRLoss",
    "DCLLoss",
    "DCLWLoss",
    "MMCRLoss",
    "PMSNLoss",
    "IJEPALoss",
    "AIMLoss",
    "LeJEPALoss",
    "Data2VecLoss",
    "DINOv3Loss",
]
