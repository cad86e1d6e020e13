import torch

from ssl_engine.data.collators.common import num_views, view_major, view_major_meta
from ssl_engine.data.registry import register_collator


def resolution_groups(sample: dict):
    """Runs of consecutive views with the same shape, as lists of view positions."""
    groups, last_shape = [], None
    for position, view in enumerate(sample["data"]):
        if view.shape != last_shape:
            groups.append([])
            last_shape = view.shape
        groups[-1].append(position)
    return groups


@register_collator("multicrop_collator")
def multicrop_collator(samples):
    """Views grouped by resolution -> "input": one view-major tensor per group, e.g.
    [[2B, C, 224, 224], [6B, C, 96, 96]]; target, data_idx and data_valid cover every row of
    every group, in the same order (first group first)."""
    num_views(samples)
    groups = resolution_groups(samples[0])
    all_views = [v for group in groups for v in group]
    return {
        "input": [torch.stack(view_major(samples, group)) for group in groups],
        **view_major_meta(samples, all_views),
    }
