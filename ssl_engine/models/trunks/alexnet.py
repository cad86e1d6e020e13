"""The AlexNet trunks of VISSL, used to evaluate published AlexNet checkpoints: one network
described by a small spec per variant.

- ``alexnet_deepcluster``: Sobel input (fixed grayscale + two Sobel kernels, 2 channels),
  batch norm after every convolution;
- ``alexnet_bvlc``: Caffe's AlexNet, no batch norm, grouped conv2/4/5, local response norm
  before pool1 and pool2;
- ``alexnet_jigsaw``: conv1 of stride 2, grouped conv2/4/5, local response norm after pool1
  and pool2, batch norm on conv3..5;
- ``alexnet_rotnet``: 64/192/384/256/256 channels, batch norm everywhere;
- ``alexnet_colorization``: the L channel of a LAB image (MODEL.INPUT_TYPE lab), grouped
  conv2/4/5, batch norm everywhere.

Every variant has nine blocks, run in order, whose outputs are the named stages
``conv1, pool1, conv2, pool2, conv3, conv4, conv5, pool5, flatten`` (the default output,
[N, C * H * W]: on the crops of VISSL's evaluation configs, 224 pixels for DeepCluster and
227 for the others, 256 x 6 x 6 = 9216 wide; 256 x 12 x 12 for jigsaw, whose conv1 has stride
2). A convolution block is conv, [batch norm,] ReLU; the pools are 3x3 max-pools of stride 2
without padding.

Parameter names are those of VISSL's trunks with ``_feature_blocks.`` left out, as for the
resnet trunk: block ``i`` is the child ``i`` (``trunk.0.0.weight`` is conv1's weight,
``trunk.0.1.running_mean`` its batch norm's), and DeepCluster's fixed Sobel filter is
``trunk.sobel.0`` (grayscale) and ``trunk.sobel.1`` (the two kernels), outside the blocks as
in VISSL. A VISSL checkpoint of these trunks therefore loads through the VISSL checkpoint
path (MODEL.WEIGHTS_INIT or a resume), see ssl_engine/checkpoint/formats.py.
"""
from typing import Dict, NamedTuple, Optional, Tuple

import torch
from torch import nn

from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk

STAGES = ("conv1", "pool1", "conv2", "pool2", "conv3", "conv4", "conv5", "pool5", "flatten")
CONV_STAGES = ("conv1", "conv2", "conv3", "conv4", "conv5")
# the Sobel kernels: horizontal then vertical gradient
SOBEL_KERNELS = (((1.0, 0.0, -1.0), (2.0, 0.0, -2.0), (1.0, 0.0, -1.0)),
                 ((1.0, 2.0, 1.0), (0.0, 0.0, 0.0), (-1.0, -2.0, -1.0)))


class Conv(NamedTuple):
    out_channels: int
    kernel: int
    stride: int = 1
    padding: int = 0
    groups: int = 1


class AlexNetSpec(NamedTuple):
    """One variant: its input, its five convolutions, where batch norm and LRN go."""

    input: str  # "rgb" (3 channels), "sobel" (rgb -> 2 gradient channels), "lab_l" (L of LAB)
    convs: Tuple[Conv, Conv, Conv, Conv, Conv]
    batch_norm: Tuple[bool, bool, bool, bool, bool]
    lrn: Optional[str] = None  # with pool1 and pool2: "before_pool", "after_pool" or None
    input_size: int = 227  # the crop of VISSL's evaluation configs (flatten's width in stage_dims)


INPUT_CHANNELS = {"rgb": 3, "sobel": 2, "lab_l": 1}
ALL_BN, NO_BN = (True,) * 5, (False,) * 5

ALEXNET_SPECS: Dict[str, AlexNetSpec] = {
    "alexnet_deepcluster": AlexNetSpec(
        "sobel", (Conv(96, 11, 4, 2), Conv(256, 5, 1, 2), Conv(384, 3, 1, 1),
                  Conv(384, 3, 1, 1), Conv(256, 3, 1, 1)), ALL_BN, input_size=224),
    "alexnet_bvlc": AlexNetSpec(
        "rgb", (Conv(96, 11, 4, 0), Conv(256, 5, 1, 2, 2), Conv(384, 3, 1, 1),
                Conv(384, 3, 1, 1, 2), Conv(256, 3, 1, 1, 2)), NO_BN, lrn="before_pool"),
    "alexnet_jigsaw": AlexNetSpec(
        "rgb", (Conv(96, 11, 2, 0), Conv(256, 5, 1, 2, 2), Conv(384, 3, 1, 1),
                Conv(384, 3, 1, 1, 2), Conv(256, 3, 1, 1, 2)), (False, False, True, True, True),
        lrn="after_pool"),
    "alexnet_rotnet": AlexNetSpec(
        "rgb", (Conv(64, 11, 4, 2), Conv(192, 5, 1, 2), Conv(384, 3, 1, 1),
                Conv(256, 3, 1, 1), Conv(256, 3, 1, 1)), ALL_BN),
    "alexnet_colorization": AlexNetSpec(
        "lab_l", (Conv(96, 11, 4, 0), Conv(256, 5, 1, 2, 2), Conv(384, 3, 1, 1),
                  Conv(384, 3, 1, 1, 2), Conv(256, 3, 1, 1, 2)), ALL_BN),
}


def conv_block(in_channels: int, conv: Conv, batch_norm: bool) -> nn.Sequential:
    layers = [nn.Conv2d(in_channels, conv.out_channels, conv.kernel, stride=conv.stride,
                        padding=conv.padding, groups=conv.groups)]
    if batch_norm:
        layers.append(nn.BatchNorm2d(conv.out_channels))
    layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def pool_block(lrn: Optional[str]) -> nn.Module:
    pool = nn.MaxPool2d(kernel_size=3, stride=2)
    if lrn is None:
        return pool
    norm = nn.LocalResponseNorm(size=5, alpha=1e-4, beta=0.75, k=1.0)
    return nn.Sequential(norm, pool) if lrn == "before_pool" else nn.Sequential(pool, norm)


def sobel_filter() -> nn.Sequential:
    """RGB -> mean of the channels -> the two Sobel gradients (fixed weights, no gradient)."""
    grayscale = nn.Conv2d(3, 1, kernel_size=1)
    sobel = nn.Conv2d(1, 2, kernel_size=3, padding=1)
    with torch.no_grad():
        grayscale.weight.fill_(1.0 / 3.0)
        grayscale.bias.zero_()
        sobel.weight.copy_(torch.tensor(SOBEL_KERNELS).unsqueeze(1))
        sobel.bias.zero_()
    filter_ = nn.Sequential(grayscale, sobel)
    for param in filter_.parameters():
        param.requires_grad = False
    return filter_


def _out_size(size: int, kernel: int, stride: int, padding: int = 0) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def flatten_width(spec: AlexNetSpec, size: int) -> int:
    """Width of the flatten output for square inputs of ``size`` pixels."""
    for index, conv in enumerate(spec.convs):
        size = _out_size(size, conv.kernel, conv.stride, conv.padding)
        if index in (0, 1, 4):  # pool1, pool2, pool5
            size = _out_size(size, 3, 2)
    return spec.convs[-1].out_channels * size * size


class AlexNetTrunk(StagedTrunk):
    """Stages: conv1, pool1, conv2, pool2, conv3, conv4, conv5, pool5, flatten (default)."""

    default_out_feat_key = "flatten"
    spec: AlexNetSpec
    trunk_name: str

    VISSL_KEY_PREFIX = "_feature_blocks."  # blocks 0..8 here, _feature_blocks.0..8 in VISSL

    @classmethod
    def check_config(cls, model_cfg) -> None:
        input_type = str(model_cfg.get("INPUT_TYPE", "rgb"))
        if cls.spec.input == "lab_l" and input_type != "lab":
            raise ValueError(f"config.MODEL.INPUT_TYPE={input_type}: the {cls.trunk_name} trunk "
                             "takes LAB images (its input is their L channel); set it to lab "
                             "and give LAB tensors")

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        spec = self.spec
        if spec.input == "sobel":
            self.sobel = sobel_filter()
        blocks, in_channels = [], INPUT_CHANNELS[spec.input]
        self.stage_dims = {}
        for index, (conv, batch_norm) in enumerate(zip(spec.convs, spec.batch_norm)):
            blocks.append(conv_block(in_channels, conv, batch_norm))
            in_channels = conv.out_channels
            self.stage_dims[CONV_STAGES[index]] = in_channels
            if index in (0, 1):
                blocks.append(pool_block(spec.lrn))
                self.stage_dims[f"pool{index + 1}"] = in_channels
        blocks += [nn.MaxPool2d(kernel_size=3, stride=2), nn.Flatten(1)]
        self.stage_dims["pool5"] = in_channels
        self.stage_dims["flatten"] = flatten_width(spec, spec.input_size)
        for index, block in enumerate(blocks):  # children "0".."8", VISSL's block indices
            self.add_module(str(index), block)
        self.stage_dims = {name: self.stage_dims[name] for name in STAGES}

    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.input == "sobel":
            return self.sobel(x)
        if self.spec.input == "lab_l":
            return x[:, :1]
        return x

    def stages(self):
        blocks = [self._modules[str(index)] for index in range(len(STAGES))]
        first = blocks[0]
        return [(STAGES[0], lambda x: first(self.prepare_input(x))),
                *zip(STAGES[1:], blocks[1:])]


def _register(name: str, spec: AlexNetSpec) -> type:
    cls = type(f"AlexNet_{name[len('alexnet_'):]}", (AlexNetTrunk,),
               {"spec": spec, "trunk_name": name, "__doc__": AlexNetTrunk.__doc__})
    return register_model_trunk(name)(cls)


ALEXNET_TRUNKS = {name: _register(name, spec) for name, spec in ALEXNET_SPECS.items()}
