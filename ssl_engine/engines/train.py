"""The ``train`` engine: pretraining, supervised training and linear evaluation alike."""
from pathlib import Path
from typing import Callable, List, Optional

from ssl_engine.checkpoint import check_latest_pointer, check_resume_files, list_checkpoints
from ssl_engine.config import ConfigError
from ssl_engine.data import check_data_paths
from ssl_engine.data.batched_reads import check_batched_reads
from ssl_engine.data.device_augmentation import check_device_augmentation
from ssl_engine.data.paths import check_full_batch
from ssl_engine.engines.registry import register_engine
from ssl_engine.hooks.distillation_hook import check_teacher
from ssl_engine.hooks.frozen_params_hook import check_frozen_params
from ssl_engine.losses import loss_class
from ssl_engine.losses.distillation import TeacherLoss
from ssl_engine.models.base_ssl_model import (check_model_config, check_output_heads,
                                              check_trainable)
from ssl_engine.models.sync_bn import check_batch_norm_splits, check_sync_bn_config
from ssl_engine.optimizers.param_schedulers import check_lr_not_negative
from ssl_engine.optimizers.weight_decay import build_weight_decay_scheduler
from ssl_engine.trainer import SelfSupervisionTrainer
from ssl_engine.trainer.amp import COMPILE_MODES, amp_dtype, compile_unavailable_reason
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.trainer.grad_clip import GradClip
from ssl_engine.trainer.process import machine_ranks
from ssl_engine.trainer.run_position import check_resume_schedule
from ssl_engine.utils.io import os_error_text, writable_folder_error
from ssl_engine.utils.logger import setup_logging


def check_train_config(cfg) -> None:
    """The data of every phase exists; the hooks the config asks for accept it; the model has
    the heads the loss needs, something to train and the parameters
    MODEL.TEMP_FROZEN_PARAMS_ITER_MAP names; a distillation's teacher builds and its weights
    file loads; gradient clipping and the weight-decay
    schedule are valid, the lr schedules never negative; with DROP_LAST a split holds one batch
    of every process; CHECKPOINT.DIR is writable and is not another run's; the checkpoint or
    weights file it starts from loads, and a checkpoint is not already past the run's end
    (``RunAlreadyComplete``: the launch ends with exit code 0)."""
    default_hook_generator(cfg)  # hooks refuse settings they cannot work with
    check_sync_bn_config(cfg.MODEL.SYNC_BN_CONFIG, cfg.MACHINE.DEVICE)
    check_batch_norm_splits(cfg)
    device_type = "cuda" if cfg.MACHINE.DEVICE == "gpu" else "cpu"
    amp_dtype(cfg.MODEL.AMP_PARAMS, device_type)
    if cfg.MODEL.COMPILE.USE_COMPILE and cfg.MODEL.COMPILE.BACKEND == "inductor":
        reason = compile_unavailable_reason(device_type)
        if reason:
            raise ConfigError(f"config.MODEL.COMPILE.USE_COMPILE=true: {reason}; or set "
                              "config.MODEL.COMPILE.USE_COMPILE=false")
    if cfg.MODEL.COMPILE.MODE not in COMPILE_MODES:
        raise ConfigError(f"config.MODEL.COMPILE.MODE must be one of {', '.join(COMPILE_MODES)}; "
                          f"got {cfg.MODEL.COMPILE.MODE!r}")
    check_output_heads(cfg.MODEL.HEAD.OUTPUT_HEADS, len(cfg.MODEL.HEAD.PARAMS))
    GradClip.from_config(cfg.MODEL.GRAD_CLIP)  # NORM_TYPE and MAX_NORM
    if not cfg.TEST_ONLY:
        build_weight_decay_scheduler(cfg.OPTIMIZER)
        check_lr_not_negative(cfg.OPTIMIZER)
        model = check_model_config(cfg.MODEL)
        if model is not None:
            check_trainable(model)
            check_frozen_params(cfg.MODEL.TEMP_FROZEN_PARAMS_ITER_MAP, model)
    loss_class(cfg.LOSS.name).check_model_config(cfg.MODEL)  # e.g. a predictor head it needs
    if issubclass(loss_class(cfg.LOSS.name), TeacherLoss) and not cfg.TEST_ONLY:
        check_teacher(cfg)  # the frozen teacher builds and its weights file loads
    splits = ([] if cfg.TEST_ONLY else ["TRAIN"]) + (["TEST"] if cfg.TEST_MODEL else [])
    for split in splits:
        check_data_paths(cfg, split)
        check_full_batch(cfg, split)
        check_device_augmentation(cfg, split)
        check_batched_reads(cfg, split)
    folder = Path(cfg.CHECKPOINT.DIR)
    err = writable_folder_error(folder)
    if err is not None:
        raise ConfigError(f"config.CHECKPOINT.DIR={folder} is not writable: {os_error_text(err)}")
    check_latest_pointer(folder)
    if (list_checkpoints(folder) and not cfg.CHECKPOINT.AUTO_RESUME
            and not cfg.CHECKPOINT.OVERWRITE_EXISTING):
        raise ConfigError(
            f"config.CHECKPOINT.DIR={folder} already holds checkpoints: set "
            "config.CHECKPOINT.AUTO_RESUME=true to continue that run, "
            "config.CHECKPOINT.OVERWRITE_EXISTING=true to start over, or pick another DIR"
        )
    # a shortened run already at its end trains nothing
    check_resume_schedule(cfg, check_resume_files(cfg))


@register_engine("train", check_before_launch=check_train_config, stops_on_signal=True)
def train_main(cfg, dist_run_id: str, checkpoint_path: Optional[str] = None,
               checkpoint_folder: Optional[str] = None,
               hook_generator: Callable[..., List] = default_hook_generator) -> None:
    _, rank, _ = machine_ranks()
    setup_logging(checkpoint_folder or cfg.CHECKPOINT.DIR, rank)
    trainer = SelfSupervisionTrainer(cfg, dist_run_id, checkpoint_path, checkpoint_folder,
                                     hooks=hook_generator(cfg))
    trainer.train()
