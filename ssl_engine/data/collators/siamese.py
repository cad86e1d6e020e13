import torch

from ssl_engine.data.collators.common import num_views, view_major_meta
from ssl_engine.data.registry import register_collator


@register_collator("siamese_collator")
def siamese_collator(samples):
    """One view per sample holding T tiles [T, C, H, W] (e.g. the patches of a jigsaw puzzle)
    -> "input" [B*T, C, H, W], sample-major (rows 0..T-1: the tiles of sample 0); target,
    data_idx and data_valid: one per sample [B]."""
    if num_views(samples) != 1 or samples[0]["data"][0].dim() != 4:
        raise ValueError("siamese_collator takes one view per sample, a [tiles, C, H, W] tensor; "
                         f"got {num_views(samples)} view(s) of shape "
                         f"{tuple(samples[0]['data'][0].shape)}")
    tiles = torch.stack([s["data"][0] for s in samples])
    return {"input": tiles.flatten(0, 1), **view_major_meta(samples, [0])}
