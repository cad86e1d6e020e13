"""ResNet / ResNeXt trunk (depth 18, 34, 50, 101, 152, 200) built from torchvision's blocks.

Submodule names match torchvision's ResNet (conv1, bn1, layer1..layer4), so at width 1.0 a
torchvision state dict without ``fc.*`` loads as is (resnext50_32x4d's too, with GROUPS 32
and WIDTH_PER_GROUP 4).  Every stage's channels scale with MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER;
the 3x3 convolutions of the bottleneck blocks have GROUPS groups of
WIDTH_PER_GROUP x WIDTH_MULTIPLIER channels each (stage planes x WIDTH_PER_GROUP / 64 x GROUPS).
With MODEL.INPUT_TYPE lab (colorization models, LAB tensors of ImgPil2LabTensor) conv1 has one
input channel and reads the L channel, as VISSL's trunk does.

The stage names are VISSL's: ``conv1`` is the stem's convolution, batch norm and ReLU (before
the max-pool, half the input's side with the standard stem), ``res1`` the max-pool after it,
``res2``..``res5`` the four residual stages and ``res5avg`` their pooled output.
"""
from typing import Callable, List

import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, conv1x1

from ssl_engine.models.activation_checkpointing import checkpointed_segments, checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk

# depth -> (block, number of blocks per stage)
RESNET_DEPTHS = {
    18: (BasicBlock, (2, 2, 2, 2)),
    34: (BasicBlock, (3, 4, 6, 3)),
    50: (Bottleneck, (3, 4, 6, 3)),
    101: (Bottleneck, (3, 4, 23, 3)),
    152: (Bottleneck, (3, 8, 36, 3)),
    200: (Bottleneck, (3, 24, 36, 3)),
}
CONFIG = "config.MODEL.TRUNK.RESNETS"
STEM_CHANNELS = 64
STAGE_PLANES = (64, 128, 256, 512)


def scaled(channels: int, width_multiplier: float) -> int:
    return max(1, int(round(channels * width_multiplier)))


def make_norm_layer(norm: str, groups: int) -> Callable[[int], nn.Module]:
    """A constructor ``channels -> norm module`` for MODEL.TRUNK.RESNETS.NORM."""
    if norm == "BatchNorm":
        return nn.BatchNorm2d
    if norm == "GroupNorm":

        def group_norm(channels: int) -> nn.Module:
            if channels % groups:
                raise ValueError(
                    f"MODEL.TRUNK.RESNETS.GROUPNORM_GROUPS={groups} does not divide a layer of "
                    f"{channels} channels; pick a divisor or change WIDTH_MULTIPLIER"
                )
            return nn.GroupNorm(groups, channels)

        return group_norm
    raise ValueError(f"MODEL.TRUNK.RESNETS.NORM must be BatchNorm or GroupNorm, got '{norm}'")


def check_resnet_config(cfg) -> None:
    """Refuse invalid or unsupported MODEL.TRUNK.RESNETS values (messages name the key)."""
    depth = int(cfg.DEPTH)
    if depth not in RESNET_DEPTHS:
        raise ValueError(f"{CONFIG}.DEPTH must be one of {sorted(RESNET_DEPTHS)}, got {depth}")
    width = float(cfg.WIDTH_MULTIPLIER)
    if width <= 0:
        raise ValueError(f"{CONFIG}.WIDTH_MULTIPLIER must be > 0, got {width}")
    make_norm_layer(cfg.NORM, int(cfg.GROUPNORM_GROUPS))
    groups, per_group = int(cfg.get("GROUPS", 1)), int(cfg.get("WIDTH_PER_GROUP", 64))
    if groups < 1 or per_group < 1:
        raise ValueError(f"{CONFIG}.GROUPS={groups} and WIDTH_PER_GROUP={per_group} must be at "
                         "least 1")
    if RESNET_DEPTHS[depth][0] is BasicBlock and (groups, per_group) != (1, 64):
        raise ValueError(f"{CONFIG}.GROUPS={groups} / WIDTH_PER_GROUP={per_group}: grouped "
                         f"convolutions (ResNeXt) need bottleneck blocks, DEPTH 50 or more "
                         f"(DEPTH={depth} has basic blocks); keep GROUPS 1 and WIDTH_PER_GROUP 64")
    if int(cfg.get("LAYER4_STRIDE", 2)) not in (1, 2):
        raise ValueError(f"{CONFIG}.LAYER4_STRIDE must be 1 or 2, got {cfg.LAYER4_STRIDE!r}")
    if int(cfg.get("SMALL_IMAGE_STEM_STRIDE", 1)) not in (1, 2):
        raise ValueError(f"{CONFIG}.SMALL_IMAGE_STEM_STRIDE must be 1 or 2, got "
                         f"{cfg.SMALL_IMAGE_STEM_STRIDE!r}")
    if int(cfg.get("SMALL_IMAGE_STEM_STRIDE", 1)) != 1 and not cfg.get("SMALL_IMAGE_STEM"):
        raise ValueError(f"{CONFIG}.SMALL_IMAGE_STEM_STRIDE applies to the small-image stem: "
                         "set SMALL_IMAGE_STEM true, or leave the stride at 1")
    if cfg.get("STANDARDIZE_CONVOLUTIONS", False):
        raise ValueError(f"{CONFIG}.STANDARDIZE_CONVOLUTIONS=True is not supported: the trunk "
                         "has no weight-standardized convolutions; set it to false")


@register_model_trunk("resnet")
class ResNetTrunk(StagedTrunk):
    """Stages: conv1 (stem before the max-pool), res1 (max-pool), res2..res5 (layer1..4),
    res5avg (pooled, [N, C])."""

    default_out_feat_key = "res5avg"
    VISSL_KEY_PREFIX = "_feature_blocks."  # torchvision's names here, VISSL's _feature_blocks.

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_resnet_config(model_cfg.TRUNK.RESNETS)
        checkpointing_splits(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        cfg = model_cfg.TRUNK.RESNETS
        block, num_blocks = RESNET_DEPTHS[int(cfg.DEPTH)]
        width = float(cfg.WIDTH_MULTIPLIER)
        norm_layer = make_norm_layer(cfg.NORM, int(cfg.GROUPNORM_GROUPS))
        block_args = dict(groups=int(cfg.get("GROUPS", 1)),
                          base_width=int(cfg.get("WIDTH_PER_GROUP", 64)), norm_layer=norm_layer)
        strides = (1, 2, 2, int(cfg.get("LAYER4_STRIDE", 2)))

        stem = scaled(STEM_CHANNELS, width)
        # LAB input: the L channel only (the first of the 3)
        self.lab_input = str(model_cfg.get("INPUT_TYPE", "rgb")) == "lab"
        in_channels = 1 if self.lab_input else 3
        if cfg.SMALL_IMAGE_STEM:
            self.conv1 = nn.Conv2d(in_channels, stem, kernel_size=3, padding=1, bias=False,
                                   stride=int(cfg.get("SMALL_IMAGE_STEM_STRIDE", 1)))
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, stem, kernel_size=7, stride=2, padding=3,
                                   bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = norm_layer(stem)
        self.relu = nn.ReLU(inplace=True)

        self.stage_dims = {"conv1": stem, "res1": stem}
        in_channels = stem
        for index, (planes, blocks, stride) in enumerate(zip(STAGE_PLANES, num_blocks, strides)):
            planes = scaled(planes, width)
            layer = make_stage(block, in_channels, planes, blocks, stride, block_args)
            self.add_module(f"layer{index + 1}", layer)
            in_channels = planes * block.expansion
            self.stage_dims[f"res{index + 2}"] = in_channels
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.stage_dims["res5avg"] = in_channels

        self._init_weights(bool(cfg.ZERO_INIT_RESIDUAL))
        self.checkpoint_splits = checkpointing_splits(model_cfg)

    def _init_weights(self, zero_init_residual: bool) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if zero_init_residual:
            for module in self.modules():
                if isinstance(module, Bottleneck):
                    nn.init.zeros_(module.bn3.weight)
                elif isinstance(module, BasicBlock):
                    nn.init.zeros_(module.bn2.weight)

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the stages."""
        return [self.layer1, self.layer2, self.layer3, self.layer4]

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn1(self.conv1(x)))

    def _pool(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.avgpool(x), 1)

    def stages(self):
        layers = [self.layer1, self.layer2, self.layer3, self.layer4]
        stem = self._stem
        if self.checkpoint_splits and self.training and torch.is_grad_enabled():
            # the stem as one segment (the max-pool after it holds nothing to recompute); each
            # stage's residual blocks in checkpoint_splits
            stem = checkpointed_segments([StemBlock(self)], 1)
            layers = [checkpointed_segments(layer, self.checkpoint_splits) for layer in layers]
        if self.lab_input:
            stem = on_l_channel(stem)
        return [
            ("conv1", stem),
            ("res1", self.maxpool),
            *((f"res{index + 2}", layer) for index, layer in enumerate(layers)),
            ("res5avg", self._pool),
        ]


def on_l_channel(stem: Callable) -> Callable:
    """``stem`` applied to the first channel (L) of LAB images [N, 3, H, W]."""
    return lambda x: stem(x[:, :1])


class StemBlock(nn.Module):
    """The stem of ``trunk`` as a module (for checkpointing), holding no parameters of its own."""

    def __init__(self, trunk: "ResNetTrunk"):
        super().__init__()
        self.parts = nn.ModuleList([trunk.conv1, trunk.bn1, trunk.relu])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part in self.parts:
            x = part(x)
        return x


def make_stage(
    block, in_channels: int, planes: int, blocks: int, stride: int, block_args: dict
) -> nn.Sequential:
    """``blocks`` residual blocks; the first changes stride/channels through a 1x1 projection.
    ``block_args``: the blocks' groups, base_width and norm_layer."""
    out_channels = planes * block.expansion
    downsample = None
    if stride != 1 or in_channels != out_channels:
        downsample = nn.Sequential(
            conv1x1(in_channels, out_channels, stride), block_args["norm_layer"](out_channels)
        )
    layers: List[nn.Module] = [block(in_channels, planes, stride, downsample, **block_args)]
    layers += [block(out_channels, planes, **block_args) for _ in range(1, blocks)]
    return nn.Sequential(*layers)
