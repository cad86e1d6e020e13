"""Helpers shared by losses: the model-output call convention, two-view batches, and named
loss terms (a loss with several parts sets ``self.loss_terms``; the log shows each)."""
from typing import Callable, Dict, List, Sequence, Tuple, Union

import torch


def as_output_list(output: Union[torch.Tensor, Sequence[torch.Tensor]]) -> List[torch.Tensor]:
    """The model's outputs as a list: a lone tensor becomes a one-element list."""
    if isinstance(output, torch.Tensor):
        return [output]
    outputs = list(output)
    if not outputs:
        raise ValueError("the loss received an empty list of model outputs")
    return outputs


def embedding_output(output, loss_name: str, embedding_dim: int, index: int = 0) -> torch.Tensor:
    """The model output ``index`` as an [N, embedding_dim] tensor (ValueError naming the key
    otherwise)."""
    outputs = as_output_list(output)
    if index >= len(outputs):
        raise ValueError(f"{loss_name} needs {index + 1} model outputs, got {len(outputs)}: "
                         "list the heads it needs in MODEL.HEAD.OUTPUT_HEADS")
    embedding = outputs[index]
    if embedding.ndim != 2 or embedding.shape[1] != embedding_dim:
        raise ValueError(f"{loss_name} expects embeddings of shape [N, {embedding_dim}] "
                         f"(LOSS.{loss_name}.embedding_dim), got {tuple(embedding.shape)}")
    return embedding


def two_views(embedding: torch.Tensor, loss_name: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """The rows of view 0 and of view 1 of a view-major batch of two views per sample."""
    if embedding.shape[0] % 2:
        raise ValueError(f"{loss_name} takes two views per sample (e.g. simclr_collator with "
                         f"ImgReplicatePil num_times: 2), got {embedding.shape[0]} rows")
    first, second = embedding.chunk(2)
    return first, second


def cross_view_terms(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                     online: torch.Tensor, target: torch.Tensor,
                     loss_name: str) -> Dict[str, torch.Tensor]:
    """A symmetric loss's two directions: ``fn(online of view 0, target of view 1)`` and
    ``fn(online of view 1, target of view 0)``, named."""
    online0, online1 = two_views(online, loss_name)
    target0, target1 = two_views(target, loss_name)
    return {"view0_to_view1": fn(online0, target1), "view1_to_view0": fn(online1, target0)}


def total_of(loss_module, terms: Dict[str, torch.Tensor]) -> torch.Tensor:
    """Record ``terms`` as the loss's named parts (logged beside the total) and return their
    sum."""
    loss_module.loss_terms = terms
    return sum(terms.values())


NAMED_VIEWS_SETUP = "the ibot_multicrop_masking_collator and MODEL.MULTI_INPUT_HEAD_MAPPING"


def global_views(inputs, loss_name: str, setup: str = NAMED_VIEWS_SETUP) -> torch.Tensor:
    """The ``global_views`` of named model inputs; ValueError naming ``loss_name`` and the
    ``setup`` that gives them otherwise."""
    if not isinstance(inputs, dict) or "global_views" not in inputs:
        raise ValueError(f"{loss_name} needs named inputs with global_views: {setup}")
    return inputs["global_views"]
