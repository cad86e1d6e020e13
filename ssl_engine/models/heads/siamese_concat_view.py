"""The head of siamese (jigsaw) models: the features of the towers of each sample side by side."""
import torch
from torch import nn

from ssl_engine.models.registry import register_model_head


@register_model_head("siamese_concat_view")
class SiameseConcatView(nn.Module):
    """``[N * num_towers, D]`` (or ``[N * num_towers, D, 1, 1]``), rows sample-major as
    ``siamese_collator`` gives them -> ``[N, num_towers * D]``: row n is the features of
    towers 0..num_towers-1 of sample n, concatenated."""

    def __init__(self, num_towers: int):
        super().__init__()
        if int(num_towers) < 1:
            raise ValueError(f"num_towers must be >= 1, got {num_towers}")
        self.num_towers = int(num_towers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] % self.num_towers:
            raise ValueError(f"siamese_concat_view: {x.shape[0]} rows are not a multiple of "
                             f"num_towers={self.num_towers}")
        return x.reshape(x.shape[0] // self.num_towers, -1)
