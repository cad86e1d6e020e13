"""SelfSupervisionTrainer: sets up the process (``trainer/process.py``), builds the task, runs
its phases."""
import logging
from typing import List, Optional

from ssl_engine.checkpoint import (CheckpointError, WeightsInitError, last_saved, load_checkpoint,
                                   load_latest_checkpoint)
from ssl_engine.data.datasources.image_io import ImageLoadError
from ssl_engine.data.labels import MixedLabelShapes
from ssl_engine.data.loader import DataWorkerDiedError, stopped_on_worker_death
from ssl_engine.hooks.base import SSLClassyHookFunctions as Event
from ssl_engine.models.feature_eval import PoolTooLarge
from ssl_engine.trainer.cuda_cache import CudaCacheClearer
from ssl_engine.trainer.process import setup_process
from ssl_engine.utils.classy import TASK_REGISTRY
from ssl_engine.utils.distributed import barrier, get_rank
from ssl_engine.utils.registry import lookup
from ssl_engine.utils.stop_request import RunStopped, StopRequest, signal_name

logger = logging.getLogger(__name__)

# Errors a user causes (bad data, a diverging run, an unreadable or unsafe checkpoint, a weights
# file that does not fit, a full disk, a dead data-loader worker, labels of different shapes,
# an evaluation pool larger than its feature map), reported as one message beside what was
# already saved.
USER_ERRORS = (FloatingPointError, CheckpointError, ImageLoadError, WeightsInitError,
               DataWorkerDiedError, MixedLabelShapes, PoolTooLarge)
RESUME_HINT = (". Checkpoints already written are intact: continue with "
               "config.CHECKPOINT.AUTO_RESUME=true")


class SelfSupervisionTrainer:
    """Trains (``train()``) the task named by ``TRAINER.TASK_NAME``; the ``train`` engine calls
    it (extraction has its own entry point: ``ssl_engine.extraction.extractor``).

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
        self.local_rank, self.rank, self.world_size, self.device = setup_process(cfg, dist_run_id)
        if checkpoint_folder:
            cfg.CHECKPOINT.DIR = checkpoint_folder
        task_class = lookup(TASK_REGISTRY, cfg.TRAINER.TASK_NAME, "task")
        self.task = task_class.from_config(cfg, self.device)
        self.task.set_hooks(hooks or [])
        self.checkpoint_path = checkpoint_path
        self.cuda_cache = CudaCacheClearer(cfg, self.device, log=self.rank == 0)

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
            died = stopped_on_worker_death(err, self.cfg, "TRAIN" if task.train else "TEST",
                                           task.data_iterator, then=RESUME_HINT)
            if died is not None:
                logger.error("training stopped on rank %d: %s", get_rank(), died)
                task.run_hook(Event.on_exception)
                raise died from None
            logger.exception("training failed on rank %d", get_rank())
            task.run_hook(Event.on_exception)
            raise
        finally:
            task.release_loaders()
            task.metrics.close()  # the writers (TensorBoard's events) after every hook's end

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
