"""Tells a loss where the run stands, for losses whose computation depends on it (DINO's
teacher temperature warm-up and center update)."""
from ssl_engine.hooks.base import SSLHook


class LossPositionHook(SSLHook):
    """Before every loss computation, sets ``task.loss.iteration`` (updates done so far in the
    run: the iteration a resumed run continues from) and ``task.loss.train_step`` (whether
    this step trains; evaluation steps must leave the loss's state alone)."""

    def on_forward(self, task) -> None:
        task.loss.iteration, task.loss.train_step = task.iteration, task.train
