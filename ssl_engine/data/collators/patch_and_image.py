import torch

from ssl_engine.data.collators.common import num_views, view_major_meta
from ssl_engine.data.registry import register_collator


@register_collator("patch_and_image_collator")
def patch_and_image_collator(samples):
    """PIRL's samples (``ImgPilToPatchesAndImage``: view 0 the image, views 1.. its patches) ->
    "input" {"images": [B, C, H, W], "patches": [B*P, C, h, w] sample-major (rows 0..P-1: the
    patches of sample 0, as siamese_concat_view reads them)}; target, data_idx and data_valid:
    one per sample [B], the image's."""
    views = num_views(samples)
    if views < 2:
        raise ValueError("patch_and_image_collator takes an image and its patches per sample "
                         f"(ImgPilToPatchesAndImage), got {views} view(s)")
    images = torch.stack([sample["data"][0] for sample in samples])
    patches = torch.stack([patch for sample in samples for patch in sample["data"][1:]])
    return {"input": {"images": images, "patches": patches}, **view_major_meta(samples, [0])}
