import torch

from ssl_engine.data.collators.common import num_views, view_major, view_major_meta
from ssl_engine.data.registry import register_collator


@register_collator("simclr_collator")
def simclr_collator(samples):
    """n same-size views per sample -> "input" [n*B, C, H, W] in view-major order (rows 0..B-1
    are view 0 of every sample); target, data_idx and data_valid follow the same order."""
    views = list(range(num_views(samples)))
    return {"input": torch.stack(view_major(samples, views)), **view_major_meta(samples, views)}
