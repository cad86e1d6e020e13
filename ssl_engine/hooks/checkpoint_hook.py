"""Saves checkpoints every CHECKPOINT_FREQUENCY epochs, every CHECKPOINT_ITER_FREQUENCY
iterations, and at the end of training, in VISSL's file layout."""
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
    def __init__(self, checkpoint_folder: str, phase_frequency: int, iteration_frequency: int):
        super().__init__()
        self.folder = checkpoint_folder
        self.phase_frequency = phase_frequency
        self.iteration_frequency = iteration_frequency

    def _save(self, task, filename: str, kind: str, phase_complete: bool) -> None:
        save_sharded = getattr(task, "save_sharded", None)  # FSDP: each rank its shard, first
        if save_sharded is not None:
            save_sharded(self.folder, filename)
        state = checkpoint_state(task, kind, phase_complete)  # every rank takes part
        if is_primary():
            save_checkpoint(self.folder, filename, state)

    def on_step(self, task) -> None:
        if not task.train or self.iteration_frequency <= 0:
            return
        if task.iteration % self.iteration_frequency == 0:
            self._save(task, f"model_iteration{task.iteration}.torch", "iteration",
                       phase_complete=False)

    def on_phase_end(self, task) -> None:
        if not task.train:
            return
        num_epochs = task.config.OPTIMIZER.num_epochs
        is_final = task.train_phase_idx == num_epochs - 1
        if is_final:
            name = f"model_final_checkpoint_phase{task.train_phase_idx}.torch"
        elif (task.train_phase_idx + 1) % self.phase_frequency == 0:
            name = f"model_phase{task.train_phase_idx}.torch"
        else:
            return
        self._save(task, name, "phase", phase_complete=True)
