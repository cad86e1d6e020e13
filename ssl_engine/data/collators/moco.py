import torch

from ssl_engine.data.collators.common import num_views, view_major, view_major_meta
from ssl_engine.data.registry import register_collator


@register_collator("moco_collator")
def moco_collator(samples):
    """Two views per sample -> "input" [B, C, H, W] (view 0: the queries, seen by the model)
    and "input_momentum" [B, C, H, W] (view 1: the keys, seen by the momentum encoder);
    target, data_idx and data_valid of the queries."""
    views = num_views(samples)
    if views != 2:
        raise ValueError(f"moco_collator takes two views per sample (ImgReplicatePil with "
                         f"num_times: 2), got {views}")
    return {
        "input": torch.stack(view_major(samples, [0])),
        "input_momentum": torch.stack(view_major(samples, [1])),
        **view_major_meta(samples, [0]),
    }
