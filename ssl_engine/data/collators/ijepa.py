"""I-JEPA's collator (Assran et al. 2023): the images and the grid positions of each image's
context and target blocks, as index tensors of one size for the whole batch."""
import torch

from ssl_engine.data.collators.common import num_views, view_major, view_major_meta
from ssl_engine.data.registry import register_collator

IMAGES, CONTEXT, TARGETS = "images", "context_index", "target_index"


def _positions(mask: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` True positions of the flattened ``mask``, in grid order."""
    return mask.flatten().nonzero().flatten()[:count]


@register_collator("ijepa_collator")
def ijepa_collator(samples):
    """Samples of one view whose "mask" is MultiBlockMasking's [1 + M, h, w] (context, then M
    target blocks) -> "input": {``images`` [B, C, H, W], ``context_index`` [B, Kc] (long),
    ``target_index`` [B, M, Kt] (long)}, "target" and "label" the labels. ``Kc`` is the smallest
    context of the batch and ``Kt`` its smallest target block: every context and block keeps
    its first positions in grid order, as I-JEPA's collator does. Name the inputs in
    MODEL.MULTI_INPUT_HEAD_MAPPING: [images, {feat_names: [lastBLK], additional_keys:
    [context_index, target_index]}]."""
    if num_views(samples) != 1:
        raise ValueError("ijepa_collator takes one view per sample (I-JEPA masks one image)")
    if any("mask" not in sample or sample["mask"][0].ndim != 3 for sample in samples):
        raise ValueError("ijepa_collator needs MultiBlockMasking's masks: end "
                         "DATA.TRAIN.TRANSFORMS with MultiBlockMasking")
    masks = [sample["mask"][0].bool() for sample in samples]
    counts = torch.stack([mask.flatten(1).sum(dim=1) for mask in masks])  # [B, 1 + M]
    context, target = int(counts[:, 0].min()), int(counts[:, 1:].min())
    if context < 1 or target < 1:
        raise ValueError("ijepa_collator: an image of the batch has an empty context or target "
                         "block (check MultiBlockMasking's scales against the patch grid)")
    meta = view_major_meta(samples, [0])
    label = meta.pop("target")
    inputs = {
        IMAGES: torch.stack(view_major(samples, [0])),
        CONTEXT: torch.stack([_positions(mask[0], context) for mask in masks]),
        TARGETS: torch.stack([torch.stack([_positions(block, target) for block in mask[1:]])
                              for mask in masks]),
    }
    return {"input": inputs, "target": label, "label": label, **meta}
