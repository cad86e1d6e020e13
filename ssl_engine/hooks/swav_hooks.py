"""The hook SwAV's loss works with (see ``losses/swav_loss.py``)."""
from ssl_engine.hooks.loss_position_hook import LossPositionHook


class SwAVHook(LossPositionHook):
    """Before the first update of a run (not of a resumed one: its prototypes come normalised
    from the checkpoint) and after every update, the prototypes go back to unit length
    (``normalize_last_layer``); before every loss, the loss learns the iteration (for the
    queue's ``start_iter`` and ``temp_hard_assignment_iters``) and whether the step trains
    (only training batches enter the queue)."""

    def on_start(self, task) -> None:
        if task.iteration == 0:
            task.loss.normalize_prototypes()

    def on_update(self, task) -> None:
        task.loss.normalize_prototypes()
