"""SimCLR's NT-Xent (InfoNCE) loss over the embeddings of all ranks."""
from typing import Dict, Tuple

import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import as_output_list
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all, get_rank, get_world_size


_MAX_CACHED_MASKS = 8


@register_loss("simclr_info_nce_loss")
class SimclrInfoNCELoss(SSLLoss):
    """NT-Xent over ``num_views`` views per sample; negatives come from every rank.

    ``output[0]`` holds ``num_views * B`` embeddings of this rank's ``B`` samples in view-major
    order (rows ``v*B .. v*B+B-1`` are view ``v``). Each local row is an anchor; the other rows
    of all ranks are its candidates; the other views of its sample are its positives. Per anchor
    ``a`` and positive ``p``: ``-log(exp(s_ap/t) / sum_{k != a} exp(s_ak/t))`` with cosine
    similarities ``s``; averaged over positives, then over the local anchors. Every rank must
    pass the same number of rows (the embeddings are all-gathered).
    """

    batch_coupling = (
        "its negatives are the other samples of the batch, and accumulation does not add negatives"
    )
    config_keys = {"embedding_dim": "buffer_params.embedding_dim"}  # VISSL's place for it

    def __init__(self, temperature: float = 0.1, embedding_dim: int = 128, num_views: int = 2):
        super().__init__()
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if num_views < 2:
            raise ValueError(f"simclr_info_nce_loss needs num_views >= 2, got {num_views}")
        self.temperature = float(temperature)
        self.embedding_dim = int(embedding_dim)
        self.num_views = int(num_views)
        self._masks: Dict[Tuple, Tuple[torch.Tensor, torch.Tensor]] = {}

    def _self_and_positive_masks(self, local_batch: int, device) -> Tuple[torch.Tensor, torch.Tensor]:
        """Boolean [local rows, all rows] mask of each anchor itself, and [local rows, views-1]
        column indices of its positives; cached per (batch, world size, rank, device)."""
        world_size, rank = get_world_size(), get_rank()
        key = (local_batch, world_size, rank, str(device))
        if key not in self._masks:
            if len(self._masks) >= _MAX_CACHED_MASKS:
                self._masks.clear()
            rows_per_rank = self.num_views * local_batch
            local_rows = torch.arange(rows_per_rank, device=device)
            own_columns = rank * rows_per_rank + local_rows
            # a comparison, not an indexed write of True (that copies the value from the host)
            columns = torch.arange(world_size * rows_per_rank, device=device)
            self_mask = own_columns[:, None] == columns[None, :]
            view, sample = local_rows // local_batch, local_rows % local_batch
            offsets = torch.arange(1, self.num_views, device=device)
            other_views = (view[:, None] + offsets[None, :]) % self.num_views
            positives = rank * rows_per_rank + other_views * local_batch + sample[:, None]
            self._masks[key] = (self_mask, positives)
        return self._masks[key]

    def forward(self, output, target: torch.Tensor = None) -> torch.Tensor:
        embedding = as_output_list(output)[0]
        if embedding.ndim != 2 or embedding.shape[1] != self.embedding_dim:
            raise ValueError(
                f"simclr_info_nce_loss expects embeddings of shape [N, {self.embedding_dim}] "
                f"(LOSS.simclr_info_nce_loss.buffer_params.embedding_dim), got {tuple(embedding.shape)}"
            )
        if embedding.shape[0] % self.num_views:
            raise ValueError(
                f"simclr_info_nce_loss got {embedding.shape[0]} rows, not a multiple of "
                f"num_views={self.num_views}"
            )
        local_batch = embedding.shape[0] // self.num_views
        embedding = F.normalize(embedding, dim=1)
        candidates = gather_from_all(embedding)
        logits = embedding @ candidates.t() / self.temperature
        self_mask, positives = self._self_and_positive_masks(local_batch, embedding.device)
        logits = logits.masked_fill(self_mask, float("-inf"))
        log_prob = logits - torch.logsumexp(logits, dim=1, keepdim=True)
        return -log_prob.gather(1, positives).mean()
