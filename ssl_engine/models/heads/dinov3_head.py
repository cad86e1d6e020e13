"""DINO's head for DINOv3's Gram anchoring (Siméoni et al. 2025): besides the prototype scores
it passes on the image features (KoLeo's input) and the global views' patch tokens (the Gram
term's input), so one head gives everything ``dinov3_loss`` reads."""
from typing import List, Sequence, Union

import torch

from ssl_engine.models.heads.dino_head import DINOHead
from ssl_engine.models.registry import register_model_head


@register_model_head("dinov3_head")
class DINOv3Head(DINOHead):
    """``dino_head`` (same settings and parameter names) on named inputs.

    Input: the trunk's ``lastBLK`` tokens [N, prefix + P, D] of the global views (``prefix``:
    ``prefix_tokens``, 1 with the ViT's class token, 0 with ``USE_CLASS_TOKEN: false``),
    optionally followed by the features [M, D] of the local views (``lastCLS``, or
    ``lastPOOL`` without a class token), in MULTI_INPUT_HEAD_MAPPING's order.
    Output: [image features [N + M, D] (a global view's: its class token, or the mean of its
    patch tokens without one), patch tokens [N, P, D], scores [N + M, num_clusters]].
    Given features [N, D] alone (an evaluation): [features, scores]."""

    def __init__(self, in_dim: int, num_clusters: Sequence[int], use_bn: bool = False,
                 normalize_last_layer: bool = True, num_layers: int = 3,
                 hidden_dim: int = 2048, bottleneck_dim: int = 256, prefix_tokens: int = 1):
        super().__init__(in_dim, num_clusters, use_bn=use_bn,
                         normalize_last_layer=normalize_last_layer, num_layers=num_layers,
                         hidden_dim=hidden_dim, bottleneck_dim=bottleneck_dim)
        if prefix_tokens not in (0, 1):
            raise ValueError(f"dinov3_head: prefix_tokens is 1 (a class token) or 0, got "
                             f"{prefix_tokens}")
        self.prefix_tokens = int(prefix_tokens)
        self.num_outputs = 3

    def forward(self, x: Union[torch.Tensor, Sequence[torch.Tensor]]) -> List[torch.Tensor]:
        parts = [x] if isinstance(x, torch.Tensor) else list(x)
        tokens, rest = parts[0], parts[1:]
        if tokens.ndim == 2:
            features = torch.cat(parts, dim=0)
            return [features, super().forward(features)]
        if tokens.ndim != 3 or any(part.ndim != 2 for part in rest):
            raise ValueError(f"dinov3_head takes the tokens [N, prefix + P, D] of the global "
                             f"views and optionally features [M, D], got "
                             f"{[tuple(p.shape) for p in parts]}")
        patches = tokens[:, self.prefix_tokens:]
        image = tokens[:, 0] if self.prefix_tokens else patches.mean(dim=1)
        features = torch.cat([image] + rest, dim=0)
        return [features, patches, super().forward(features)]
