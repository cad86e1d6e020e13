"""The hook SwAV's loss works with (see ``losses/swav_loss.py``)."""
from ssl_engine.hooks.base import SSLHook


class SwAVHook(SSLHook):
    """Before the first update of a run (not of a resumed one: its prototypes come normalised
    from the checkpoint) and after every update, the prototypes go back to unit length
    (``normalize_last_layer``); before every loss, the loss learns the iteration (for the
    queue's ``start_iter`` and ``temp_hard_assignment_iters``) and whether the step trains."""

    def on_start(self, task) -> None:
        if task.iteration == 0:
            task.loss.normalize_prototypes()

    def on_forward(self, task) -> None:
        task.loss.iteration, task.loss.train_step = task.iteration, task.train

    def on_update(self, task) -> None:
        task.loss.normalize_prototypes()
