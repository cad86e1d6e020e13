"""The checkpoints of a training run: what one holds (written by ``CheckpointHook``, read back
by ``SelfSupervisionTask.prepare`` on a resume) and the check, before launch, that the file a
run starts from loads (``check_train_config`` of the ``train`` engine)."""
from typing import Any, Dict, Optional

import torch.distributed as dist

from ssl_engine.checkpoint.formats import (is_vissl_checkpoint, model_state_from_vissl,
                                           model_state_of, vissl_key_prefix)
from ssl_engine.checkpoint.io import CheckpointError, load_latest_checkpoint, save_checkpoint
from ssl_engine.checkpoint.resume_match import check_resume_match
from ssl_engine.checkpoint.weights_init import check_weights_file
from ssl_engine.utils import rng
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
    """What a training checkpoint of ``task`` holds, in VISSL's layout (a collective call)."""
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


def save_task_checkpoint(task, folder: str, filename: str, kind: str,
                         phase_complete: bool) -> None:
    """Save ``task`` as ``folder/filename``; every rank calls it (the state is gathered), the
    primary writes the file. A sharded task (FSDP) first writes each rank's shard."""
    save_sharded = getattr(task, "save_sharded", None)  # FSDP: each rank its shard, first
    if save_sharded is not None:
        save_sharded(folder, filename)
    state = checkpoint_state(task, kind, phase_complete)  # every rank takes part
    if is_primary():
        save_checkpoint(folder, filename, state)


def check_resume_files(cfg) -> Optional[Dict[str, Any]]:
    """The file the run will start from loads: the latest checkpoint of CHECKPOINT.DIR when
    AUTO_RESUME finds one (a checkpoint of this engine, or one of VISSL whose trunk keys are
    in VISSL's layout of the config's trunk), else MODEL.WEIGHTS_INIT.PARAMS_FILE. A checkpoint
    of this engine must be a run of the config's loss, trunk, model shapes and task (DDP or
    FSDP): ``check_resume_match``. The tensors are mapped, not read: this costs little even
    for large files. Returns the (mapped) checkpoint the run resumes from, or None."""
    if cfg.CHECKPOINT.AUTO_RESUME:
        checkpoint = load_latest_checkpoint(cfg.CHECKPOINT.DIR, mmap=True)
        if checkpoint is not None:
            if "classy_state_dict" not in checkpoint:
                raise CheckpointError(
                    f"the latest checkpoint of config.CHECKPOINT.DIR={cfg.CHECKPOINT.DIR} is not "
                    f"one of this engine (no classy_state_dict; keys: {sorted(checkpoint)[:10]})")
            prefix = vissl_key_prefix(cfg.MODEL.TRUNK.NAME)
            if is_vissl_checkpoint(checkpoint, prefix):  # its weights start the run (task.prepare)
                model_state_from_vissl(model_state_of(checkpoint), prefix)
            else:
                check_resume_match(cfg, checkpoint)
            return checkpoint  # a resumed run does not read WEIGHTS_INIT
    check_weights_file(cfg.MODEL.WEIGHTS_INIT)
    return None
