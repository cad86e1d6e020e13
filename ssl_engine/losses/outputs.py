"""Helpers shared by losses for the model-output call convention."""
from typing import List, Sequence, Union

import torch


def as_output_list(output: Union[torch.Tensor, Sequence[torch.Tensor]]) -> List[torch.Tensor]:
    """The model's outputs as a list: a lone tensor becomes a one-element list."""
    if isinstance(output, torch.Tensor):
        return [output]
    outputs = list(output)
    if not outputs:
        raise ValueError("the loss received an empty list of model outputs")
    return outputs
