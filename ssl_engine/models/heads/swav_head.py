"""SwAV's head (Caron et al. 2020): a projection MLP, L2 normalisation, then one or several
sets of prototypes (linear maps without bias) scoring the normalised embedding."""
from typing import List, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ssl_engine.models.heads.dino_head import WeightNormLinear
from ssl_engine.models.registry import register_model_head

ACTIVATIONS = {"ReLU": lambda: nn.ReLU(inplace=True), "GELU": nn.GELU}


@register_model_head("swav_head")
class SwAVPrototypesHead(nn.Module):
    """``dims`` = [in, hidden..., embedding]: linear layers, each but the last followed by
    BatchNorm1d (``use_bn``) and ``activation_name`` (ReLU or GELU; the last gets them too
    unless ``skip_last_bn``); the embedding is L2-normalised (``normalize_feats``) and scored
    by ``len(num_clusters)`` prototype sets ``prototypes0``, ``prototypes1``, ... of
    ``num_clusters[k]`` vectors.

    Returns ``[embedding, scores0, scores1, ...]`` (``return_embeddings``) or the scores alone;
    the model passes them on as separate outputs.  ``num_clusters: []`` builds no prototypes
    (the projection alone, as VISSL's configs that extract or evaluate SwAV's embedding write).
    The prototypes are kept on the unit sphere by the loss's hook when
    ``LOSS.swav_loss.normalize_last_layer`` is on.  With ``use_weight_norm_prototypes`` each
    set is weight-normalised instead (``weight_g`` starting at 1, ``weight_v``: the
    parametrisation of dino_head's last layer, as VISSL's DINO configs on XCiT use it);
    ``activation_name`` (ReLU or GELU) follows the hidden layers.
    """

    def __init__(
        self,
        dims: Sequence[int],
        use_bn: bool = False,
        num_clusters: Sequence[int] = (3000,),
        use_bias: bool = True,
        return_embeddings: bool = True,
        skip_last_bn: bool = True,
        normalize_feats: bool = True,
        activation_name: str = "ReLU",
        use_weight_norm_prototypes: bool = False,
    ):
        super().__init__()
        dims = [int(d) for d in dims]
        num_clusters = [int(k) for k in num_clusters]
        if not dims:
            raise ValueError("swav_head needs dims [in, ..., embedding]")
        if num_clusters and min(num_clusters) < 1:
            raise ValueError(f"swav_head needs num_clusters >= 1 per prototype set, "
                             f"got {num_clusters}")
        if not num_clusters and not return_embeddings:
            raise ValueError("swav_head with num_clusters: [] outputs its embedding only: it "
                             "needs return_embeddings: true")
        if activation_name not in ACTIVATIONS:
            raise ValueError(f"swav_head: activation_name must be one of {sorted(ACTIVATIONS)}, "
                             f"got {activation_name!r}")
        layers: List[nn.Module] = []
        for index in range(len(dims) - 1):
            layers.append(nn.Linear(dims[index], dims[index + 1], bias=use_bias))
            if index == len(dims) - 2 and skip_last_bn:
                break
            if use_bn:
                layers.append(nn.BatchNorm1d(dims[index + 1]))
            layers.append(ACTIVATIONS[activation_name]())
        self.projection_head = nn.Sequential(*layers)
        self.normalize_feats = bool(normalize_feats)
        self.return_embeddings = bool(return_embeddings)
        self.num_clusters = num_clusters
        for index, clusters in enumerate(num_clusters):
            self.add_module(f"prototypes{index}", WeightNormLinear(dims[-1], clusters)
                            if use_weight_norm_prototypes
                            else nn.Linear(dims[-1], clusters, bias=False))
        self.in_dim, self.embedding_dim = dims[0], dims[-1]
        self.num_outputs = len(num_clusters) + int(self.return_embeddings)

    def prototype_layers(self) -> List[nn.Module]:
        return [getattr(self, f"prototypes{index}") for index in range(len(self.num_clusters))]

    @torch.no_grad()
    def normalize_prototypes(self) -> None:
        """Every prototype vector back to unit length; weight-normalised sets are left alone
        (their lengths are the trained ``weight_g``: VISSL's renormalisation wrote into the
        weight that weight norm recomputes at every forward, so it changed nothing)."""
        for layer in self.prototype_layers():
            if isinstance(layer, WeightNormLinear):  # its rows have the norms weight_g gives
                continue
            layer.weight.copy_(F.normalize(layer.weight, dim=1))

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        x = torch.flatten(x, 1)
        if x.shape[1] != self.in_dim:
            raise ValueError(
                f"swav_head expects {self.in_dim} input features (dims[0]), got {x.shape[1]}")
        embedding = self.projection_head(x)
        if self.normalize_feats:
            embedding = F.normalize(embedding, dim=1)
        scores = [layer(embedding) for layer in self.prototype_layers()]
        return [embedding, *scores] if self.return_embeddings else scores
