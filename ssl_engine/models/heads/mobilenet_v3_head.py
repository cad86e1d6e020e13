"""MobileNet V3's classifier as a head: torchvision's layout (VISSL's ``mobilenet_v3_head``) and
timm's (``mobilenet_v3_head_timm``)."""
import math

import torch
from torch import nn

from ssl_engine.models.registry import register_model_head


@register_model_head("mobilenet_v3_head")
class MobileNetV3Head(nn.Module):
    """``Linear(in_channels, mid_channels) -> Hardswish -> Dropout(drop_out) ->
    Linear(mid_channels, num_classes)`` on the flattened trunk output (``classifier.0`` and
    ``classifier.3``, VISSL's and torchvision's names).  With ``with_bn``, a BatchNorm2d over the
    channels (``channel_bn``, MODEL.HEAD.BATCHNORM_EPS / MOMENTUM) comes first: a linear probe
    on normalised features.  Linear weights start from N(0, 0.01), biases from 0."""

    def __init__(self, in_channels: int = 960, mid_channels: int = 1280,
                 num_classes: int = 1000, drop_out: float = 0.2, with_bn: bool = False):
        super().__init__()
        self.in_channels = int(in_channels)
        self.channel_bn = nn.BatchNorm2d(self.in_channels) if with_bn else None
        self.classifier = nn.Sequential(
            nn.Linear(self.in_channels, int(mid_channels)),
            nn.Hardswish(),
            nn.Dropout(p=float(drop_out)),
            nn.Linear(int(mid_channels), int(num_classes)),
        )
        for layer in self.classifier:
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, 0.0, 0.01)
                nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x[0].numel() != self.in_channels:
            raise ValueError(f"mobilenet_v3_head expects {self.in_channels} input features "
                             f"(in_channels), got {x[0].numel()}")
        if self.channel_bn is not None:
            x = self.channel_bn(x.reshape(x.shape[0], self.in_channels, 1, 1))
        return self.classifier(torch.flatten(x, 1))


@register_model_head("mobilenet_v3_head_timm")
class MobileNetV3TimmHead(nn.Module):
    """timm's MobileNet-V3 head after the feature map (for the mobilenetv3_timm trunk with
    MOBILE_NET.TRUNK_ONLY): global average ``->`` ``conv_head`` (1x1 convolution with bias,
    ``in_channels -> mid_channels``) ``->`` Hardswish ``->`` Dropout(drop_out) ``->``
    ``classifier`` Linear(mid_channels, num_classes).  Takes a map [N, C, H, W] or pooled
    features [N, C].  Layers start as timm starts them."""

    def __init__(self, in_channels: int = 960, mid_channels: int = 1280,
                 num_classes: int = 1000, drop_out: float = 0.0):
        super().__init__()
        self.in_channels = int(in_channels)
        self.conv_head = nn.Conv2d(self.in_channels, int(mid_channels), 1, bias=True)
        self.act = nn.Hardswish()
        self.dropout = nn.Dropout(p=float(drop_out))
        self.classifier = nn.Linear(int(mid_channels), int(num_classes))
        # timm's MobileNet-V3 initialisation of these layers
        nn.init.kaiming_normal_(self.conv_head.weight, mode="fan_out", nonlinearity="relu")
        nn.init.zeros_(self.conv_head.bias)
        bound = 1.0 / math.sqrt(int(num_classes))
        nn.init.uniform_(self.classifier.weight, -bound, bound)
        nn.init.zeros_(self.classifier.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x = x[:, :, None, None]
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"mobilenet_v3_head_timm expects [N, {self.in_channels}, H, W] "
                             f"or [N, {self.in_channels}] (in_channels), got {tuple(x.shape)}")
        pooled = x.mean(dim=(2, 3), keepdim=True)
        return self.classifier(self.dropout(torch.flatten(self.act(self.conv_head(pooled)), 1)))
