"""Everything refused before a process starts, in one fixed order.

The launcher calls ``load_checked_config``; tools and tests that compose a config themselves
call ``check_before_launch``. Each check lives beside the component it checks; this module
only fixes their order, the first failing check giving the one error reported:

Composing the config (``ssl_engine.config.load_config``):
 1. the modules of ``$SSL_ENGINE_PLUGINS`` are imported, so their components count
    (engines/plugins.py);
 2. command-line overrides name existing keys (config/validate.py, ``validate_overrides``);
 3. the composed config: older VISSL keys moved, unsupported VISSL settings, unknown keys and
    value types (config/validate.py, ``validate_config``);
 4. choices, visible GPUs, DATASET_NAMES looked up in the catalog (data/catalog.py), phases,
    the EMA model's settings; derived values filled in (config/derive.py, ``derive_settings``).

The config alone, no files (``check_config_before_launch``):
 5. every registered name the config refers to (engines/registered_names.py);
 6. FSDP components named without the FSDP task: a warning (models/fsdp_names.py);
 7. the engine and the train step exist (engines/registry.py, trainer/train_steps);
 8. the trunk's settings (its ``check_config``, models/trunks);
 9. the model, built on the meta device: heads, evaluated stages (models/base_ssl_model.py);
10. the task's own ``check_config`` (trainer/task.py, trainer/fsdp_task.py).

This machine and the engine (``check_before_launch``):
11. the processes this machine starts fit it, unless torchrun or SLURM starts them
    (config/derive.py, ``check_processes_fit``);
12. the packages of the experiment trackers the config switches on (HOOKS.MLFLOW,
    HOOKS.WANDB) are installed, and W&B's mode is known (hooks/trackers.py);
13. no other live run holds CHECKPOINT.DIR, checked by the process that will lock it
    (utils/run_lock.py);
14. the engine's own ``check_before_launch``: for ``train``, ``check_train_config``
    (engines/train.py: hooks, AMP, heads, the data paths of data/paths.py, the collator and
    transforms of DEVICE_AUGMENTATION (data/device_augmentation.py), the checkpoint folder,
    the file the run starts from); for the extraction engines, engines/extract_*.py.
"""
import os
from typing import Sequence, Tuple

from ssl_engine.config import AttrDict, load_config
from ssl_engine.config.derive import check_processes_fit
from ssl_engine.engines.plugins import import_plugins
from ssl_engine.engines.registered_names import check_registered_names
from ssl_engine.engines.registry import get_engine
from ssl_engine.hooks.trackers import check_trackers
from ssl_engine.models.base_ssl_model import check_model_config
from ssl_engine.models.fsdp_names import warn_fsdp_names_without_fsdp_task
from ssl_engine.models.trunks import check_trunk_config
from ssl_engine.trainer.train_steps import get_train_step
from ssl_engine.utils.classy import TASK_REGISTRY
from ssl_engine.utils.registry import lookup
from ssl_engine.utils.run_lock import check_unlocked

_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def started_by_torchrun() -> bool:
    """Whether torchrun started this process (its rank variables are set)."""
    return all(name in os.environ for name in _RANK_VARIABLES)


def holds_run_lock(cfg: AttrDict) -> bool:
    """Whether this process is the one of global rank 0, which locks CHECKPOINT.DIR."""
    if started_by_torchrun():
        return int(os.environ["RANK"]) == 0
    return cfg.DISTRIBUTED.NODE_ID == 0


def check_config_before_launch(engine_name: str, cfg: AttrDict) -> None:
    """Steps 5 to 10: the refusals that need the config only (no files)."""
    check_registered_names(engine_name, cfg)  # every component the config names exists
    warn_fsdp_names_without_fsdp_task(engine_name, cfg)
    get_engine(engine_name)
    get_train_step(cfg.TRAINER.TRAIN_STEP_NAME)
    check_trunk_config(cfg.MODEL)
    check_model_config(cfg.MODEL)
    task_class = lookup(TASK_REGISTRY, cfg.TRAINER.TASK_NAME, "task")
    check_task = getattr(task_class, "check_config", None)  # a task's own refusals
    if check_task is not None:
        check_task(cfg)


def check_before_launch(engine_name: str, cfg: AttrDict) -> None:
    """Steps 5 to 14: everything that can be refused about a composed config before a process
    starts."""
    check_config_before_launch(engine_name, cfg)
    if not started_by_torchrun() and not cfg.SLURM.USE_SLURM:  # else started elsewhere
        check_processes_fit(cfg)
    check_trackers(cfg)
    engine = get_engine(engine_name)
    if holds_run_lock(cfg):
        check_unlocked(cfg.CHECKPOINT.DIR)
    check = getattr(engine, "check_before_launch", None)
    if check is not None:
        check(cfg)


def load_checked_config(argv: Sequence[str]) -> Tuple[str, AttrDict]:
    """Steps 1 to 14 for the command line ``argv``: (engine_name, the checked config)."""
    import_plugins()
    engine_name, cfg = load_config(list(argv))
    check_before_launch(engine_name, cfg)
    return engine_name, cfg
