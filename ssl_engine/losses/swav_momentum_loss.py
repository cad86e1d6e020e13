"""SwAV with a momentum network: the assignments come from an EMA copy of the model."""
from typing import List, Sequence

import torch

from ssl_engine.hooks.momentum_target_hook import MomentumTargetHook
from ssl_engine.hooks.swav_hooks import SwAVHook
from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.losses.swav_loss import SwAVLoss
from ssl_engine.utils.classy import register_loss


@register_loss("swav_momentum_loss")
class SwAVMomentumLoss(SwAVLoss, MomentumTargetLoss):
    """``swav_loss`` whose Sinkhorn-Knopp assignments are computed from the scores of a
    momentum network (the trunk and the swav_head, ``target = m * target + (1 - m) * online``
    after every update) on the crops of ``crops_for_assign``; every other crop of the online
    model predicts them.  The queue holds the momentum network's embeddings and is scored by
    its prototypes.  From iteration ``momentum_eval_mode_iter_start`` on, the momentum network
    runs in eval mode (its batch norms use their running statistics)."""

    prototypes_from_head = False  # its num_prototypes and embedding_dim are used as given

    def __init__(self, momentum: float = 0.99, momentum_eval_mode_iter_start: int = 0,
                 embedding_dim: int = 128, temperature: float = 0.1,
                 use_double_precision: bool = False, normalize_last_layer: bool = True,
                 num_iters: int = 3, epsilon: float = 0.05, num_crops: int = 2,
                 crops_for_assign: Sequence[int] = (0, 1),
                 num_prototypes: Sequence[int] = (3000,),
                 queue_length: int = 0, queue_start_iter: int = 0):
        super().__init__(
            embedding_dim=embedding_dim, temperature=temperature,
            use_double_precision=use_double_precision,
            normalize_last_layer=normalize_last_layer, num_iters=num_iters, epsilon=epsilon,
            num_crops=num_crops, crops_for_assign=crops_for_assign,
            num_prototypes=num_prototypes, queue_length=queue_length,
            queue_start_iter=queue_start_iter)
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"swav_momentum_loss: momentum must be in [0, 1], got {momentum}")
        self.momentum = float(momentum)
        self.momentum_eval_mode_iter_start = int(momentum_eval_mode_iter_start)
        self._target_crops = max(self.crops_for_assign) + 1

    @classmethod
    def build_hooks(cls) -> List:
        # the prototypes are normalised before the momentum network moves towards them
        return [SwAVHook(), MomentumTargetHook()]

    def bind_model(self, model) -> None:
        """Find the swav_head, put its prototypes on the unit sphere (as the hook does before
        the first update) and copy the model as the momentum network."""
        SwAVLoss.bind_model(self, model)
        self.normalize_prototypes()
        MomentumTargetLoss.bind_model(self, model)

    # ------------------------------------------------------------------ the momentum network
    def target_input(self, batch):
        """The leading resolution groups of the multi-crop input, up to the last crop of
        ``crops_for_assign``: the momentum network scores only the crops it assigns."""
        groups = batch["input"]
        if isinstance(groups, torch.Tensor):
            return groups
        batch_size = sum(group.shape[0] for group in groups) // self.num_crops
        needed, crops = [], 0
        for group in groups:
            needed.append(group)
            crops += group.shape[0] // max(1, batch_size)
            if crops >= self._target_crops:
                break
        return needed

    def run_target(self, inputs, task):
        return self.target_network(inputs)  # [embedding, scores of each prototype set]

    def target_train_mode(self, task) -> bool:
        return task.train and task.iteration < self.momentum_eval_mode_iter_start

    def assignment_source(self, embedding, scores):
        target = self.get_target_output()
        return target[0], list(target[1:])

    def queue_prototypes(self, set_index: int) -> torch.Tensor:
        return self.target_network.heads[-1].prototype_layers()[set_index].weight
