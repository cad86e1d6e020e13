"""classy_vision's Vision Transformer as a trunk (MODEL.TRUNK.NAME classy_vit), configured by
MODEL.TRUNK.VISION_TRANSFORMERS as VISSL's classy_vit trunk reads it: ``IMAGE_SIZE``,
``PATCH_SIZE``, ``NUM_LAYERS``, ``NUM_HEADS``, ``HIDDEN_DIM``, ``MLP_DIM``, ``DROPOUT_RATE``,
``ATTENTION_DROPOUT_RATE`` and ``CLASSIFIER`` (token: the class token; gap: the mean of the
patch tokens).  VISSL's trunk passes no other key to classy_vision, so QKV_BIAS (the attention
projections always have biases), QK_SCALE, DROP_PATH_RATE, the CHECKPOINT_* switches and
USE_CLASS_TOKEN act on the vision_transformer trunk only; a preset ``name`` is refused.

The network is classy_vision's: a ``PATCH_SIZE`` convolution of that stride (``conv_proj``), a
class token (``class_token``, with CLASSIFIER token) before the patches, learned position
embeddings, pre-norm encoder layers (``torch.nn.MultiheadAttention``, an MLP ``MLP_DIM`` wide
with GELU), a final LayerNorm (eps 1e-6).  Inputs must be ``IMAGE_SIZE`` square.

Parameter names are VISSL's: the classy module is held as ``model`` (``model.conv_proj.*``,
``model.class_token``, ``model.encoder.pos_embedding``, ``model.encoder.layers.layer_<i>.*``,
``model.encoder.ln.*``), so VISSL checkpoints of this trunk load as they are.

Output: ``avgpool`` ([N, HIDDEN_DIM], the default and only one): the class token (or the
patch-token mean with CLASSIFIER gap) after the final norm.  VISSL's trunk returns this one
output whatever name is asked for; its configs call it avgpool.
"""
import logging
from typing import List, Optional, Sequence

import torch
from torch import nn

from ssl_engine.models.activation_checkpointing import checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk

logger = logging.getLogger(__name__)

CONFIG = "config.MODEL.TRUNK.VISION_TRANSFORMERS"
CLASSIFIERS = ("token", "gap")


def _classy_vision_transformer():
    # inside: classy_vision loads only when one of its trunks is used
    from ssl_engine.utils.classy import classy_vision  # noqa: F401  (warnings filtered)
    from classy_vision.models import VisionTransformer

    return VisionTransformer


def check_classy_vit_config(model_cfg) -> None:
    """Refuse, naming the key, a setting classy_vision's ViT cannot be built with."""
    cfg = model_cfg.TRUNK.VISION_TRANSFORMERS
    if model_cfg.get("INPUT_TYPE", "rgb") not in ("rgb", "bgr"):
        raise ValueError(f"config.MODEL.INPUT_TYPE={model_cfg.INPUT_TYPE!r} is not supported by "
                         "the classy_vit trunk (rgb or bgr: three input channels)")
    if cfg.get("name"):
        raise ValueError(f"{CONFIG}.name={cfg.name!r} is not read by the classy_vit trunk (nor "
                         "by VISSL's): set PATCH_SIZE, NUM_LAYERS, NUM_HEADS, HIDDEN_DIM, MLP_DIM "
                         "and leave name null")
    for key in ("IMAGE_SIZE", "PATCH_SIZE", "NUM_LAYERS", "NUM_HEADS", "HIDDEN_DIM", "MLP_DIM"):
        value = cfg.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{CONFIG}.{key}={value!r} must be an integer >= 1")
    if cfg.IMAGE_SIZE % cfg.PATCH_SIZE:
        raise ValueError(f"{CONFIG}.PATCH_SIZE={cfg.PATCH_SIZE} must divide "
                         f"IMAGE_SIZE={cfg.IMAGE_SIZE} (classy_vision's ViT)")
    if cfg.HIDDEN_DIM % cfg.NUM_HEADS:
        raise ValueError(f"{CONFIG}.NUM_HEADS={cfg.NUM_HEADS} must divide "
                         f"HIDDEN_DIM={cfg.HIDDEN_DIM}")
    if cfg.get("CLASSIFIER") not in CLASSIFIERS:
        raise ValueError(f"{CONFIG}.CLASSIFIER={cfg.get('CLASSIFIER')!r} must be token or gap "
                         "with the classy_vit trunk")
    for key in ("DROPOUT_RATE", "ATTENTION_DROPOUT_RATE"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"{CONFIG}.{key}={value!r} must be in [0, 1)")
    if checkpointing_splits(model_cfg):
        raise ValueError("config.MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING="
                         "true is not supported by the classy_vit trunk (classy_vision's encoder "
                         "runs its layers itself)")


@register_model_trunk("classy_vit")
class ClassyViTTrunk(StagedTrunk):
    """Output: avgpool (the normed class token, or patch mean); see the module docstring."""

    default_out_feat_key = "avgpool"

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_classy_vit_config(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        cfg = model_cfg.TRUNK.VISION_TRANSFORMERS
        logger.info("trunk classy_vit: classy_vision's ViT from VISION_TRANSFORMERS' IMAGE_SIZE, "
                    "PATCH_SIZE, NUM_LAYERS, NUM_HEADS, HIDDEN_DIM, MLP_DIM, the dropout rates "
                    "and CLASSIFIER (as VISSL's trunk, it reads no other key of the section)")
        self.model = _classy_vision_transformer()(
            image_size=int(cfg.IMAGE_SIZE), patch_size=int(cfg.PATCH_SIZE),
            num_layers=int(cfg.NUM_LAYERS), num_heads=int(cfg.NUM_HEADS),
            hidden_dim=int(cfg.HIDDEN_DIM), mlp_dim=int(cfg.MLP_DIM),
            dropout_rate=float(cfg.DROPOUT_RATE),
            attention_dropout_rate=float(cfg.ATTENTION_DROPOUT_RATE),
            classifier=str(cfg.CLASSIFIER))
        self.stage_dims = {"avgpool": int(cfg.HIDDEN_DIM)}

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the layers."""
        return list(self.model.encoder.layers)

    def stages(self):
        raise NotImplementedError("the classy_vit trunk has one output: call forward(x, "
                                  "out_feat_keys)")

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        keys = self.check_out_feat_keys(out_feat_keys)
        size = self.model.image_size
        if x.dim() != 4 or x.shape[-2:] != (size, size):
            raise ValueError(f"the classy_vit trunk takes {size} x {size} images "
                             f"(VISION_TRANSFORMERS.IMAGE_SIZE), got {tuple(x.shape)}")
        output = self.model(x)
        return [output for _ in keys]
