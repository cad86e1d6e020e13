"""Forward a model over a data loader and yield the requested features batch by batch: shared
by the in-training evaluation (``labelled_features.py``, for the hooks) and the extraction of
splits to files (``ssl_engine.extraction.write_splits``), which this package may not import."""
from typing import Callable, Dict, Iterator, Tuple

import torch

FeaturesFn = Callable[[torch.Tensor], Dict[str, torch.Tensor]]


@torch.no_grad()
def feature_batches(features_fn: FeaturesFn, loader, device: torch.device
                    ) -> Iterator[Tuple[Dict[str, torch.Tensor], torch.Tensor, torch.Tensor]]:
    """Yield ``({layer: features [B, D] float32 on the CPU}, targets [B] (or [B, C] label
    rows), data_idx [B])`` for every batch of ``loader``. ``features_fn`` maps a batch input
    to named features; the caller puts the model in eval mode."""
    non_blocking = device.type == "cuda"
    for batch in loader:
        inputs = batch["input"]
        if isinstance(inputs, (list, tuple)):
            inputs = [x.to(device, non_blocking=non_blocking) for x in inputs]
        else:
            inputs = inputs.to(device, non_blocking=non_blocking)
        features = {name: (feats.flatten(1).float() if feats.is_floating_point()
                           else feats.flatten(1)).cpu()  # class indices stay integers
                    for name, feats in features_fn(inputs).items()}
        yield features, batch["target"], batch["data_idx"]
