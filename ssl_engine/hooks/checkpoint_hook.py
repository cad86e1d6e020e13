"""Saves checkpoints every CHECKPOINT_FREQUENCY epochs, every CHECKPOINT_ITER_FREQUENCY
iterations, at the end of training, and where a run stops on a signal (``task.stopping``,
CHECKPOINT.SAVE_ON_SIGTERM), in VISSL's file layout."""
import torch.distributed as dist

from ssl_engine.hooks.base import SSLHook
from ssl_engine.utils import rng
from ssl_engine.utils.checkpoint import save_checkpoint
from ssl_engine.utils.distributed import get_world_size, is_distributed, is_primary


def gather_rng_states():
    """Every rank's RNG state, in rank order (a collective call)."""
    state = rng.get_rng_state()
    if not is_distributed():
        return [state]
    states = [None] * get_world_size()
    dist.all_gather_object(states, state)
    return states


def checkpoint_state(task, kind: str, phase_complete: bool):
    return {
        "type": kind,
        "phase_idx": task.phase_idx,
        "train_phase_idx": task.train_phase_idx,
        "iteration": task.iteration,
        "iteration_num": task.iteration,
        "classy_state_dict": task.get_classy_state(phase_complete=phase_complete),
        "rng_states": gather_rng_states(),
        "world_size": get_world_size(),
        "config": task.config.to_dict(),
    }


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

    def _save(self, task, filename: str, kind: str, phase_complete: bool) -> None:
        save_sharded = getattr(task, "save_sharded", None)  # FSDP: each rank its shard, first
        if save_sharded is not None:
            save_sharded(self.folder, filename)
        state = checkpoint_state(task, kind, phase_complete)  # every rank takes part
        if is_primary():
            save_checkpoint(self.folder, filename, state)

    def on_step(self, task) -> None:
        if not task.train:
            return
        due = self.iteration_frequency > 0 and task.iteration % self.iteration_frequency == 0
        if due or self._stops_here(task):
            self._save(task, f"model_iteration{task.iteration}.torch", "iteration",
                       phase_complete=False)

    def _phase_checkpoint_name(self, task):
        """The file saved at the end of this phase by the frequencies, or None."""
        if not task.train:
            return None
        if task.train_phase_idx == task.config.OPTIMIZER.num_epochs - 1:
            return f"model_final_checkpoint_phase{task.train_phase_idx}.torch"
        if (task.train_phase_idx + 1) % self.phase_frequency == 0:
            return f"model_phase{task.train_phase_idx}.torch"
        return None

    def on_phase_end(self, task) -> None:
        name = self._phase_checkpoint_name(task)
        if name is None and self._stops_here(task):
            name = f"model_iteration{task.iteration}.torch"
        if name is not None:
            self._save(task, name, "phase", phase_complete=True)
