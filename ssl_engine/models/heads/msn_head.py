"""MSN's head (Assran et al. 2022): a 3-layer projection MLP (GELU, batch norm with ``use_bn``),
its output L2-normalised (the query), then the cosine of the query with each of
``num_prototypes`` learned prototypes.

The head gives the cosines [N, num_prototypes]; ``msn_loss`` divides them by its temperature
and takes the softmax (VISSL's head did that itself, with a temperature of its own: for
msn_loss the one temperature is LOSS.msn_loss.temperature, and msn_loss refuses a head
temperature).  With VISSL's ``temperature`` the head gives the cosines divided by it, VISSL's
scores: what a frozen MSN teacher of ``msn_distillation_loss`` gives.  Parameter names are VISSL's (``fc.fc1``,
``fc.bn1``, ``fc.fc2``, ``fc.bn2``, ``fc.fc3``, ``prototypes``), so its checkpoints load.
"""
from collections import OrderedDict
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ssl_engine.models.registry import register_model_head


@register_model_head("msn_head")
class MSNHead(nn.Module):
    """``in_dim -> hidden_dim -> hidden_dim -> output_dim`` (GELU after the first two linear
    layers, BatchNorm1d before each GELU with ``use_bn``), L2-normalised, then cosines with the
    L2-normalised rows of ``prototypes`` [num_prototypes, output_dim].

    Linear weights start from a truncated normal of std 0.02 and zero biases, the prototypes
    from a uniform on +-1/sqrt(output_dim), as in MSN.  ``freeze_prototypes`` keeps them
    fixed; ``return_query`` gives the normalised projection instead of the cosines (to
    evaluate it).  ``temperature`` (VISSL's key; default none): the cosines are divided by it
    (an MSN teacher; msn_loss refuses it, its temperature is LOSS.msn_loss.temperature).
    ``label_smoothing`` is not implemented.
    """

    def __init__(
        self,
        in_dim: int,
        num_prototypes: int,
        use_bn: bool = False,
        hidden_dim: int = 2048,
        output_dim: int = 256,
        freeze_prototypes: bool = False,
        label_smoothing: float = 0.0,
        temperature: Optional[float] = None,
        return_query: bool = False,
    ):
        super().__init__()
        if temperature is not None and not float(temperature) > 0:
            raise ValueError(f"msn_head: temperature must be > 0, got {temperature}")
        if label_smoothing:
            raise ValueError(f"msn_head: label_smoothing={label_smoothing} is not implemented "
                             "(0 only)")
        if int(num_prototypes) < 1:
            raise ValueError(f"msn_head needs num_prototypes >= 1, got {num_prototypes}")
        layers = OrderedDict()
        layers["fc1"] = nn.Linear(int(in_dim), int(hidden_dim))
        if use_bn:
            layers["bn1"] = nn.BatchNorm1d(int(hidden_dim))
        layers["gelu1"] = nn.GELU()
        layers["fc2"] = nn.Linear(int(hidden_dim), int(hidden_dim))
        if use_bn:
            layers["bn2"] = nn.BatchNorm1d(int(hidden_dim))
        layers["gelu2"] = nn.GELU()
        layers["fc3"] = nn.Linear(int(hidden_dim), int(output_dim))
        self.fc = nn.Sequential(layers)
        for layer in self.fc:
            if isinstance(layer, nn.Linear):
                nn.init.trunc_normal_(layer.weight, std=0.02)
                nn.init.zeros_(layer.bias)
        bound = float(output_dim) ** -0.5
        self.prototypes = nn.Parameter(
            torch.empty(int(num_prototypes), int(output_dim)).uniform_(-bound, bound),
            requires_grad=not freeze_prototypes)
        self.in_dim, self.num_prototypes = int(in_dim), int(num_prototypes)
        self.return_query = bool(return_query)
        self.temperature = None if temperature is None else float(temperature)

    def query(self, x: torch.Tensor) -> torch.Tensor:
        """The L2-normalised projection of the flattened input."""
        x = torch.flatten(x, 1)
        if x.shape[1] != self.in_dim:
            raise ValueError(f"msn_head expects {self.in_dim} input features (in_dim), got "
                             f"{x.shape[1]}")
        return F.normalize(self.fc(x), dim=1)

    def scores(self, query: torch.Tensor) -> torch.Tensor:
        """Cosines of normalised queries with the prototypes: [N, num_prototypes] (divided by
        ``temperature`` when the head has one)."""
        cosines = query @ F.normalize(self.prototypes, dim=1).t()
        return cosines if self.temperature is None else cosines / self.temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        query = self.query(x)
        return query if self.return_query else self.scores(query)
