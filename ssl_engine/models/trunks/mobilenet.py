"""MobileNet-V3 trunks: mobilenetv3_timm (timm's networks; see ``MobileNetV3TimmTrunk``) and
mobilenetv3_tv (MODEL.TRUNK.NAME mobilenetv3_tv): torchvision's MobileNet-V3 Large
without its classifier, configured by MODEL.TRUNK.MOBILE_NET as in VISSL:

- ``NAME``: ``mobilenetv3_large_100`` (the only network VISSL builds under this name);
- ``TIMM_BN``: false keeps torchvision's batch norms (eps 0.001, momentum 0.01); true uses
  timm's settings (eps 1e-5, momentum 0.1), those timm's weights were trained with;
- ``PRETRAINED``: false only (downloading weights is refused: load them with
  MODEL.WEIGHTS_INIT).

The network is held as ``model`` (``model.features.*``, ``model.avgpool``): VISSL's parameter
names, so VISSL checkpoints of this trunk load as they are.

Outputs, named as in VISSL:

- ``trunk_pool``: the global average of the last feature map, [N, 960] (the default, VISSL's
  output when no name is asked for);
- ``trunk_pool_norm``: the same, l2-normalised;
- ``trunk``: the last feature map, [N, 960, H/32, W/32].
"""
from functools import partial
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk

CONFIG = "config.MODEL.TRUNK.MOBILE_NET"
NAMES = ("mobilenetv3_large_100",)
WIDTH = 960


def check_mobilenet_config(model_cfg, names=NAMES) -> None:
    """Refuse, naming the key, a MODEL.TRUNK.MOBILE_NET setting the trunk cannot build
    (``names``: the networks it builds; None: checked by the trunk)."""
    cfg = model_cfg.TRUNK.MOBILE_NET
    if names is not None and cfg.NAME not in names:
        raise ValueError(f"{CONFIG}.NAME={cfg.NAME!r} is not one of {', '.join(NAMES)}")
    if cfg.get("PRETRAINED", False):
        raise ValueError(f"{CONFIG}.PRETRAINED=true is not supported: weights are not "
                         "downloaded; load them with MODEL.WEIGHTS_INIT")
    if model_cfg.get("ACTIVATION_CHECKPOINTING", {}).get("USE_ACTIVATION_CHECKPOINTING"):
        raise ValueError("MODEL.ACTIVATION_CHECKPOINTING is not supported by the "
                         f"{model_cfg.TRUNK.NAME} trunk")


@register_model_trunk("mobilenetv3_tv")
class MobileNetV3TVTrunk(StagedTrunk):
    """Outputs: trunk_pool (default), trunk_pool_norm, trunk; see the module docstring."""

    default_out_feat_key = "trunk_pool"

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_mobilenet_config(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        from torchvision.models import mobilenet_v3_large

        norm_layer = (partial(nn.BatchNorm2d, eps=1e-5, momentum=0.1)
                      if model_cfg.TRUNK.MOBILE_NET.get("TIMM_BN", False) else None)
        self.model = mobilenet_v3_large(weights=None, norm_layer=norm_layer)
        self.model.classifier = nn.Identity()
        self.stage_dims = {"trunk_pool": WIDTH, "trunk_pool_norm": WIDTH, "trunk": WIDTH}

    def stages(self):
        raise NotImplementedError("the MobileNet outputs share one pass: "
                                  "call forward(x, out_feat_keys)")

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        keys = self.check_out_feat_keys(out_feat_keys)
        feature_map = self.model.features(x)
        pooled = torch.flatten(self.model.avgpool(feature_map), 1)
        found = {"trunk": feature_map, "trunk_pool": pooled}
        if "trunk_pool_norm" in keys:
            found["trunk_pool_norm"] = F.normalize(pooled, dim=-1)
        return [found[key] for key in keys]


@register_model_trunk("mobilenetv3_timm")
class MobileNetV3TimmTrunk(StagedTrunk):
    """timm's MobileNet-V3 (MOBILE_NET.NAME, e.g. mobilenetv3_large_100) without its
    classifier, held as ``model`` (timm's parameter names under ``model.``).

    Outputs: ``trunk`` (the last feature map, [N, 960, H/32, W/32]), ``trunk_pool`` (its global
    average) and, unless MOBILE_NET.TRUNK_ONLY, ``flatten``: timm's features before the
    classifier (pooled, then timm's ``conv_head`` 960 -> 1280 and hard-swish), [N, 1280], the
    default.  With TRUNK_ONLY the trunk stops at the feature map (the default output then) and
    has no ``conv_head``: the ``mobilenet_v3_head_timm`` head holds it.  timm's network has
    timm's batch norms (TIMM_BN changes nothing here); PRETRAINED=true is refused.
    """

    @classmethod
    def check_config(cls, model_cfg) -> None:
        cfg = model_cfg.TRUNK.MOBILE_NET
        if not str(cfg.NAME).startswith("mobilenetv3_"):
            raise ValueError(f"{CONFIG}.NAME={cfg.NAME!r} is not one of timm's MobileNet-V3 "
                             "networks (mobilenetv3_large_100, mobilenetv3_small_100, ...)")
        check_mobilenet_config(model_cfg, names=None)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        import timm  # imported here: timm adds about half a second to every process

        cfg = model_cfg.TRUNK.MOBILE_NET
        self.model = timm.create_model(str(cfg.NAME), pretrained=False, num_classes=0)
        self.trunk_only = bool(cfg.get("TRUNK_ONLY", False))
        width = self.model.conv_head.in_channels
        self.stage_dims = {"trunk": width, "trunk_pool": width}
        if self.trunk_only:
            self.model.conv_head = self.model.norm_head = self.model.act2 = nn.Identity()
            self.default_out_feat_key = "trunk"
        else:
            self.stage_dims["flatten"] = self.model.conv_head.out_channels
            self.default_out_feat_key = "flatten"

    def stages(self):
        raise NotImplementedError("the MobileNet outputs share one pass: "
                                  "call forward(x, out_feat_keys)")

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        keys = self.check_out_feat_keys(out_feat_keys)
        feature_map = self.model.forward_features(x)
        found = {"trunk": feature_map, "trunk_pool": feature_map.mean(dim=(2, 3))}
        if "flatten" in keys:
            found["flatten"] = self.model.forward_head(feature_map, pre_logits=True)
        return [found[key] for key in keys]
