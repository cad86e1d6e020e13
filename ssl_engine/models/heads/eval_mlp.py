"""The linear-evaluation head: batch norm of the (frozen) features, then a linear classifier."""
from typing import Sequence

import torch
from torch import nn

from ssl_engine.models.heads.mlp import MLP
from ssl_engine.models.registry import register_model_head


@register_model_head("eval_mlp")
class EvalMLP(nn.Module):
    """BatchNorm1d(``in_channels``) on the flattened input when ``use_bn``, then an ``mlp`` head
    of sizes ``dims`` = [in_channels, ..., num_classes] (ReLU between its layers when
    ``use_relu``).  The batch norm puts features of any scale on one footing for the classifier;
    ``affine: false`` leaves out its scale and shift (MAE's linear probe: a batch norm without
    them, eps 1e-6, before the linear layer).

    ``dims[0]`` may also be ``in_channels`` times the positions of a pooled map (e.g. 512
    channels pooled to 2x1: dims [1024, ...]), as VISSL's configs write: the batch norm then
    normalises each channel over the batch and the positions (VISSL's BatchNorm2d on the
    [N, C, H, W] map) before the flattened map goes to the classifier.
    """

    def __init__(
        self,
        in_channels: int,
        dims: Sequence[int],
        use_bn: bool = True,
        use_relu: bool = False,
        eps: float = 1e-5,
        momentum: float = 0.1,
        affine: bool = True,
    ):
        super().__init__()
        in_channels = int(in_channels)
        dims = [int(d) for d in dims]
        if not dims or in_channels < 1 or dims[0] < in_channels or dims[0] % in_channels:
            raise ValueError(
                f"eval_mlp head: dims must start with in_channels={in_channels}, got dims={dims} "
                "(or with in_channels times the positions of the pooled map)"
            )
        self.positions = dims[0] // in_channels
        self.channel_bn = (
            nn.BatchNorm1d(in_channels, eps=eps, momentum=momentum, affine=bool(affine))
            if use_bn else None
        )
        self.mlp = MLP(dims, use_relu=use_relu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        if self.channel_bn is not None:
            channels = self.channel_bn.num_features
            if x.shape[1] != channels * self.positions:
                where = ("in_channels" if self.positions == 1
                         else f"in_channels={channels} x {self.positions} positions")
                raise ValueError(f"eval_mlp head expects {channels * self.positions} input "
                                 f"features ({where}), got {x.shape[1]}")
            if self.positions == 1:
                x = self.channel_bn(x)
            else:  # [N, C * P] is the flattened [N, C, ...] map: channel-major
                x = self.channel_bn(x.reshape(x.shape[0], -1, self.positions)).flatten(1)
        return self.mlp(x)
