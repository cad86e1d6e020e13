"""DINO's head (Caron et al. 2021): an MLP with GELU, an L2-normalised bottleneck, then a
weight-normalised linear layer without bias that gives the K scores of the loss."""
import math
from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ssl_engine.models.registry import register_model_head


class WeightNormLinear(nn.Module):
    """``x -> x W^T`` with every row of ``W`` written as ``g * v / |v|``: the parametrisation
    of ``torch.nn.utils.weight_norm(nn.Linear(in, out, bias=False))``, with its parameter names
    and shapes (``weight_g`` [out, 1], ``weight_v`` [out, in]), so VISSL's and DINO's state
    dicts and parameter names apply.  A plain module rather than that deprecated hook, whose
    module cannot be deep-copied (the teacher is a copy of the student); unlike
    ``torch.nn.utils.parametrizations.weight_norm``, it keeps the names ``weight_g``/``weight_v``.
    """

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.weight_v, a=math.sqrt(5))  # nn.Linear's initialisation
        self.weight_g = nn.Parameter(torch.ones(out_features, 1))

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_v * (self.weight_g / self.weight_v.norm(dim=1, keepdim=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


@register_model_head("dino_head")
class DINOHead(nn.Module):
    """``num_layers`` linear layers ``in_dim -> hidden_dim ... -> bottleneck_dim`` (GELU after
    all but the last, BatchNorm1d before it with ``use_bn``; one layer ``in_dim ->
    bottleneck_dim`` when ``num_layers`` is 1), the bottleneck L2-normalised, then
    ``prototypes0``: a weight-normalised linear layer to ``num_clusters[0]`` scores.  Its
    ``weight_g`` starts at 1 and stays there (no gradient) with ``normalize_last_layer``, so
    the scores are cosines of the bottleneck with unit prototypes.  The MLP's weights start
    from a truncated normal of std 0.02, its biases from 0.

    The name ``prototypes0`` is VISSL's: ``MODEL.TEMP_FROZEN_PARAMS_ITER_MAP`` entries
    ``heads.0.prototypes0.weight_v`` and ``heads.0.prototypes0.weight_g`` freeze it.
    """

    def __init__(
        self,
        in_dim: int,
        num_clusters: Sequence[int],
        use_bn: bool = False,
        normalize_last_layer: bool = True,
        num_layers: int = 3,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
    ):
        super().__init__()
        num_clusters = [int(k) for k in num_clusters]
        if len(num_clusters) != 1 or num_clusters[0] < 1:
            raise ValueError(f"dino_head takes one set of clusters, num_clusters: [K] with "
                             f"K >= 1, got {num_clusters}")
        if num_layers < 1:
            raise ValueError(f"dino_head needs num_layers >= 1, got {num_layers}")
        dims = [int(in_dim)] + [int(hidden_dim)] * (num_layers - 1) + [int(bottleneck_dim)]
        layers: List[nn.Module] = []
        for index in range(num_layers):
            layers.append(nn.Linear(dims[index], dims[index + 1]))
            if index < num_layers - 1:
                if use_bn:
                    layers.append(nn.BatchNorm1d(dims[index + 1]))
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        for layer in self.mlp:
            if isinstance(layer, nn.Linear):
                nn.init.trunc_normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
        self.prototypes0 = WeightNormLinear(dims[-1], num_clusters[0])
        self.prototypes0.weight_g.requires_grad = not normalize_last_layer
        self.in_dim, self.num_clusters = dims[0], num_clusters
        self.normalize_last_layer = bool(normalize_last_layer)

    def bottleneck(self, x: torch.Tensor) -> torch.Tensor:
        """The L2-normalised bottleneck features of the flattened input."""
        x = torch.flatten(x, 1)
        if x.shape[1] != self.in_dim:
            raise ValueError(
                f"dino_head expects {self.in_dim} input features (in_dim), got {x.shape[1]}")
        return F.normalize(self.mlp(x), dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.prototypes0(self.bottleneck(x))
