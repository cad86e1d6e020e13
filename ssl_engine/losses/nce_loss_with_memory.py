"""NPID (Wu et al. 2018) and PIRL's (Misra & van der Maaten 2020) loss: each embedding against
its own sample's entry in a memory bank and ``num_negatives`` random other entries, as noise
contrastive estimation or as InfoNCE (``loss_type: cross_entropy``)."""
from typing import Sequence

import torch
import torch.nn.functional as F

from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.memory_bank import gather_rows, hashed_indices, random_memory
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import all_reduce_mean

LOSS_TYPES = ("nce", "cross_entropy")
_EPS = float(torch.finfo(torch.float32).eps)


@register_loss("nce_loss_with_memory")
class NCELossWithMemory(SSLLoss):
    """For every model output ``i`` (l2-normalised with ``norm_embedding``) and sample ``n``:
    scores ``v . e_n / temperature`` against ``v`` = the memory's entry of ``n`` (the positive,
    column 0) and ``num_negatives`` entries drawn uniformly from the memory (a function of the
    sample and the iteration).  ``nce``: ``P = exp(score) / Z`` with ``Z`` = ``norm_constant``,
    or (-1) the mean of ``exp(score)`` over the first global batch times the memory size, kept
    from then on; the loss is ``-(log(P_0 / (P_0 + k/N)) + sum_j log((k/N) / (P_j + k/N)))``
    averaged over the samples, ``k`` negatives, ``N`` entries.  ``cross_entropy``: softmax
    cross entropy of the scores with the positive as the class.  The outputs' terms are
    weighted by ``loss_weights``.  After the loss of a training step, the entries of the
    global batch's samples move to ``normalize(m * entry + (1 - m) * e)`` (``momentum``), from
    every output (``update_mem_on_forward``) or from output ``update_mem_with_emb_index``.

    The target is the sample index (``DATA.TRAIN.LABEL_TYPE: sample_index``); the memory holds
    one entry per training sample (``memory_size`` -1: ``num_train_samples``, the size of the
    training set, filled in by the task)."""

    batch_coupling = None  # per-sample terms; the memory moves once per micro-batch
    sample_index_targets = True  # its memory bank is indexed by sample
    config_keys = {
        "num_negatives": "negative_sampling_params.num_negatives",
        "negative_sampling": "negative_sampling_params.type",
        "memory_size": "memory_params.memory_size",
        "embedding_dim": "memory_params.embedding_dim",
        "momentum": "memory_params.momentum",
        "norm_init": "memory_params.norm_init",
        "update_mem_on_forward": "memory_params.update_mem_on_forward",
    }

    def __init__(self, loss_type: str = "nce", norm_embedding: bool = True,
                 temperature: float = 0.07, loss_weights: Sequence[float] = (1.0,),
                 norm_constant: float = -1, update_mem_with_emb_index: int = -100,
                 num_negatives: int = 16000, negative_sampling: str = "random",
                 memory_size: int = -1, embedding_dim: int = 128, momentum: float = 0.5,
                 norm_init: bool = True, update_mem_on_forward: bool = True,
                 num_train_samples: int = -1, ignore_index: int = -1):
        super().__init__()
        if loss_type not in LOSS_TYPES:
            raise ValueError(f"nce_loss_with_memory: loss_type must be one of {LOSS_TYPES}, "
                             f"got {loss_type!r}")
        if negative_sampling not in ("random", "debug"):
            raise ValueError("nce_loss_with_memory: negative_sampling_params.type must be "
                             f"random, got {negative_sampling!r}")
        size = int(num_train_samples) if int(memory_size) < 0 else int(memory_size)
        if size < 1:
            raise ValueError("nce_loss_with_memory needs one memory entry per training sample: "
                             "num_train_samples (filled in from the training set) or "
                             f"memory_params.memory_size, got {size}")
        if temperature <= 0 or num_negatives < 1:
            raise ValueError(f"nce_loss_with_memory: temperature and num_negatives must be > 0, "
                             f"got {temperature} and {num_negatives}")
        if not update_mem_on_forward and update_mem_with_emb_index < 0:
            raise ValueError("nce_loss_with_memory: with memory_params.update_mem_on_forward "
                             "false, update_mem_with_emb_index names the output that updates "
                             f"the memory; got {update_mem_with_emb_index}")
        self.loss_type = loss_type
        self.norm_embedding = bool(norm_embedding)
        self.temperature = float(temperature)
        self.loss_weights = [float(w) for w in loss_weights]
        self.update_mem_with_emb_index = int(update_mem_with_emb_index)
        self.update_mem_on_forward = bool(update_mem_on_forward)
        self.num_negatives = int(num_negatives)
        self.embedding_dim = int(embedding_dim)
        self.momentum = float(momentum)
        self.ignore_index = int(ignore_index)
        self.register_buffer("memory", random_memory(size, self.embedding_dim, bool(norm_init)))
        # Z of NCE; negative until the first batch sets it (or given as norm_constant)
        self.register_buffer("norm_constant", torch.tensor(float(norm_constant),
                                                           dtype=torch.float64))

    def _scores(self, embedding: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """[B, 1 + num_negatives] scores against the positive and the drawn negatives."""
        negatives = hashed_indices(index, self.num_negatives, self.memory.shape[0],
                                   salt=self.step_context.iteration)
        columns = torch.cat([index[:, None].long(), negatives], dim=1)
        entries = self.memory[columns].detach().to(embedding.dtype)  # [B, 1 + k, dim]
        return torch.einsum("bkd,bd->bk", entries, embedding) / self.temperature

    def _nce(self, scores: torch.Tensor) -> torch.Tensor:
        probabilities = torch.exp(scores)
        if float(self.norm_constant) < 0:
            with torch.no_grad():
                mean = all_reduce_mean(probabilities.detach().mean().double())
                self.norm_constant.fill_(float(mean) * self.memory.shape[0])
        probabilities = probabilities / float(self.norm_constant)
        noise = self.num_negatives / self.memory.shape[0]
        positive = torch.log(probabilities[:, 0] / (probabilities[:, 0] + noise + _EPS))
        negative = torch.log(noise / (probabilities[:, 1:] + noise + _EPS)).sum(dim=1)
        return -(positive + negative).mean()

    def forward(self, output, target: torch.Tensor) -> torch.Tensor:
        outputs = as_output_list(output)
        if len(self.loss_weights) != len(outputs):
            raise ValueError(f"nce_loss_with_memory: {len(self.loss_weights)} loss_weights for "
                             f"{len(outputs)} model output(s)")
        index = target.reshape(-1).long()
        keep = index != self.ignore_index
        outside = (index[keep] < 0) | (index[keep] >= self.memory.shape[0])
        if bool(outside.any()):
            raise ValueError(f"nce_loss_with_memory: targets must be sample indices below the "
                             f"memory size {self.memory.shape[0]} (DATA.TRAIN.LABEL_TYPE: "
                             "sample_index)")
        terms, updates = {}, []
        for position, (embedding, weight) in enumerate(zip(outputs, self.loss_weights)):
            if embedding.ndim != 2 or embedding.shape[1] != self.embedding_dim:
                raise ValueError(f"nce_loss_with_memory expects embeddings [N, "
                                 f"{self.embedding_dim}] (memory_params.embedding_dim), got "
                                 f"{tuple(embedding.shape)}")
            if self.norm_embedding:
                embedding = F.normalize(embedding, dim=1)
            scores = self._scores(embedding[keep], index[keep])
            if self.loss_type == "nce":
                term = self._nce(scores)
            else:
                labels = torch.zeros(scores.shape[0], dtype=torch.long, device=scores.device)
                term = F.cross_entropy(scores, labels)
            terms[f"output{position}"] = weight * term
            if self.update_mem_on_forward or position == self.update_mem_with_emb_index:
                updates.append(embedding)
        if self.step_context.train:
            for embedding in updates:
                self.update_memory(embedding, index)
        return total_of(self, terms)

    @torch.no_grad()
    def update_memory(self, embedding: torch.Tensor, index: torch.Tensor) -> None:
        """The global batch's entries move towards its embeddings, on every rank (rows whose
        target is ``ignore_index`` excepted)."""
        embedding, index = gather_rows(embedding, index)
        keep = index != self.ignore_index
        embedding, index = embedding[keep], index[keep]
        moved = self.memory[index] * self.momentum + embedding.to(self.memory.dtype) * (
            1 - self.momentum)
        self.memory[index] = F.normalize(moved, dim=1)
