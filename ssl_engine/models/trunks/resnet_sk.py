"""SimCLR v2's ResNet with selective kernels (MODEL.TRUNK.NAME resnet_sk, section RESNETS_SK).

A bottleneck ResNet (DEPTH 50, 101 or 152; VISSL offers 152 only) whose every stage is
WIDTH_MULTIPLIER times as wide.  With SK_RATIO > 0:

- the stem is three 3x3 convolutions (the first of stride 2) instead of one 7x7;
- the 3x3 convolution of each bottleneck block is a selective kernel: one 3x3 convolution
  gives two branches of C channels each (batch norm + ReLU over both); their sum, averaged over
  space, goes through a 1x1 convolution to max(C x SK_RATIO, 32) channels, batch norm, ReLU
  and a 1x1 convolution back to 2 x C logits; a softmax over the two branches (per channel)
  weighs them and the weighted sum is the output;
- a block's projection shortcut average-pools (2x2, after padding the bottom and right edges
  with one row/column of zeros) before its 1x1 convolution, instead of striding it.

With SK_RATIO 0 it is the plain bottleneck ResNet (7x7 stem, 1x1 strided projection).

Every convolution is bias-free and followed by batch norm (eps 1e-5).  The modules are laid
out as VISSL's resnet_sk trunk lays them out, so the parameter names are VISSL's:
``net.0`` the stem, ``net.1`` .. ``net.4`` the stages, each ``blocks.<i>`` with
``projection`` (the first block only) and ``net`` (the residual branch); a VISSL resnet_sk
checkpoint's trunk (``trunk.net.*``) loads as it is.

Stages: conv1 (the stem, max-pool included), res2..res5 (``net.1`` .. ``net.4``) and res5avg
(res5 averaged over space, [N, C]: VISSL's only output of this trunk, the default).
"""
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

from ssl_engine.models.activation_checkpointing import checkpointed_segments, checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk

CONFIG = "config.MODEL.TRUNK.RESNETS_SK"
BLOCKS_PER_STAGE = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
STAGE_PLANES = (64, 128, 256, 512)
STAGE_STRIDES = (1, 2, 2, 2)
EXPANSION = 4
MIN_MIXING_CHANNELS = 32
BATCH_NORM_EPS = 1e-5


def check_resnet_sk_config(cfg) -> None:
    """Refuse invalid MODEL.TRUNK.RESNETS_SK values (messages name the key)."""
    depth = cfg.DEPTH
    if isinstance(depth, bool) or depth not in BLOCKS_PER_STAGE:
        raise ValueError(f"{CONFIG}.DEPTH must be one of {sorted(BLOCKS_PER_STAGE)}, got {depth!r}")
    width = cfg.WIDTH_MULTIPLIER
    if isinstance(width, bool) or not isinstance(width, (int, float)) or width < 1 \
            or width != int(width):
        raise ValueError(f"{CONFIG}.WIDTH_MULTIPLIER must be a whole number >= 1 (the stages "
                         f"have 64, 128, 256, 512 x WIDTH_MULTIPLIER planes), got {width!r}")
    ratio = cfg.SK_RATIO
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio < 0:
        raise ValueError(f"{CONFIG}.SK_RATIO must be a number >= 0 (0: no selective kernels), "
                         f"got {ratio!r}")


def _conv(in_channels: int, out_channels: int, kernel_size: int = 3, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride,
                     padding=(kernel_size - 1) // 2, bias=False)


def _norm(channels: int, relu: bool = True) -> nn.Sequential:
    """Batch norm, then ReLU or nothing (kept as a pair: parameters ``<i>.0.*``)."""
    return nn.Sequential(nn.BatchNorm2d(channels, eps=BATCH_NORM_EPS),
                         nn.ReLU() if relu else nn.Identity())


class SelectiveKernel(nn.Module):
    """The 3x3 convolution of a bottleneck block as two branches weighed per channel."""

    def __init__(self, channels: int, stride: int, sk_ratio: float):
        super().__init__()
        mixing = max(int(channels * sk_ratio), MIN_MIXING_CHANNELS)
        self.main_conv = nn.Sequential(_conv(channels, 2 * channels, stride=stride),
                                       _norm(2 * channels))
        self.mixing_conv = nn.Sequential(_conv(channels, mixing, kernel_size=1), _norm(mixing),
                                         _conv(mixing, 2 * channels, kernel_size=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branches = torch.stack(self.main_conv(x).chunk(2, dim=1))  # [2, N, C, H, W]
        context = branches.sum(dim=0).mean(dim=(2, 3), keepdim=True)  # [N, C, 1, 1]
        logits = torch.stack(self.mixing_conv(context).chunk(2, dim=1))  # [2, N, C, 1, 1]
        return (branches * logits.softmax(dim=0)).sum(dim=0)


class Projection(nn.Module):
    """The shortcut of a stage's first block: to ``out_channels`` at the block's stride."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, sk_ratio: float):
        super().__init__()
        if sk_ratio > 0:
            self.shortcut = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)),
                                          nn.AvgPool2d(kernel_size=2, stride=stride),
                                          _conv(in_channels, out_channels, kernel_size=1))
        else:
            self.shortcut = _conv(in_channels, out_channels, kernel_size=1, stride=stride)
        self.bn = _norm(out_channels, relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (or selective kernel) -> 1x1 (x4 channels), added to the shortcut, ReLU."""

    def __init__(self, in_channels: int, planes: int, stride: int, sk_ratio: float,
                 project: bool):
        super().__init__()
        out_channels = planes * EXPANSION
        self.projection = (Projection(in_channels, out_channels, stride, sk_ratio) if project
                           else nn.Identity())
        if sk_ratio > 0:
            middle = [SelectiveKernel(planes, stride, sk_ratio)]
        else:
            middle = [_conv(planes, planes, stride=stride), _norm(planes)]
        self.net = nn.Sequential(_conv(in_channels, planes, kernel_size=1), _norm(planes),
                                 *middle, _conv(planes, out_channels, kernel_size=1),
                                 _norm(out_channels, relu=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.projection(x) + self.net(x))


class Stage(nn.Module):
    """``num_blocks`` bottleneck blocks; the first projects and strides."""

    def __init__(self, num_blocks: int, in_channels: int, planes: int, stride: int,
                 sk_ratio: float):
        super().__init__()
        out_channels = planes * EXPANSION
        self.blocks = nn.ModuleList(
            [Bottleneck(in_channels, planes, stride, sk_ratio, project=True)]
            + [Bottleneck(out_channels, planes, 1, sk_ratio, project=False)
               for _ in range(num_blocks - 1)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def make_stem(channels: int, sk_ratio: float) -> nn.Sequential:
    """To ``channels`` at a quarter of the resolution: three 3x3 convolutions (the first two
    to half of ``channels``) with selective kernels, else one 7x7; then a 3x3 max-pool."""
    if sk_ratio > 0:
        half = channels // 2
        layers = [_conv(3, half, stride=2), _norm(half), _conv(half, half), _norm(half),
                  _conv(half, channels)]
    else:
        layers = [_conv(3, channels, kernel_size=7, stride=2)]
    return nn.Sequential(*layers, _norm(channels),
                         nn.MaxPool2d(kernel_size=3, stride=2, padding=1))


@register_model_trunk("resnet_sk")
class ResNetSKTrunk(StagedTrunk):
    """Stages: conv1 (stem with max-pool), res2..res5, res5avg (pooled, [N, C]; default)."""

    default_out_feat_key = "res5avg"

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_resnet_sk_config(model_cfg.TRUNK.RESNETS_SK)
        checkpointing_splits(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        cfg = model_cfg.TRUNK.RESNETS_SK
        width, sk_ratio = int(cfg.WIDTH_MULTIPLIER), float(cfg.SK_RATIO)
        channels = 64 * width
        layers: List[nn.Module] = [make_stem(channels, sk_ratio)]
        self.stage_dims = {"conv1": channels}
        for index, (planes, num_blocks, stride) in enumerate(
                zip(STAGE_PLANES, BLOCKS_PER_STAGE[int(cfg.DEPTH)], STAGE_STRIDES)):
            layers.append(Stage(num_blocks, channels, planes * width, stride, sk_ratio))
            channels = planes * width * EXPANSION
            self.stage_dims[f"res{index + 2}"] = channels
        self.stage_dims["res5avg"] = channels
        self.net = nn.Sequential(*layers)
        self._init_weights()
        self.checkpoint_splits = checkpointing_splits(model_cfg)

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def residual_stages(self) -> List[Stage]:
        return list(self.net)[1:]

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the stages."""
        return self.residual_stages()

    def stages(self):
        stem, layers = self.net[0], self.residual_stages()
        if self.checkpoint_splits and self.training and torch.is_grad_enabled():
            stem = checkpointed_segments([stem], 1)
            layers = [checkpointed_segments(list(layer.blocks), self.checkpoint_splits)
                      for layer in layers]
        return [
            ("conv1", stem),
            *((f"res{index + 2}", layer) for index, layer in enumerate(layers)),
            ("res5avg", lambda x: x.mean(dim=(2, 3))),
        ]
