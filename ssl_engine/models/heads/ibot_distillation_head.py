"""The student head of VISSL's iBOT distillation configs (``ibot_distillation_head``): an MLP
in place of ``ibot_head``'s DINO head, giving class-token and patch scores the frozen iBOT
teacher's are distilled into (``ibot_distillation_loss``)."""
from typing import List, Optional, Sequence, Union

import torch
from torch import nn

from ssl_engine.models.heads.mlp import MLP
from ssl_engine.models.registry import register_model_head


@register_model_head("ibot_distillation_head")
class IBOTDistillationHead(nn.Module):
    """``mlp`` ``[in_dim, hidden_dim, out_dim]`` (two linear layers, as the ``mlp`` heads of
    VISSL's other distillation students; ``use_bn`` / ``use_relu`` as the mlp head's) on the
    class token of the global views and the ``lastCLS`` features of the local views, and on
    every patch token: with ``shared_head`` the same layers, else ``patch_mlp`` to
    ``patch_out_dim``.

    Input and output as ``ibot_head``'s: the ``lastBLK`` tokens [N, 1 + L, D] of the global
    views, optionally followed by the local views' features [M, D] -> [class scores
    [N + M, out_dim] (global rows first), patch scores [N, L, patch_out_dim]]; features [N, D]
    alone (an evaluation) -> [class scores]."""

    def __init__(self, in_dim: int, out_dim: int = 8192, patch_out_dim: Optional[int] = None,
                 shared_head: bool = True, hidden_dim: int = 2048, use_bn: bool = False,
                 use_relu: bool = False):
        super().__init__()
        patch_out_dim = int(out_dim if patch_out_dim is None else patch_out_dim)
        if shared_head and patch_out_dim != int(out_dim):
            raise ValueError(f"ibot_distillation_head: shared_head scores the patches with the "
                             f"class token's layers, so patch_out_dim={patch_out_dim} must "
                             f"equal out_dim={out_dim}")
        self.in_dim, self.out_dim, self.patch_out_dim = int(in_dim), int(out_dim), patch_out_dim
        self.shared_head = bool(shared_head)
        self.mlp = MLP([self.in_dim, int(hidden_dim), self.out_dim], use_bn=use_bn,
                       use_relu=use_relu)
        self.patch_mlp = self.mlp if self.shared_head else MLP(
            [self.in_dim, int(hidden_dim), patch_out_dim], use_bn=use_bn, use_relu=use_relu)
        self.num_outputs = 2

    def forward(self, x: Union[torch.Tensor, Sequence[torch.Tensor]]) -> List[torch.Tensor]:
        parts = [x] if isinstance(x, torch.Tensor) else list(x)
        tokens, rest = parts[0], parts[1:]
        if tokens.ndim == 2:  # class-token features only
            return [self.mlp(torch.cat(parts, dim=0))]
        if tokens.ndim != 3 or tokens.shape[2] != self.in_dim or any(
                part.ndim != 2 for part in rest):
            raise ValueError(f"ibot_distillation_head takes the tokens [N, 1 + L, {self.in_dim}] "
                             f"of the global views and optionally class-token features "
                             f"[M, {self.in_dim}], got {[tuple(p.shape) for p in parts]}")
        rows, length, dim = tokens.shape
        classes = self.mlp(torch.cat([tokens[:, 0]] + rest, dim=0))
        patches = self.patch_mlp(tokens[:, 1:].reshape(rows * (length - 1), dim))
        return [classes, patches.view(rows, length - 1, -1)]
