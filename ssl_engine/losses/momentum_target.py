"""Losses that compare the online model with a momentum (EMA) copy of it: MoCo v2, MoCo v3,
BYOL, and any later method with a teacher.

The loss owns the target network, so the target's weights are in the loss's state and hence in
every checkpoint.  ``MomentumTargetHook`` drives it: after the forward pass it runs the target
on the batch (``compute_target``), after every optimizer update it moves the target towards the
online weights (``update_target``).  The momentum at update ``k`` of ``K`` is a constant, or
BYOL's cosine schedule ``1 - (1 - m0) (cos(pi k / K) + 1) / 2`` (from m0 up to 1).
"""
import math
from typing import List, Optional

import torch

from ssl_engine.hooks.momentum_target_hook import MomentumTargetHook
from ssl_engine.losses.base import SSLLoss
from ssl_engine.models.ema import ema_update_
from ssl_engine.utils.device import float32_outputs


MOMENTUM_SCHEDULES = ("constant", "cosine")


def cosine_momentum(base: float, step: int, total: int) -> float:
    """BYOL's schedule: ``base`` at step 0, rising along a half cosine to 1 at ``total``."""
    if total <= 0:
        return base
    return 1.0 - (1.0 - base) * (math.cos(math.pi * min(step, total) / total) + 1.0) / 2.0


class MomentumTargetLoss(SSLLoss):
    """A loss with a target network: the online model's trunk and its first heads (all but the
    last ``online_only_heads``, which the online side alone has: a predictor), updated as
    ``target = m * target + (1 - m) * online`` after every update, never by gradients."""

    online_only_heads = 0

    def __init__(self, momentum: float = 0.99, momentum_schedule: str = "constant"):
        super().__init__()
        if not 0.0 <= momentum <= 1.0:
            raise ValueError(f"momentum must be in [0, 1], got {momentum}")
        if momentum_schedule not in MOMENTUM_SCHEDULES:
            raise ValueError(f"momentum_schedule must be one of {MOMENTUM_SCHEDULES}, "
                             f"got '{momentum_schedule}'")
        self.momentum = float(momentum)
        self.momentum_schedule = momentum_schedule
        self.target_network: Optional[torch.nn.Module] = None
        self.target_output: Optional[torch.Tensor] = None

    @classmethod
    def build_hooks(cls) -> List:
        return [MomentumTargetHook()]

    @classmethod
    def check_model_config(cls, model_cfg) -> None:
        """Refuse (before launch) a model without the heads the method needs."""
        cls._check_num_heads(len(model_cfg.HEAD.PARAMS))

    @classmethod
    def _check_num_heads(cls, heads: int) -> None:
        if cls.online_only_heads and heads < cls.online_only_heads + 1:
            raise ValueError(
                f"{cls.__name__} needs a projection head followed by {cls.online_only_heads} "
                f"prediction head(s) in config.MODEL.HEAD.PARAMS, got {heads} head(s)")

    # ------------------------------------------------------------------ the target
    def bind_model(self, model) -> None:
        """Make the target network: a frozen copy of ``model`` (the base model, after every
        rank holds the same initial weights)."""
        self._check_num_heads(len(model.heads))
        self.target_network = model.target_copy(len(model.heads) - self.online_only_heads)

    def target_input(self, batch):
        """What the target network sees: the model's input unless the collator gave the
        target its own (``input_momentum``)."""
        return batch.get("input_momentum", batch["input"])

    def run_target(self, inputs, task) -> torch.Tensor:
        """The target network's output on ``inputs`` (a method may reshuffle the batch)."""
        return self.target_network(inputs)[0]

    @torch.no_grad()
    def compute_target(self, task) -> None:
        self.target_network.train(self.target_train_mode(task))
        # under the step's autocast when AMP is on; the loss gets float32 like the online output
        self.target_output = float32_outputs(self.run_target(self.target_input(task.last_batch),
                                                             task))

    def target_train_mode(self, task) -> bool:
        """Whether the target network runs in train mode (its batch norms on the batch):
        in training steps."""
        return task.train

    def momentum_at(self, step: int, total: int) -> float:
        if self.momentum_schedule == "cosine":
            return cosine_momentum(self.momentum, step, total)
        return self.momentum

    @torch.no_grad()
    def update_target(self, online, step: int, total: int) -> None:
        """One EMA step of the target's parameters towards ``online`` (the base model) with the
        momentum of update ``step`` of ``total``.  Buffers (batch-norm statistics) are the
        target's own."""
        online_params = dict(online.named_parameters())
        named = list(self.target_network.named_parameters())
        ema_update_([param for _, param in named],
                    [online_params[name].detach() for name, _ in named],
                    self.momentum_at(step, total))

    def get_target_output(self) -> torch.Tensor:
        if self.target_output is None:
            raise RuntimeError(f"{type(self).__name__} needs the momentum target hook: it runs "
                               "the target network after each forward pass")
        output, self.target_output = self.target_output, None
        return output
