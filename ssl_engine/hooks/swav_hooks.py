"""The hook SwAV's loss works with (see ``losses/swav_loss.py``)."""
from ssl_engine.hooks.base import SSLHook


class SwAVHook(SSLHook):
    """Before the first update of a run (not of a resumed one: its prototypes come normalised
    from the checkpoint) and after every update, the prototypes go back to unit length
    (``normalize_last_layer``)."""

    def on_start(self, task) -> None:
        if task.iteration == 0:
            task.loss.normalize_prototypes()

    def on_update(self, task) -> None:
        task.loss.normalize_prototypes()
