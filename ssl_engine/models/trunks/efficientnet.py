"""EfficientNet trunk (MODEL.TRUNK.NAME efficientnet) built by classy_vision.

MODEL.TRUNK.EFFICIENT_NETS holds VISSL's keys: ``model_version`` (B0..B7: classy's width and
depth coefficients, resolution and final dropout rate of that version), ``bn_momentum``,
``bn_epsilon``, ``drop_connect_rate`` (stochastic depth of the MBConv blocks, rising linearly
from 0 over the blocks), ``width_divisor``, ``min_width`` and ``use_se``.

The classy modules are held in ``_feature_blocks`` under VISSL's names, so parameter names are
those of VISSL's efficientnet trunk. Outputs, in forward order: ``conv1`` (stem), ``block0``,
``block1``, ... (every MBConv block), ``conv_final`` (the 1x1 head convolution, [N, C, H, W]),
``avgpool`` ([N, C, 1, 1]), ``flatten`` ([N, C]) and ``dropout`` ([N, C] through the version's
dropout while training; the default).
"""
from typing import List

from torch import nn

from ssl_engine.models.activation_checkpointing import checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk

CONFIG = "config.MODEL.TRUNK.EFFICIENT_NETS"


def _classy():
    # inside: classy_vision loads only when one of its trunks is used
    from ssl_engine.utils.classy import classy_vision  # noqa: F401  (warnings filtered)
    from classy_vision.models import efficientnet

    return efficientnet


def check_efficientnet_config(model_cfg) -> None:
    """Refuse invalid MODEL.TRUNK.EFFICIENT_NETS values (every message names the key)."""
    cfg = model_cfg.TRUNK.EFFICIENT_NETS
    versions = sorted(_classy().MODEL_PARAMS)
    if cfg.get("model_version") not in versions:
        raise ValueError(f"{CONFIG}.model_version={cfg.get('model_version')!r} is not one of "
                         f"{', '.join(versions)}")
    if not 0 <= float(cfg.bn_momentum) <= 1:
        raise ValueError(f"{CONFIG}.bn_momentum={cfg.bn_momentum!r} must be in [0, 1]")
    if float(cfg.bn_epsilon) <= 0:
        raise ValueError(f"{CONFIG}.bn_epsilon={cfg.bn_epsilon!r} must be > 0")
    if not 0 <= float(cfg.drop_connect_rate) < 1:
        raise ValueError(f"{CONFIG}.drop_connect_rate={cfg.drop_connect_rate!r} must be in "
                         "[0, 1)")
    if int(cfg.width_divisor) < 1:
        raise ValueError(f"{CONFIG}.width_divisor={cfg.width_divisor!r} must be at least 1")
    if cfg.get("min_width") is not None and int(cfg.min_width) < 1:
        raise ValueError(f"{CONFIG}.min_width={cfg.min_width!r} must be null or at least 1")
    if checkpointing_splits(model_cfg):
        raise ValueError("config.MODEL.ACTIVATION_CHECKPOINTING.USE_ACTIVATION_CHECKPOINTING="
                         "true is not supported by the efficientnet trunk (its blocks take a "
                         "per-block drop-connect rate)")


def build_classy_efficientnet(model_cfg) -> nn.Module:
    """classy_vision's EfficientNet for MODEL.TRUNK.EFFICIENT_NETS (checked by the trunk's
    ``check_config``)."""
    cfg = model_cfg.TRUNK.EFFICIENT_NETS
    efficientnet = _classy()
    return efficientnet.EfficientNet(
        num_classes=1,  # the classifier is not used
        model_params=efficientnet.MODEL_PARAMS[cfg.model_version],
        bn_momentum=float(cfg.bn_momentum),
        bn_epsilon=float(cfg.bn_epsilon),
        width_divisor=int(cfg.width_divisor),
        min_width=None if cfg.get("min_width") is None else int(cfg.min_width),
        drop_connect_rate=float(cfg.drop_connect_rate),
        use_se=bool(cfg.use_se),
    )


@register_model_trunk("efficientnet")
class EfficientNetTrunk(StagedTrunk):
    """Stages: conv1, block0.., conv_final, avgpool, flatten, dropout (default)."""

    default_out_feat_key = "dropout"

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_efficientnet_config(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        model = build_classy_efficientnet(model_cfg)
        blocks = list(model.blocks)
        stem_width = model.conv_stem.out_channels
        head_width = model.conv_head.out_channels
        self._feature_blocks = nn.ModuleDict(
            [("conv1", nn.Sequential(model.conv_stem, model.bn0, nn.SiLU()))]
            + [(f"block{index}", block) for index, block in enumerate(blocks)]
            + [("conv_final", nn.Sequential(model.conv_head, model.bn1, nn.SiLU())),
               ("avgpool", nn.AdaptiveAvgPool2d((1, 1))),
               ("flatten", nn.Flatten(1)),
               ("dropout", model.dropout or nn.Identity())]
        )
        # block i drops its residual branch with rate drop_connect_rate * i / number of blocks
        rate = model.drop_connect_rate
        self._rates = [rate * index / len(blocks) if rate else None
                       for index in range(len(blocks))]
        self.stage_dims = {"conv1": stem_width}
        self.stage_dims.update({f"block{index}": block.output_filters
                                for index, block in enumerate(blocks)})
        self.stage_dims.update(conv_final=head_width, avgpool=head_width, flatten=head_width,
                               dropout=head_width)

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the blocks."""
        return [block for name, block in self._feature_blocks.items()
                if name.startswith("block")]

    def stages(self):
        stages = []
        for name, module in self._feature_blocks.items():
            if name.startswith("block"):
                rate = self._rates[int(name[len("block"):])]
                stages.append((name, lambda x, module=module, rate=rate: module(
                    x, drop_connect_rate=rate)))
            else:
                stages.append((name, module))
        return stages
