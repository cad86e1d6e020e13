import torch

from ssl_engine.data.collators.common import num_views, view_major_meta
from ssl_engine.data.registry import register_collator


@register_collator("default_collate")  # VISSL's name
@register_collator("default")
def default_collator(samples):
    """One view per sample -> {"input": [B, C, H, W], "target", "data_idx", "data_valid": [B]}."""
    views = num_views(samples)
    if views != 1:
        raise ValueError(
            f"the default collator takes one view per sample, got {views}: use simclr_collator "
            "or multicrop_collator"
        )
    return {"input": torch.stack([s["data"][0] for s in samples]), **view_major_meta(samples, [0])}
