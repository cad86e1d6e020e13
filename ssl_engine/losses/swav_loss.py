"""SwAV (Caron et al. 2020): swapped prediction of online cluster assignments.

For each crop ``c`` in ``crops_for_assign`` the Sinkhorn-Knopp algorithm turns its prototype
scores into soft assignments ``q_c`` with equal mass per prototype over the global batch; every
other crop ``v`` predicts them: ``-sum_k q_c,k log softmax(s_v / temperature)_k``, averaged over
the samples, the ``num_crops - 1`` predicting crops, the assigned crops and the prototype sets.
A queue of past embeddings (``queue.queue_length``, filled from ``queue.start_iter`` on) adds
rows to the Sinkhorn problem when batches are small; only the batch's own assignments are used.
"""
import logging
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from ssl_engine.hooks.swav_hooks import SwAVHook
from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.outputs import as_output_list, total_of
from ssl_engine.losses.sinkhorn import distributed_sinkhorn
from ssl_engine.losses.statistics import COLLAPSED_ENTROPY, entropy_fraction
from ssl_engine.utils.classy import register_loss
from ssl_engine.utils.distributed import gather_from_all, get_rank, get_world_size
from ssl_engine.utils.key_rules import NEVER_READ, ignore_published_key


logger = logging.getLogger(__name__)


def _prototypes_from_head(loss, head_params, name: str) -> None:
    """VISSL's swav_loss read num_prototypes and embedding_dim only to size its queue: without
    a queue, values that differ from the swav_head's num_clusters and embedding (VISSL's
    iNaturalist ablations keep the default 3000 beside 8142 prototypes, its heads files a
    256-wide embedding beside the default 128) were ignored; the head's are used, said once."""
    if int(loss.get("queue", {}).get("queue_length", 0) or 0) > 0:
        return
    heads = [head[1] for head in head_params if isinstance(head, (list, tuple))
             and len(head) == 2 and str(head[0]).startswith("swav_head")
             and isinstance(head[1], dict) and "num_clusters" in head[1] and head[1].get("dims")]
    if len(heads) != 1:
        return
    from_head = {"num_prototypes": [int(k) for k in heads[0]["num_clusters"]],
                 "embedding_dim": int(heads[0]["dims"][-1])}
    for key, value in from_head.items():
        given = loss.get(key)
        given = [int(k) for k in given] if isinstance(given, (list, tuple)) else given
        if (value or key == "embedding_dim") and given != value:
            logger.warning("config.LOSS.%s.%s=%s differs from the swav_head's (%s); "
                           "without a queue VISSL did not read it: %s is used", name, key, given,
                           value, value)
            loss[key] = value


ignore_published_key("config.LOSS.swav_loss.shk_powerlaw",
                     f"{NEVER_READ}: swav_loss has no such setting")

@register_loss("swav_loss")
class SwAVLoss(SSLLoss):
    """The model gives ``[embedding, scores0, scores1, ...]`` (``swav_head``): the normalised
    embeddings and each prototype set's scores for all ``num_crops * B`` rows, crop-major
    (rows ``c*B .. c*B+B-1`` are crop ``c``; ``multicrop_collator`` puts the global crops
    first).  ``SwAVHook`` keeps the prototypes normalised; the step context
    (``begin_step``) gives the iteration, for ``temp_hard_assignment_iters`` and the queue's
    ``start_iter``, and whether the step trains (only training batches enter the queue)."""

    batch_coupling = "its Sinkhorn-Knopp assignments are balanced over the batch"
    config_keys = {"queue_length": "queue.queue_length", "queue_start_iter": "queue.start_iter"}

    def __init__(self, embedding_dim: int = 128, temperature: float = 0.1,
                 use_double_precision: bool = False, normalize_last_layer: bool = True,
                 num_iters: int = 3, epsilon: float = 0.05, num_crops: int = 2,
                 crops_for_assign: Sequence[int] = (0, 1),
                 num_prototypes: Sequence[int] = (3000,), temp_hard_assignment_iters: int = 0,
                 queue_length: int = 0, queue_start_iter: int = 0):
        super().__init__()
        crops_for_assign = [int(c) for c in crops_for_assign]
        if temperature <= 0 or epsilon <= 0:
            raise ValueError(f"swav_loss: temperature and epsilon must be > 0, got "
                             f"{temperature} and {epsilon}")
        if num_iters < 1:
            raise ValueError(f"swav_loss: num_iters must be >= 1, got {num_iters}")
        if num_crops < 2:
            raise ValueError(f"swav_loss needs num_crops >= 2, got {num_crops}")
        if not crops_for_assign or not all(0 <= c < num_crops for c in crops_for_assign):
            raise ValueError(f"swav_loss: crops_for_assign {crops_for_assign} must be crop "
                             f"indices below num_crops={num_crops}")
        if queue_length < 0:
            raise ValueError(f"swav_loss: queue.queue_length must be >= 0, got {queue_length}")
        self.embedding_dim = int(embedding_dim)
        self.temperature = float(temperature)
        self.use_double_precision = bool(use_double_precision)
        self.normalize_last_layer = bool(normalize_last_layer)
        self.num_iters = int(num_iters)
        self.epsilon = float(epsilon)
        self.num_crops = int(num_crops)
        self.crops_for_assign = crops_for_assign
        self.num_prototypes = [int(k) for k in num_prototypes]
        self.temp_hard_assignment_iters = int(temp_hard_assignment_iters)
        self.queue_start_iter = int(queue_start_iter)
        self._last_statistics: Dict[str, torch.Tensor] = {}
        self._head: List = []  # the model's swav_head (not a submodule of the loss)
        # every rank keeps its own rows of the queue: queue_length over the ranks
        local_length = int(queue_length) // get_world_size()
        self.register_buffer("queue", torch.zeros(len(crops_for_assign), local_length,
                                                  self.embedding_dim))
        # rows of the whole queue (all ranks) filled so far
        self.register_buffer("queue_filled", torch.zeros((), dtype=torch.long))

    crops_key = "num_crops"
    # whether num_prototypes and embedding_dim without a queue are the swav_head's
    prototypes_from_head = True

    @classmethod
    def derive_config(cls, cfg) -> None:
        """num_crops from the training transforms; without a queue, num_prototypes and
        embedding_dim from the swav_head (``prototypes_from_head``)."""
        super().derive_config(cfg)
        if cls.prototypes_from_head:
            _prototypes_from_head(cfg.LOSS[cfg.LOSS.name], cfg.MODEL.HEAD.PARAMS, cfg.LOSS.name)

    @classmethod
    def build_hooks(cls) -> List:
        return [SwAVHook()]

    # ------------------------------------------------------------------ the model's head
    def bind_model(self, model) -> None:
        """Find the model's ``swav_head`` (its prototypes score the queue) and check that it
        agrees with the loss's settings."""
        heads = [head for head in model.heads if hasattr(head, "prototype_layers")]
        if len(heads) != 1:
            raise ValueError("swav_loss needs exactly one swav_head in config.MODEL.HEAD.PARAMS, "
                             f"found {len(heads)}")
        head = heads[0]
        if head.num_clusters != self.num_prototypes:
            raise ValueError(f"swav_loss: LOSS.swav_loss.num_prototypes={self.num_prototypes} "
                             f"but the swav_head has num_clusters={head.num_clusters}")
        if head.embedding_dim != self.embedding_dim:
            raise ValueError(f"swav_loss: LOSS.swav_loss.embedding_dim={self.embedding_dim} but "
                             f"the swav_head's embedding has {head.embedding_dim} dimensions")
        if not head.return_embeddings and self.queue.shape[1]:
            raise ValueError("swav_loss with a queue needs the swav_head's embeddings "
                             "(return_embeddings: true)")
        self._head = [head]

    def normalize_prototypes(self) -> None:
        if self.normalize_last_layer and self._head:
            self._head[0].normalize_prototypes()

    # ------------------------------------------------------------------ checkpoints
    @torch.no_grad()
    def get_classy_state(self) -> dict:
        """The state with the whole queue: every rank's rows, rank after rank (every rank
        takes part, as in every checkpoint)."""
        state = self.state_dict()
        state["queue"] = gather_from_all(self.queue.transpose(0, 1).contiguous()).transpose(0, 1)
        return state

    def set_classy_state(self, state: dict) -> None:
        """Restore a ``get_classy_state``; this rank takes its share of the queue."""
        state = dict(state)
        queue = state["queue"]
        local = self.queue.shape[1]
        if queue.shape[1] != local * get_world_size():
            raise ValueError(f"swav_loss: the checkpoint's queue holds {queue.shape[1]} rows, "
                             f"this run's {local * get_world_size()} (queue.queue_length)")
        state["queue"] = queue[:, get_rank() * local:(get_rank() + 1) * local]
        self.load_state_dict(state)

    # ------------------------------------------------------------------ the loss
    def _split_outputs(self, output):
        outputs = as_output_list(output)
        if len(outputs) != 1 + len(self.num_prototypes):
            raise ValueError(
                f"swav_loss expects [embedding, scores of each of the {len(self.num_prototypes)} "
                f"prototype set(s)] from the model (swav_head), got {len(outputs)} output(s)")
        embedding, scores = outputs[0], outputs[1:]
        rows = embedding.shape[0]
        if embedding.ndim != 2 or embedding.shape[1] != self.embedding_dim:
            raise ValueError(f"swav_loss expects embeddings of shape [N, {self.embedding_dim}] "
                             f"(LOSS.swav_loss.embedding_dim), got {tuple(embedding.shape)}")
        if rows % self.num_crops:
            raise ValueError(f"swav_loss got {rows} rows, not a multiple of "
                             f"num_crops={self.num_crops} (LOSS.swav_loss.num_crops)")
        for index, (set_scores, clusters) in enumerate(zip(scores, self.num_prototypes)):
            if tuple(set_scores.shape) != (rows, clusters):
                raise ValueError(f"swav_loss: scores of prototype set {index} should be "
                                 f"[{rows}, {clusters}], got {tuple(set_scores.shape)}")
        return embedding, scores, rows // self.num_crops

    def _queue_in_use(self) -> bool:
        return (self.queue.shape[1] > 0
                and int(self.queue_filled) >= self.queue.shape[1] * get_world_size())

    @torch.no_grad()
    def assignments(self, crop_scores: torch.Tensor, slot: int, set_index: int) -> torch.Tensor:
        """Soft (or, during ``temp_hard_assignment_iters``, one-hot) assignments of one crop's
        rows, solved together with the queue's rows when the queue is full."""
        batch = crop_scores.shape[0]
        if self._queue_in_use():
            prototypes = self.queue_prototypes(set_index)
            queued = self.queue[slot].to(prototypes.dtype) @ prototypes.detach().t()
            crop_scores = torch.cat([queued.to(crop_scores.dtype), crop_scores])
        q = distributed_sinkhorn(crop_scores, self.epsilon, self.num_iters,
                                 self.use_double_precision)[-batch:]
        if self.step_context.iteration < self.temp_hard_assignment_iters:
            q = F.one_hot(q.argmax(dim=1), q.shape[1]).to(q.dtype)
        return q

    def queue_prototypes(self, set_index: int) -> torch.Tensor:
        """The prototypes that score the queue's embeddings: the model's own."""
        return self._head[0].prototype_layers()[set_index].weight

    def assignment_source(self, embedding: torch.Tensor, scores: List[torch.Tensor]):
        """The embeddings (enqueued) and the scores (assigned) of the crops whose assignments
        are predicted, crop-major as the model's: the model's own output."""
        return embedding, scores

    def forward(self, output, target: Optional[torch.Tensor] = None) -> torch.Tensor:
        embedding, scores, batch = self._split_outputs(output)
        source_embedding, source_scores = self.assignment_source(embedding, scores)
        if self.queue.shape[1] and self.queue.shape[1] % batch:
            raise ValueError(
                f"swav_loss: the queue holds {self.queue.shape[1]} rows per process "
                f"(queue.queue_length / processes), not a multiple of the {batch} samples per "
                "process: choose queue_length as a multiple of the global batch size")
        if self.queue.shape[1] and not self._head:
            raise RuntimeError("swav_loss with a queue needs bind_model(model) first")
        terms = {}
        scale = 1.0 / (len(self.crops_for_assign) * len(scores) * (self.num_crops - 1))
        for slot, crop in enumerate(self.crops_for_assign):
            term = embedding.new_zeros(())
            for set_index, set_scores in enumerate(scores):
                assigned = source_scores[set_index][crop * batch:(crop + 1) * batch]
                q = self.assignments(assigned.float(), slot, set_index).to(set_scores.dtype)
                for view in range(self.num_crops):
                    if view == crop:
                        continue
                    view_scores = set_scores[view * batch:(view + 1) * batch] / self.temperature
                    term = term - (q * F.log_softmax(view_scores, dim=1)).sum(dim=1).mean()
            terms[f"assign_crop{crop}"] = term * scale
            if slot == 0:
                self._statistics(q, scores[0][crop * batch:(crop + 1) * batch])
        step = self.step_context
        if step.train and self.queue.shape[1] and step.iteration >= self.queue_start_iter:
            self._enqueue(source_embedding.detach(), batch)
        return total_of(self, terms)

    # ------------------------------------------------------------------ collapse monitor
    @torch.no_grad()
    def _statistics(self, q: torch.Tensor, crop_scores: torch.Tensor) -> None:
        """Mean entropies, as fractions of log K, of the first assigned crop's assignments and
        of its predictions (softmax of its scores / temperature), first prototype set."""
        predictions = F.softmax(crop_scores.detach().float() / self.temperature, dim=1)
        self._last_statistics = {
            "assignment_entropy": entropy_fraction(q.float()),
            "prediction_entropy": entropy_fraction(predictions),
        }

    def collapse_statistics(self):
        return self._last_statistics

    @staticmethod
    def collapse_warning(statistics) -> Optional[str]:
        value = statistics.get("assignment_entropy")
        if value is not None and float(value) > COLLAPSED_ENTROPY:
            return (f"the assignments are uniform (entropy {float(value):.3f} of log K): every "
                    "sample gets every prototype alike")
        return None

    @torch.no_grad()
    def _enqueue(self, embedding: torch.Tensor, batch: int) -> None:
        """The assigned crops' embeddings enter the front of their queue; the oldest leave."""
        for slot, crop in enumerate(self.crops_for_assign):
            rows = embedding[crop * batch:(crop + 1) * batch].to(self.queue.dtype)
            self.queue[slot] = torch.cat([rows, self.queue[slot, :-batch]])
        world = get_world_size()
        self.queue_filled.add_(batch * world).clamp_(max=self.queue.shape[1] * world)
