"""METERS.model_output_mask: the meters read only the classes the split's labels contain.

A model trained on 1000 classes evaluated on a 200-class subset of them (ImageNet-A, ImageNet-R)
is scored among those 200: the scores of the classes no label of the split names are set to
-inf before the meters see them, so top-k picks among the subset's classes.  The loss and the
model's output are unchanged; only what the meters read is masked.
"""
from typing import List, Union

import numpy as np
import torch

Output = Union[torch.Tensor, List[torch.Tensor]]


def label_classes(labels) -> torch.Tensor:
    """The sorted class indices ``labels`` name: class indices ``[N]`` (negative ones name no
    class), or label vectors ``[N, C]`` (a class is named where some row is positive)."""
    labels = torch.as_tensor(np.asarray(labels))
    if labels.dim() == 1 and not labels.is_floating_point():
        return labels[labels >= 0].unique().long()
    if labels.dim() == 2:
        return (labels > 0).any(dim=0).nonzero().flatten()
    raise ValueError("config.METERS.model_output_mask needs labels that are class indices or "
                     f"label vectors, got labels of shape {tuple(labels.shape)}")


class OutputMask:
    """Sets the scores of every class but ``classes`` to -inf (each output's last dimension)."""

    def __init__(self, classes: torch.Tensor, where: str = "the labels"):
        self.classes = torch.as_tensor(classes).long()
        self.where = where

    def _mask(self, output: torch.Tensor) -> torch.Tensor:
        width = output.shape[-1]
        if len(self.classes) and int(self.classes.max()) >= width:
            raise ValueError(f"config.METERS.model_output_mask: {self.where} name class "
                             f"{int(self.classes.max())}, but the model gives {width} scores")
        keep = torch.zeros(width, dtype=torch.bool, device=output.device)
        keep[self.classes.to(output.device)] = True
        return output.masked_fill(~keep, float("-inf"))

    def __call__(self, output: Output) -> Output:
        if isinstance(output, torch.Tensor):
            return self._mask(output)
        return [self._mask(item) for item in output]
