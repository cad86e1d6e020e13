"""A multi-layer perceptron head: projection heads of SimCLR/MoCo, linear classifiers."""
from typing import List, Sequence

import torch
from torch import nn

from ssl_engine.models.registry import register_model_head


@register_model_head("mlp")
class MLP(nn.Module):
    """Linear layers of sizes ``dims`` = [in, hidden..., out] on the flattened input.

    After every linear layer: BatchNorm1d when ``use_bn``, then ReLU when ``use_relu``; the last
    layer gets neither when ``skip_last_layer_relu_bn``, or batch norm alone (no ReLU) with
    ``last_layer_bn`` (the output norm of SimSiam's and MoCo v3's projectors).  The linear
    layers have biases unless ``use_bias`` is false (VISSL's Barlow Twins projector).
    """

    def __init__(
        self,
        dims: Sequence[int],
        use_bn: bool = False,
        use_relu: bool = False,
        skip_last_layer_relu_bn: bool = True,
        last_layer_bn: bool = False,
        use_bias: bool = True,
    ):
        super().__init__()
        dims = [int(d) for d in dims]
        if len(dims) < 2:
            raise ValueError(f"mlp head needs dims [in, ..., out] (at least 2 sizes), got {dims}")
        layers: List[nn.Module] = []
        num_linear = len(dims) - 1
        for index in range(num_linear):
            layers.append(nn.Linear(dims[index], dims[index + 1], bias=use_bias))
            if index == num_linear - 1 and skip_last_layer_relu_bn:
                if last_layer_bn:
                    layers.append(nn.BatchNorm1d(dims[index + 1]))
                continue
            if use_bn:
                layers.append(nn.BatchNorm1d(dims[index + 1]))
            if use_relu:
                layers.append(nn.ReLU(inplace=True))
        self.clf = nn.Sequential(*layers)
        self.in_dim, self.out_dim = dims[0], dims[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(x, 1)
        if x.shape[1] != self.in_dim:
            raise ValueError(
                f"mlp head expects {self.in_dim} input features (dims[0]), got {x.shape[1]}"
            )
        return self.clf(x)
