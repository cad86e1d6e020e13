"""CutMix and MixUp on a batch (VISSL's ``cutmixup_collator``), with timm's ``Mixup``.

Each view position of the batch is mixed on its own (all samples' view 0, then view 1 ...):
images are blended (mixup) or pasted into each other (cutmix), and the targets become the
matching soft labels ``[N, num_classes]`` (with ``label_smoothing``). The cross-entropy loss
takes such targets; the accuracy meters count the target mass of the top-k classes.

``ssl_method`` lays the views out as a self-supervised method expects: none (supervised: one
view), ``simclr`` (every view, view-major), ``moco`` (view 0 as the queries, view 1 as the
keys) or ``swav`` (the multi-crop layout of multicrop_collator: one view-major tensor per run
of views of one resolution; VISSL's collator passed SwAV its mixed views as a list). The other keys are timm's ``Mixup`` arguments, VISSL's names: mixup_alpha, cutmix_alpha,
cutmix_minmax, prob, switch_prob, mode (batch / pair / elem), correct_lam, label_smoothing,
num_classes.

The random draws depend only on the batch's sample indices (not on the worker or on what ran
before), so a resumed run mixes its batches as the uninterrupted run did.
"""
from typing import List, Optional

import numpy as np
import torch

from ssl_engine.data.collators.common import num_views, view_major_meta
from ssl_engine.data.collators.multicrop import resolution_groups
from ssl_engine.data.registry import register_collator
from ssl_engine.data.seeding import seeded_rngs

SSL_METHODS = (None, "simclr", "moco", "swav")


def _batch_seed(samples: List[dict]) -> int:
    indices = [int(s["data_idx"]) for s in samples]
    return int(np.random.SeedSequence([len(indices), *indices]).generate_state(1)[0])


@register_collator("cutmixup_collator")
def cutmixup_collator(samples, ssl_method: Optional[str] = None, **mixup_params):
    """Mixed views and soft targets; see the module docstring."""
    from timm.data import Mixup

    if ssl_method not in SSL_METHODS:
        raise ValueError(f"cutmixup_collator: ssl_method={ssl_method!r} is not one of none, "
                         "simclr, moco, swav")
    views = num_views(samples)
    wanted = {None: 1, "moco": 2}.get(ssl_method)
    if wanted is not None and views != wanted:
        raise ValueError(f"cutmixup_collator with ssl_method={ssl_method} takes {wanted} view(s) "
                         f"per sample, got {views}")
    if len(samples) % 2:
        raise ValueError(f"cutmixup_collator needs an even batch, got {len(samples)} samples "
                         "(set DATA.TRAIN.DROP_LAST: true and an even BATCHSIZE_PER_REPLICA)")
    try:
        mixup = Mixup(**mixup_params)
    except TypeError as err:
        raise ValueError(f"cutmixup_collator: bad COLLATE_FUNCTION_PARAMS {mixup_params}: "
                         f"{err}") from None
    if any(isinstance(label, torch.Tensor) for s in samples for label in s["label"]):
        raise ValueError("cutmixup_collator mixes one class per image into soft labels; this "
                         "split's labels are vectors (an [N, C] label file or OneHotEncode): "
                         "use one class index per image")
    inputs, targets = [], []
    with seeded_rngs(_batch_seed(samples)):
        for view in range(views):
            images = torch.stack([s["data"][view] for s in samples])
            labels = torch.tensor([s["label"][view] for s in samples], dtype=torch.long)
            images, soft = mixup(images.clone(), labels)
            inputs.append(images)
            targets.append(soft)
    meta = view_major_meta(samples, list(range(views)))
    if ssl_method == "moco":
        rows = len(samples)
        return {"input": inputs[0], "input_momentum": inputs[1], "target": targets[0],
                "data_idx": meta["data_idx"][:rows], "data_valid": meta["data_valid"][:rows]}
    if ssl_method == "swav":
        return {"input": [torch.cat([inputs[v] for v in group])
                          for group in resolution_groups(samples[0])],
                "target": torch.cat(targets), "data_idx": meta["data_idx"],
                "data_valid": meta["data_valid"]}
    return {"input": torch.cat(inputs), "target": torch.cat(targets),
            "data_idx": meta["data_idx"], "data_valid": meta["data_valid"]}
