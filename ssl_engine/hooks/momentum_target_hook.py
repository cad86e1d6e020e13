"""Drives a loss's momentum target network (see ``losses/momentum_target.py``)."""
from ssl_engine.hooks.base import SSLHook


class MomentumTargetHook(SSLHook):
    """After the forward pass: the target network's output on the batch, for the loss.
    After every optimizer update ``k`` (0-based) of ``K``: the target moves towards the online
    weights with the momentum of update ``k``.  Both depend only on the batch and on ``k``, so a
    resumed run continues exactly."""

    def on_forward(self, task) -> None:
        task.loss.compute_target(task)

    def on_update(self, task) -> None:
        task.loss.update_target(task.base_model, task.schedule_iteration,
                               task.schedule_length)
