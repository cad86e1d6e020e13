"""iBOT's head (Zhou et al. 2022): DINO's head applied to the class token and to every patch
token, the patches scored by the same prototypes (``shared_head``) or by their own."""
from typing import List, Optional, Sequence, Union

import torch
from torch import nn

from ssl_engine.models.heads.dino_head import DINOHead, WeightNormLinear
from ssl_engine.models.registry import register_model_head


@register_model_head("ibot_head")
class IBOTHead(DINOHead):
    """``dino_head`` (its MLP, bottleneck and ``prototypes0``: ``out_dim`` class-token scores)
    plus ``prototypes1``, the patches' weight-normalised layer to ``patch_out_dim`` scores:
    with ``shared_head``, ``prototypes0`` itself under a second name (so VISSL's
    TEMP_FROZEN_PARAMS_ITER_MAP entries ``heads.0.prototypes1.weight_v`` name it too).

    Input: the trunk's ``lastBLK`` tokens [N, 1 + L, D] of the global views, optionally
    followed by the ``lastCLS`` features [M, D] of the local views (MULTI_INPUT_HEAD_MAPPING's
    order).  Output: [class-token scores [N + M, out_dim] (global rows first), patch scores
    [N, L, patch_out_dim]].  Given features [N, D] alone (an evaluation): [class scores].

    ``pool_patches`` is for a trunk without a class token (``USE_CLASS_TOKEN: false``): the
    tokens [N, L, D] are all patches, and the image's row is the mean of them (``lastPOOL``,
    which the local views should then also give).

    ``separate_head`` (DINOv2's ``ibot.separate_head``): the patch tokens go through a head of
    their own, ``patch_head`` (its own MLP, bottleneck and prototypes, built as this one), so
    the image and patch losses share no head weights; ``prototypes1`` names its prototypes."""

    def __init__(self, in_dim: int, out_dim: int = 8192, patch_out_dim: Optional[int] = None,
                 shared_head: bool = True, normalize_last_layer: bool = True,
                 use_bn: bool = False, num_layers: int = 3, hidden_dim: int = 2048,
                 bottleneck_dim: int = 256, pool_patches: bool = False,
                 separate_head: bool = False):
        super().__init__(in_dim, [out_dim], use_bn=use_bn,
                         normalize_last_layer=normalize_last_layer, num_layers=num_layers,
                         hidden_dim=hidden_dim, bottleneck_dim=bottleneck_dim)
        patch_out_dim = int(out_dim if patch_out_dim is None else patch_out_dim)
        if shared_head and separate_head:
            raise ValueError("ibot_head: shared_head (one set of prototypes for class and patch "
                             "tokens) and separate_head (a whole head for the patches) exclude "
                             "each other")
        if shared_head and patch_out_dim != int(out_dim):
            raise ValueError(f"ibot_head: shared_head scores the patches with the class "
                             f"token's prototypes, so patch_out_dim={patch_out_dim} must equal "
                             f"out_dim={out_dim}")
        self.shared_head = bool(shared_head)
        self.pool_patches = bool(pool_patches)
        self.separate_head = bool(separate_head)
        self.out_dim, self.patch_out_dim = int(out_dim), patch_out_dim
        self.num_outputs = 2
        if self.shared_head:  # the same module under both names, as iBOT's shared head
            self.prototypes1 = self.prototypes0
        elif self.separate_head:  # its prototypes also under prototypes1, as the other modes
            self.patch_head = DINOHead(in_dim, [patch_out_dim], use_bn=use_bn,
                                       normalize_last_layer=normalize_last_layer,
                                       num_layers=num_layers, hidden_dim=hidden_dim,
                                       bottleneck_dim=bottleneck_dim)
            self.prototypes1 = self.patch_head.prototypes0
        else:
            self.prototypes1 = WeightNormLinear(bottleneck_dim, patch_out_dim)
            self.prototypes1.weight_g.requires_grad = not normalize_last_layer

    def forward(self, x: Union[torch.Tensor, Sequence[torch.Tensor]]) -> List[torch.Tensor]:
        parts = [x] if isinstance(x, torch.Tensor) else list(x)
        tokens, rest = parts[0], parts[1:]
        if tokens.ndim == 2:  # class-token features only
            return [self.prototypes0(self.bottleneck(torch.cat(parts, dim=0)))]
        if tokens.ndim != 3 or any(part.ndim != 2 for part in rest):
            raise ValueError(f"ibot_head takes the tokens [N, 1 + L, D] of the global views and "
                             f"optionally class-token features [M, D], got "
                             f"{[tuple(p.shape) for p in parts]}")
        if self.pool_patches:  # no class token: the image's row is the mean of its patches
            tokens = torch.cat([tokens.mean(dim=1, keepdim=True), tokens], dim=1)
        rows, length, dim = tokens.shape
        if self.separate_head:
            classes = self.bottleneck(torch.cat([tokens[:, 0]] + rest, dim=0))
            patches = self.patch_head.bottleneck(tokens[:, 1:].reshape(-1, dim))
            return [self.prototypes0(classes),
                    self.prototypes1(patches.view(rows, length - 1, -1))]
        flat = self.bottleneck(torch.cat([tokens.reshape(rows * length, dim)] + rest, dim=0))
        tokens_out = flat[:rows * length].view(rows, length, -1)
        classes = torch.cat([tokens_out[:, 0]] + [flat[rows * length:]], dim=0)
        return [self.prototypes0(classes), self.prototypes1(tokens_out[:, 1:])]
