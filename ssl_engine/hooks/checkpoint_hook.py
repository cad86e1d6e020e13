"""Saves checkpoints every CHECKPOINT_FREQUENCY epochs, every CHECKPOINT_ITER_FREQUENCY
iterations, at the end of training, and where a run stops on a signal (``task.stopping``,
CHECKPOINT.SAVE_ON_SIGTERM), in VISSL's file layout. The hook decides when and under which
name; what a checkpoint holds and how it is written is ``ssl_engine.checkpoint``'s."""
from ssl_engine.checkpoint import (iteration_checkpoint_name, phase_checkpoint_name,
                                   save_task_checkpoint)
from ssl_engine.hooks.base import SSLHook


def check_losses(task) -> None:
    """Stop before saving if a loss since the last check was NaN or infinite
    (HOOKS.CHECK_NAN, utils/loss_watch.py): a checkpoint never holds such an update. Saving
    copies the weights to the host anyway, so this read-back costs no extra wait."""
    watch = getattr(task, "loss_watch", None)  # hand-made tasks of the tests have none
    if watch is not None:
        watch.check()


class CheckpointHook(SSLHook):
    def __init__(self, checkpoint_folder: str, phase_frequency: int, iteration_frequency: int,
                 save_on_stop: bool = True):
        super().__init__()
        self.folder = checkpoint_folder
        self.phase_frequency = phase_frequency
        self.iteration_frequency = iteration_frequency
        self.save_on_stop = save_on_stop

    def _stops_here(self, task) -> bool:
        return task.stopping and self.save_on_stop

    def on_step(self, task) -> None:
        if not task.train:
            return
        due = self.iteration_frequency > 0 and task.iteration % self.iteration_frequency == 0
        if due or self._stops_here(task):
            check_losses(task)
            save_task_checkpoint(task, self.folder, iteration_checkpoint_name(task.iteration),
                                 "iteration", phase_complete=False)

    def _phase_checkpoint_name(self, task):
        """The file saved at the end of this phase by the frequencies, or None."""
        if not task.train:
            return None
        if task.train_phase_idx == task.config.OPTIMIZER.num_epochs - 1:
            return phase_checkpoint_name(task.train_phase_idx, final=True)
        if (task.train_phase_idx + 1) % self.phase_frequency == 0:
            return phase_checkpoint_name(task.train_phase_idx)
        return None

    def on_phase_end(self, task) -> None:
        name = self._phase_checkpoint_name(task)
        if name is None and self._stops_here(task):
            name = iteration_checkpoint_name(task.iteration)
        if name is not None:
            check_losses(task)
            save_task_checkpoint(task, self.folder, name, "phase", phase_complete=True)
