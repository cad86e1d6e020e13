"""ConvNeXt trunk (MODEL.TRUNK.NAME convnext), configured by MODEL.TRUNK.CONVNEXT with VISSL's
keys: ``DEPTH`` (blocks per stage, 4 stages), ``DIMS`` (channels per stage) and
``DROP_PATH_RATE`` (stochastic depth, rising linearly from 0 over all blocks).

The network: a stem (4x4 convolution of stride 4, then a LayerNorm over the channels), four
stages of blocks with a downsampling layer (LayerNorm over the channels, 2x2 convolution of
stride 2) before each stage but the first.  A block is a 7x7 depthwise convolution, a
LayerNorm, a linear layer to 4x the channels, GELU, a linear layer back, a per-channel scale
(layer scale, starting at 1e-6) and stochastic depth, added to its input.  The output is the
LayerNorm of the mean over positions of the last stage.  Every LayerNorm has eps 1e-6.

Parameter names are those of VISSL's convnext trunk, at the top level of the trunk:
``downsample_layers.<i>.{0,1}``, ``stages.<i>.<j>.{dwconv, norm, pwconv1, pwconv2, gamma}``,
``norm``.

Output: ``lastCLS`` ([N, DIMS[-1]], the default and only one).  VISSL's trunk returns this
one output whatever name is asked for; its configs call it lastCLS.
"""
from typing import List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torchvision.ops import StochasticDepth

from ssl_engine.models.activation_checkpointing import checkpointed_segments, checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.base import StagedTrunk, drop_path_rates

CONFIG = "config.MODEL.TRUNK.CONVNEXT"
NORM_EPS = 1e-6
LAYER_SCALE_INIT = 1e-6
INIT_STD = 0.02
NUM_STAGES = 4


class ChannelsFirstLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of an ``[N, C, H, W]`` tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias,
                            self.eps).permute(0, 3, 1, 2)


class Block(nn.Module):
    def __init__(self, dim: int, drop_path: float):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=NORM_EPS)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), LAYER_SCALE_INIT))
        self.drop_path = StochasticDepth(drop_path, "row") if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        branch = self.dwconv(x).permute(0, 2, 3, 1)  # [N, H, W, C]
        branch = self.gamma * self.pwconv2(self.act(self.pwconv1(self.norm(branch))))
        return x + self.drop_path(branch.permute(0, 3, 1, 2))


def check_convnext_config(model_cfg) -> None:
    """Refuse, naming the key, a MODEL.TRUNK.CONVNEXT setting the trunk cannot build."""
    cfg = model_cfg.TRUNK.CONVNEXT
    for key in ("DEPTH", "DIMS"):
        values = cfg.get(key)
        if (not isinstance(values, (list, tuple)) or len(values) != NUM_STAGES
                or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                           for v in values)):
            raise ValueError(f"{CONFIG}.{key}={values!r} must be {NUM_STAGES} integers >= 1 "
                             "(one per stage)")
    if not 0 <= float(cfg.DROP_PATH_RATE) < 1:
        raise ValueError(f"{CONFIG}.DROP_PATH_RATE={cfg.DROP_PATH_RATE!r} must be in [0, 1)")
    checkpointing_splits(model_cfg)


@register_model_trunk("convnext")
class ConvNeXtTrunk(StagedTrunk):
    """Output: lastCLS (the normed global average of the last stage); see the module docstring."""

    default_out_feat_key = "lastCLS"

    @classmethod
    def check_config(cls, model_cfg) -> None:
        check_convnext_config(model_cfg)

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        cfg = model_cfg.TRUNK.CONVNEXT
        depths, dims = [int(d) for d in cfg.DEPTH], [int(d) for d in cfg.DIMS]
        self.downsample_layers = nn.ModuleList([nn.Sequential(
            nn.Conv2d(3, dims[0], kernel_size=4, stride=4),
            ChannelsFirstLayerNorm(dims[0], eps=NORM_EPS))])
        for i in range(1, NUM_STAGES):
            self.downsample_layers.append(nn.Sequential(
                ChannelsFirstLayerNorm(dims[i - 1], eps=NORM_EPS),
                nn.Conv2d(dims[i - 1], dims[i], kernel_size=2, stride=2)))
        rates = drop_path_rates(float(cfg.DROP_PATH_RATE), sum(depths))
        stages = []
        for i in range(NUM_STAGES):
            first = sum(depths[:i])
            stages.append(nn.Sequential(*(Block(dims[i], rates[first + j])
                                          for j in range(depths[i]))))
        self.stages = nn.ModuleList(stages)
        self.norm = nn.LayerNorm(dims[-1], eps=NORM_EPS)
        self.checkpoint_splits = checkpointing_splits(model_cfg)
        self.stage_dims = {"lastCLS": dims[-1]}
        for module in self.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                nn.init.trunc_normal_(module.weight, std=INIT_STD)
                nn.init.zeros_(module.bias)

    @property
    def stages(self) -> nn.ModuleList:
        """The four stages of blocks (``stages.<i>.<j>``, VISSL's name; StagedTrunk's
        ``stages()`` is not used: forward runs the one output itself)."""
        return self._modules["stages"]

    def fsdp_units(self) -> List[nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the stages."""
        return list(self.stages)

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None
    ) -> List[torch.Tensor]:
        keys = self.check_out_feat_keys(out_feat_keys)
        for downsample, stage in zip(self.downsample_layers, self.stages):
            x = downsample(x)
            if self.checkpoint_splits and torch.is_grad_enabled():
                x = checkpointed_segments(list(stage), self.checkpoint_splits)(x)
            else:
                x = stage(x)
        output = self.norm(x.mean(dim=(-2, -1)))
        return [output for _ in keys]
