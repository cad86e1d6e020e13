"""SelfSupervisionTrainer: sets up torch.distributed, builds the task, runs its phases."""
import datetime
import logging
import os
from typing import List, Optional

import torch
import torch.distributed as dist

from ssl_engine.hooks.base import SSLClassyHookFunctions as Event
from ssl_engine.utils import rng
from ssl_engine.data.datasources.image_io import ImageLoadError
from ssl_engine.data.labels import MixedLabelShapes
from ssl_engine.data.loader import DataWorkerDiedError, stop_workers, worker_death_error
from ssl_engine.trainer.cuda_cache import CudaCacheClearer
from ssl_engine.checkpoint import (CheckpointError, WeightsInitError, last_saved, load_checkpoint,
                                   load_latest_checkpoint)
from ssl_engine.utils.classy import TASK_REGISTRY
from ssl_engine.utils.cpu_budget import configure_threads
from ssl_engine.utils.distributed import (barrier, elastic_attempt_store, export_nccl_settings,
                                          get_rank)
from ssl_engine.utils.host_memory import reuse_freed_memory
from ssl_engine.utils.registry import lookup
from ssl_engine.utils.stop_request import RunStopped, StopRequest, signal_name

logger = logging.getLogger(__name__)

# Errors a user causes (bad data, a diverging run, an unreadable or unsafe checkpoint, a weights
# file that does not fit, a full disk, a dead data-loader worker, labels of different shapes),
# reported as one message beside what was already saved.
USER_ERRORS = (FloatingPointError, CheckpointError, ImageLoadError, WeightsInitError,
               DataWorkerDiedError, MixedLabelShapes)
RESUME_HINT = (". Checkpoints already written are intact: continue with "
               "config.CHECKPOINT.AUTO_RESUME=true")


def machine_ranks():
    """(local_rank, global_rank, world_size) from the environment the launcher set."""
    return (
        int(os.environ.get("LOCAL_RANK", 0)),
        int(os.environ.get("RANK", 0)),
        int(os.environ.get("WORLD_SIZE", 1)),
    )


class SelfSupervisionTrainer:
    """Trains (``train()``) the task named by ``TRAINER.TASK_NAME``, or extracts features
    (``extract()``).

    Args:
        cfg: the checked config (the AttrDict under ``config``).
        dist_run_id: the init method of torch.distributed ("tcp://host:port", "file://path"
            or "env://").
        checkpoint_path: a checkpoint to start from; None looks in ``CHECKPOINT.DIR`` when
            ``CHECKPOINT.AUTO_RESUME`` is on.
        checkpoint_folder: where checkpoints go (default ``CHECKPOINT.DIR``).
        hooks: the hooks to call at every event.
    """

    def __init__(self, cfg, dist_run_id: str, checkpoint_path: Optional[str] = None,
                 checkpoint_folder: Optional[str] = None, hooks: Optional[List] = None):
        self.cfg = cfg
        self.dist_run_id = dist_run_id
        self.local_rank, self.rank, self.world_size = machine_ranks()
        self.device = self._select_device()
        resources = configure_threads(cfg)
        if self.rank == 0:
            logger.info("cores: %s", resources)
        if cfg.MACHINE.get("REUSE_FREED_MEMORY", True) and not reuse_freed_memory():
            logger.debug("MACHINE.REUSE_FREED_MEMORY: the C library is not glibc; "
                         "its allocator's defaults stay")
        self.setup_distributed()
        rng.set_seeds(cfg.SEED_VALUE + self.rank)
        if checkpoint_folder:
            cfg.CHECKPOINT.DIR = checkpoint_folder
        task_class = lookup(TASK_REGISTRY, cfg.TRAINER.TASK_NAME, "task")
        self.task = task_class.from_config(cfg, self.device)
        self.task.set_hooks(hooks or [])
        self.checkpoint_path = checkpoint_path
        self.cuda_cache = CudaCacheClearer(cfg, self.device, log=self.rank == 0)

    def _select_device(self) -> torch.device:
        if self.cfg.MACHINE.DEVICE == "gpu":
            torch.cuda.set_device(self.local_rank)
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    def setup_distributed(self) -> None:
        if dist.is_initialized():
            return
        backend = self.cfg.DISTRIBUTED.BACKEND
        export_nccl_settings(self.cfg, backend, log_note=self.rank == 0)
        logger.info("init process group: backend=%s rank=%d world=%d init=%s",
                    backend, self.rank, self.world_size, self.dist_run_id)
        minutes = float(self.cfg.DISTRIBUTED.get("TIMEOUT_MINUTES", 30))
        timeout = datetime.timedelta(minutes=minutes)
        store = elastic_attempt_store(self.world_size, timeout) \
            if self.dist_run_id == "env://" else None
        dist.init_process_group(backend=backend, init_method=None if store else self.dist_run_id,
                                store=store, rank=self.rank, world_size=self.world_size,
                                timeout=timeout)

    def _find_checkpoint(self, checkpoint_path: Optional[str]):
        if checkpoint_path:
            return load_checkpoint(checkpoint_path)
        if self.cfg.CHECKPOINT.AUTO_RESUME:
            return load_latest_checkpoint(self.cfg.CHECKPOINT.DIR)
        return None

    def train(self) -> None:
        task = self.task
        checkpoint = self._find_checkpoint(self.checkpoint_path)
        task.prepare(checkpoint=checkpoint)
        if checkpoint is not None:
            logger.info("resuming from phase %d, iteration %d", task.phase_idx, task.iteration)
        task.restore_rng_states()
        stop = StopRequest()  # SIGTERM / SIGINT: stop at a step boundary all ranks agree on
        try:
            task.on_start()
            while True:
                try:
                    task.advance_phase()
                except StopIteration:
                    break
                task.on_phase_start()
                self.run_phase(task, stop)
                for meter in task.meters:
                    meter.sync_state()
                task.stopping = stop.due()
                task.on_phase_end()
                self._stop_if_asked(task, stop)
            task.on_end()
        except RunStopped as stopped:
            logger.info("%s", stopped)
            task.run_hook(Event.on_exception)
            raise
        except USER_ERRORS as err:  # their message says it all: no traceback
            logger.error("training stopped on rank %d: %s", get_rank(), err)
            task.run_hook(Event.on_exception)
            raise
        except SystemExit as err:  # e.g. submitit requeueing a preempted job: not a failure
            logger.info("training stopped on rank %d by an exit request (code %s) at iteration "
                        "%d; a resumed run continues from the last checkpoint", get_rank(),
                        err.code, task.iteration)
            task.run_hook(Event.on_exception)
            raise
        except BaseException as err:
            died = worker_death_error(err, self.cfg, "TRAIN" if task.train else "TEST",
                                      task.data_iterator, then=RESUME_HINT)
            if died is not None:
                stop_workers(task.data_iterator)
                logger.error("training stopped on rank %d: %s", get_rank(), died)
                task.run_hook(Event.on_exception)
                raise died from None
            logger.exception("training failed on rank %d", get_rank())
            task.run_hook(Event.on_exception)
            raise
        finally:
            task.release_loaders()

    def run_phase(self, task, stop: Optional[StopRequest] = None) -> None:
        """The steps of the current phase, each followed by its on_step hooks, until its data
        ends (or a stop requested by a signal is due, with ``stop``)."""
        stop = stop or StopRequest()
        while True:
            try:
                task.train_step() if task.train else task.eval_step()
            except StopIteration:
                return
            self.cuda_cache.after_step()
            task.stopping = task.train and stop.due()  # test steps are no stop points
            task.run_hook(Event.on_step)
            self._stop_if_asked(task, stop)

    def _stop_if_asked(self, task, stop: StopRequest) -> None:
        """Raise RunStopped at the stop point where the hooks just saw ``task.stopping``."""
        if not task.stopping:
            return
        barrier()  # rank 0 has written the checkpoint the message names
        unsaved = "" if self.cfg.CHECKPOINT.SAVE_ON_SIGTERM else \
            " without saving (config.CHECKPOINT.SAVE_ON_SIGTERM=false)"
        raise stop.stopped(f"stopped by {signal_name(stop.signum)} after iteration "
                           f"{task.iteration}{unsaved}: {last_saved(self.cfg.CHECKPOINT.DIR)}")

    def extract(self):
        """Write the features of every split in EXTRACT_FEATURES.SPLITS and every layer the
        model extracts (MODEL.FEATURE_EVAL_SETTINGS), from the frozen model with the weights
        of MODEL.WEIGHTS_INIT; return {split: {layer: {kind: path}}}."""
        from ssl_engine.trainer import feature_extraction as fx

        cfg, model, datasets, folder = self._extraction_setup(
            lambda model: model.extract_layer_names(), "layers")
        return fx.extract_features(model.to(self.device), datasets, cfg, self.device, folder)

    def extract_label_predictions(self):
        """Write the label predictions of the heads (top-k classes, softmax scores) with the
        targets and dataset indices of every split in EXTRACT_FEATURES.SPLITS; return
        {split: {output: {kind: path}}} (see ssl_engine/trainer/label_predictions.py)."""
        from ssl_engine.trainer import label_predictions as lp

        cfg, model, datasets, folder = self._extraction_setup(lp.prediction_names, "outputs")
        return lp.extract_label_predictions(model.to(self.device), datasets, cfg, self.device,
                                            folder)

    def _extraction_setup(self, names_fn, what: str):
        """(the extraction config, the frozen model with the weights of MODEL.WEIGHTS_INIT,
        {split: dataset}, the output folder); ``names_fn(model)`` names the outputs logged."""
        from ssl_engine.data import build_dataset
        from ssl_engine.data.extraction_view import check_extraction_splits, extraction_config
        from ssl_engine.evaluation.extracted import extraction_dir
        from ssl_engine.models import build_model
        from ssl_engine.checkpoint import load_weights_init
        from ssl_engine.trainer import feature_extraction as fx

        cfg = self.cfg
        folder = fx.ensure_writable(extraction_dir(cfg))
        splits = fx.check_splits(cfg.EXTRACT_FEATURES.SPLITS)
        with torch.random.fork_rng(devices=[]):  # the same initial weights on every rank
            torch.manual_seed(cfg.SEED_VALUE)
            model = build_model(cfg.MODEL)
        layers = names_fn(model)
        if cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE:
            report = load_weights_init(model, cfg.MODEL.WEIGHTS_INIT)  # logs its summary
            logger.info("extracting with %d tensors of %s (%d model tensors not in the file)",
                        len(report.loaded), report.params_file, len(report.missing))
        else:
            logger.warning("config.MODEL.WEIGHTS_INIT.PARAMS_FILE is empty: extracting the "
                           "features of a randomly initialised model")
        logger.info("extracting %s %s of splits %s", what, ", ".join(layers), ", ".join(splits))
        cfg, changes = extraction_config(cfg, splits)
        for split, changed in changes.items():
            if changed:
                logger.info("%s: one deterministic view per image "
                            "(config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=true): %s",
                            split.lower(), "; ".join(changed))
        for split, names in check_extraction_splits(cfg, splits).items():
            logger.warning("%s: random augmentations %s are left in the extraction pipeline "
                           "(config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=false): each "
                           "extraction gives other features", split.lower(), ", ".join(names))
        datasets = {split: build_dataset(cfg, split) for split in splits}
        return cfg, model, datasets, folder
