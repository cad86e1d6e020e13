"""AIM's prefix-causal attention (El-Nouby et al. 2024), as an additive mask for the ViT's blocks.

A prefix of the patches (in raster order) attends bidirectionally within itself; every later
patch attends causally (to itself and the patches before it). With the per-image ``causal``
mask [N, L] (True: the patch is after the prefix; the RandomPrefixMasking transform's), query
``i`` may attend to key ``j`` when ``j <= i`` or ``j`` is in the prefix. Tokens before the
patches (a class token) count as part of the prefix: they see the prefix only, and every
patch sees them.
"""
import torch


def prefix_causal_bias(causal: torch.Tensor, prefix_tokens: int,
                       dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask [N, 1, T, T] (0: may attend, -inf: may not) for ``causal``
    [N, L] (or [N, h, w]) with ``prefix_tokens`` tokens before the patches, T = prefix + L."""
    causal = causal.flatten(1).bool()
    rows, _ = causal.shape
    in_prefix = torch.cat([causal.new_zeros(rows, prefix_tokens), causal], dim=1).logical_not()
    tokens = in_prefix.shape[1]
    lower = torch.ones(tokens, tokens, dtype=torch.bool, device=causal.device).tril()
    allowed = lower.unsqueeze(0) | in_prefix.unsqueeze(1)  # [N, query, key]
    bias = torch.zeros(allowed.shape, dtype=dtype, device=causal.device)
    return bias.masked_fill(~allowed, float("-inf")).unsqueeze(1)
