"""Checkpoints: the files (``io``: names, atomic writes, the latest pointer, weights-only
loading), the layouts of VISSL and torchvision (``formats``), starting a model from a weights
file (``weights_init``, MODEL.WEIGHTS_INIT) and what a training checkpoint holds
(``training``: built for ``CheckpointHook``, checked before the ``train`` engine launches) and
whether a config trains the model, loss and task of the checkpoint it resumes
(``resume_match``); the trunks' timm and torchvision counterparts (``counterparts``,
``counterpart_maps``), the layout of a weights file read from its keys (``layouts``) and the
export of a model for other libraries (``export``, ``tools/export_model.py``).

Above utils and models, below config, hooks, trainer and engines: the hook, the trainer and
the engines call it; it imports none of them."""
from ssl_engine.checkpoint.formats import (
    ENGINE_CHECKPOINT_KEYS,
    VISSL_RESUME_NOT_RESTORED,
    CheckpointFormatError,
    engine_checkpoint,
    is_vissl_checkpoint,
    load_vissl_model_weights,
    model_key_from_vissl,
    model_state_of,
    vissl_checkpoint,
    vissl_key_prefix,
)
from ssl_engine.checkpoint.io import (
    LATEST_NAME,
    CheckpointError,
    CheckpointWriteError,
    UnsafeCheckpointError,
    atomic_torch_save,
    check_latest_pointer,
    check_plain_state,
    iteration_checkpoint_name,
    last_saved,
    latest_checkpoint_path,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    phase_checkpoint_name,
    remove_unfinished_saves,
    save_checkpoint,
)
from ssl_engine.checkpoint.resume_match import check_resume_match
from ssl_engine.checkpoint.training import (check_resume_files, checkpoint_state,
                                            save_task_checkpoint)
from ssl_engine.checkpoint.weights_init import (WeightsInitError, WeightsInitReport,
                                                check_weights_file, load_weights_init)

__all__ = [
    "CheckpointError", "CheckpointFormatError", "CheckpointWriteError", "ENGINE_CHECKPOINT_KEYS",
    "LATEST_NAME", "UnsafeCheckpointError", "VISSL_RESUME_NOT_RESTORED", "WeightsInitError",
    "WeightsInitReport", "atomic_torch_save", "check_latest_pointer", "check_plain_state",
    "check_resume_files", "check_resume_match", "check_weights_file", "checkpoint_state",
    "engine_checkpoint", "is_vissl_checkpoint", "iteration_checkpoint_name", "last_saved",
    "latest_checkpoint_path", "list_checkpoints", "load_checkpoint", "load_latest_checkpoint",
    "load_vissl_model_weights", "load_weights_init", "model_key_from_vissl", "model_state_of",
    "phase_checkpoint_name", "remove_unfinished_saves", "save_checkpoint", "save_task_checkpoint",
    "vissl_checkpoint", "vissl_key_prefix",
]
