"""SelfSupervisionTask: the classy_vision task holding everything a run trains and tests."""
import logging
import time
from typing import Any, Dict, List, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from ssl_engine.checkpoint import (VISSL_RESUME_NOT_RESTORED, CheckpointError, is_vissl_checkpoint,
                                   load_vissl_model_weights, load_weights_init, vissl_key_prefix)
from ssl_engine.data import batch_to_device, build_dataloader, build_dataset
from ssl_engine.data.loader import set_loader_position, stop_workers
from ssl_engine.data.ssl_dataset import dataset_labels
from ssl_engine.hooks.base import SSLClassyHookFunctions, SSLHook
from ssl_engine.losses import build_loss
from ssl_engine.meters import build_meters
from ssl_engine.meters.output_mask import OutputMask, label_classes
from ssl_engine.models import build_model
from ssl_engine.models.ema import ModelEMA, ema_model_enabled
from ssl_engine.models.sync_bn import convert_sync_bn
from ssl_engine.optimizers import build_optimizer
from ssl_engine.trainer.accumulation import warn_if_accumulation_changes_the_loss
from ssl_engine.trainer.amp import MixedPrecision
from ssl_engine.trainer.grad_clip import GradClip
from ssl_engine.trainer.phases import build_phases
from ssl_engine.trainer.run_position import (RunSettings, SchedulePosition, plan_resume,
                                             position_state)
from ssl_engine.trainer.sharded_ddp import (check_sharded_ddp_config, uses_sharded_ddp,
                                            wrap_sharded_ddp)
from ssl_engine.trainer.train_steps import get_train_step
from ssl_engine.utils import rng
from ssl_engine.utils.classy import ClassyTask, register_task
from ssl_engine.utils.cpu_budget import loader_workers
from ssl_engine.utils.distributed import broadcast_buffers, get_rank, get_world_size
from ssl_engine.utils.loss_watch import LossWatch
from ssl_engine.utils.metrics_store import MetricsStore

logger = logging.getLogger(__name__)


@register_task("self_supervision_task")
class SelfSupervisionTask(ClassyTask):
    """Model, loss, optimizer, meters, data and the position of the run in its phases.

    Position: ``phase_idx`` indexes ``phases``; ``train_phase_idx`` counts train phases
    started; ``iteration`` counts optimizer updates of the whole run; and
    ``iteration_num_in_phase`` counts batches done in the current phase. A checkpoint also
    holds the samples of the epoch's global order consumed and the settings they were counted
    with, so a run resumed with other settings continues right (``trainer/run_position.py``).
    The schedules read ``schedule_iteration`` of ``schedule_length`` (``where``).
    """
    def __init__(self, config, device: torch.device):
        super().__init__()
        self.config = config
        self.device = device
        self.phases = build_phases(config)
        self.phase_idx = -1
        self.train_phase_idx = -1
        self.iteration = 0
        self.iteration_num_in_phase = 0
        self.train = not config.TEST_ONLY
        self.train_step_fn = get_train_step(config.TRAINER.TRAIN_STEP_NAME)
        self.base_model = self.model = self.loss = self.optimizer = None
        self.ema_model = None  # HOOKS.EMA_MODEL's average of the weights (models/ema.py)
        self.meters: List[Any] = []
        self.datasets: Dict[str, Any] = {}
        self.data_iterator = None
        self._loaders: Dict[str, Any] = {}  # persistent loaders by split
        # the phase's loss, its named terms, collapse statistics... (hooks/base.py)
        self.metrics = MetricsStore(device)
        self.loss_watch = LossWatch()  # losses watched for NaN on the device (HOOKS.CHECK_NAN)
        self.last_batch = self.last_model_output = self.last_loss = None
        self.data_time = self.step_time = 0.0
        self.hook_seconds = 0.0  # time spent in hooks so far (HOOKS.PERF_STATS's breakdown)
        self.checkpoint_folder = config.CHECKPOINT.DIR
        self._resume_start = (0, 0)  # (batches, samples) of the first phase already done
        self._resume_cut = (0, 0)  # the checkpoint's (phase, batch): metrics.json is cut there
        self._phase_sampler, self._phase_start_iter = None, 0
        self.schedule = SchedulePosition(epochs=int(config.OPTIMIZER.num_epochs))
        self._resume_rng_states = None
        # True at the step (or phase end) after which the run stops on SIGTERM / SIGINT: the
        # hooks of that point do what must be done before (the checkpoint hook saves)
        self.stopping = False
        self.amp = MixedPrecision.from_config(config, self.device)
        self.grad_clip = GradClip.from_config(config.MODEL.get("GRAD_CLIP"))
        self.accumulation_steps = int(config.OPTIMIZER.get("gradient_accumulation_steps", 1))

    @classmethod
    def from_config(cls, config, device: Optional[torch.device] = None):
        return cls(config, device or torch.device("cpu"))

    @classmethod
    def check_config(cls, cfg) -> None:
        """Refuse, before launch, the combinations this task cannot run."""
        check_sharded_ddp_config(cfg)

    # ------------------------------------------------------------------ building
    def prepare(self, checkpoint: Optional[Dict[str, Any]] = None) -> None:
        """Build data, model, loss, optimizer and meters; restore ``checkpoint`` if given."""
        cfg = self.config
        if not cfg.TEST_ONLY:
            self.datasets["TRAIN"] = build_dataset(cfg, "TRAIN", device_augmentation=True)
        if cfg.TEST_MODEL:
            self.datasets["TEST"] = build_dataset(cfg, "TEST", device_augmentation=True)
        self.base_model = convert_sync_bn(build_model(cfg.MODEL), cfg).to(self.device)
        if checkpoint is not None and is_vissl_checkpoint(
                checkpoint, vissl_key_prefix(cfg.MODEL.TRUNK.NAME)):
            self._start_from_vissl_checkpoint(checkpoint)  # weights only: before any wrapping
            checkpoint = None
        elif cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE and checkpoint is None:  # a resume checkpoint wins
            load_weights_init(self.base_model, cfg.MODEL.WEIGHTS_INIT)
        if cfg.MODEL.CHANNELS_LAST and self.channels_last_weights():
            self.base_model.to(memory_format=torch.channels_last)
        if cfg.MODEL.COMPILE.USE_COMPILE:  # in place: parameter names and checkpoints unchanged
            backend = cfg.MODEL.COMPILE.BACKEND
            self.base_model.trunk.compile(backend=backend,
                                          mode=None if backend != "inductor" else
                                          cfg.MODEL.COMPILE.MODE)
        if uses_sharded_ddp(cfg) and not cfg.TEST_ONLY:  # its wrapper needs the optimizer
            self.optimizer = build_optimizer(cfg.OPTIMIZER, self.base_model)
        self.model = self._wrap_model(self.base_model)  # every rank now has rank 0's weights
        self.ema_model = self._build_ema_model()
        train_size = len(self.datasets["TRAIN"]) if "TRAIN" in self.datasets else None
        self.loss = build_loss(cfg.LOSS, num_train_samples=train_size).to(self.device)
        self._bind_loss()  # e.g. a momentum target copied from the model
        if self.optimizer is None and not cfg.TEST_ONLY:  # FSDP: over the sharded parameters
            self.optimizer = build_optimizer(cfg.OPTIMIZER, self.base_model)
        self.meters = build_meters(cfg.METERS)
        self.meter_masks = self._meter_masks() if cfg.METERS.model_output_mask else {}
        # updates per epoch: a last, shorter group of micro-batches still makes an update
        self.num_train_iters_per_epoch = self.run_settings().updates_per_epoch()
        if checkpoint is not None:
            self.set_classy_state(checkpoint["classy_state_dict"])
            self._resume_rng_states = checkpoint.get("rng_states")
        if self.accumulation_steps > 1 and not cfg.TEST_ONLY:
            warn_if_accumulation_changes_the_loss(self.loss, self.accumulation_steps)
        self.max_iteration = self.schedule.run_length(self.num_train_iters_per_epoch,
                                                      cfg.OPTIMIZER.num_epochs)

    def _meter_masks(self) -> Dict[str, OutputMask]:
        """METERS.model_output_mask: per split, the classes its labels name."""
        masks = {}
        for split, dataset in self.datasets.items():
            labels = dataset_labels(dataset)
            if labels is None:
                raise ValueError(f"config.METERS.model_output_mask needs the labels of "
                                 f"config.DATA.{split}, and its data source does not list them")
            classes = label_classes(labels)
            logger.info("%s meters read %d classes of the model's output (model_output_mask)",
                        split.lower(), len(classes))
            masks[split] = OutputMask(classes, f"the labels of config.DATA.{split}")
        return masks

    def meter_output(self, output):
        """What the meters read of the model's ``output``: the output itself, or with
        METERS.model_output_mask the scores of the classes the phase's labels name."""
        mask = getattr(self, "meter_masks", {}).get("TRAIN" if self.train else "TEST")
        return output if mask is None else mask(output)

    def _bind_loss(self) -> None:
        """Give the loss the built and wrapped model (``SSLLoss.bind_model``)."""
        self.loss.bind_model(self.base_model)

    def _build_ema_model(self):
        """HOOKS.EMA_MODEL: the average of the weights kept beside the model (a copy of the
        initial weights), when training with SAVE_EMA_MODEL or ENABLE_EMA_METERS on."""
        ema_cfg = self.config.HOOKS.EMA_MODEL
        if not ema_model_enabled(self.config):
            return None
        device = self.device if ema_cfg.EMA_DEVICE == "gpu" else torch.device("cpu")
        return ModelEMA(self.base_model, ema_cfg.DECAY, device)

    def _start_from_vissl_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        """A VISSL training checkpoint found when resuming: its model weights (trunk and
        heads, strictly) are loaded; nothing else of it can be carried over."""
        try:
            load_vissl_model_weights(self.base_model, checkpoint)
        except ValueError as err:
            raise CheckpointError(f"the VISSL checkpoint to resume from does not fit the model "
                                  f"of this config: {err}") from None
        logger.warning("resuming from a VISSL checkpoint: its model weights (trunk and heads) "
                       "are loaded; not restored: %s", VISSL_RESUME_NOT_RESTORED)

    def channels_last_weights(self) -> bool:
        """Whether MODEL.CHANNELS_LAST converts the weights too, or only the inputs (whose
        layout convolutions keep): ZeRO's broadcasts need contiguous parameters."""
        return not self.config.OPTIMIZER.get("use_zero", False)

    def _wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if get_world_size() == 1:
            return model
        if uses_sharded_ddp(self.config) and self.optimizer is not None:
            return wrap_sharded_ddp(model, self.optimizer, self.config)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # every rank starts from rank 0's parameters and buffers; BROADCAST_BUFFERS: the
        # buffers again at each training forward
        return DistributedDataParallel(model, device_ids=device_ids,
                                       forward_sync_buffers=broadcast_buffers(self.config))

    def run_settings(self) -> RunSettings:
        """The settings this run counts its iterations with."""
        return RunSettings.of_config(self.config, get_world_size(), self.accumulation_steps,
                                     len(self.datasets.get("TRAIN", ())))

    # ------------------------------------------------------------------ phases
    @property
    def schedule_iteration(self) -> int:
        """The schedules' iteration: ``iteration``, or after a resume with other settings the
        run's position counted in this run's updates."""
        return self.schedule.iteration(self.iteration)

    @property
    def schedule_length(self) -> int:
        """The schedules' length in updates (``max_iteration`` unless a resume changed it)."""
        return self.schedule.length(self.num_train_iters_per_epoch)

    @property
    def where(self) -> float:
        """Fraction of the schedules done, in [0, 1)."""
        if not self.schedule_length:
            return 0.0
        return min(self.schedule_iteration / self.schedule_length, 1.0 - 1e-12)

    @property
    def phase(self) -> Dict[str, Any]:
        return self.phases[self.phase_idx]

    @property
    def phase_type(self) -> str:
        return "train" if self.train else "test"

    @property
    def resume_position(self) -> tuple:
        """(phase_idx, batches of it already done) where the checkpoint a run resumes from
        stopped, as the checkpoint counted them: (0, 0) for a new run."""
        return self._resume_cut

    def done_training(self) -> bool:
        return self.phase_idx >= len(self.phases) - 1

    def advance_phase(self) -> None:
        """Move to the next phase: meters, model mode, data iterator. Raises StopIteration
        after the last phase."""
        if self.done_training():
            raise StopIteration
        self.phase_idx += 1
        phase = self.phase
        self.train = phase["train"]
        if self.train:
            self.train_phase_idx += 1
        (start_iter, start_sample), self._resume_start = self._resume_start, (0, 0)
        if start_iter == 0 and start_sample == 0:
            self.metrics.reset()
            for meter in self.meters:
                meter.reset()
        self.iteration_num_in_phase = start_iter
        split = "TRAIN" if self.train else "TEST"
        cfg = self.config
        loader = self._loaders.get(split)
        if loader is None:  # workers persist across phases (DATA.PERSISTENT_WORKERS)
            loader = build_dataloader(
                self.datasets[split], cfg.DATA[split],
                num_workers=loader_workers(cfg),
                pin_memory=cfg.DATA.PIN_MEMORY and self.device.type == "cuda",
                epoch=phase["epoch"], start_sample=start_sample, seed=cfg.SEED_VALUE,
                persistent=cfg.DATA.PERSISTENT_WORKERS,
            )
            if loader.persistent_workers:
                self._loaders[split] = loader
        else:
            set_loader_position(loader, phase["epoch"], start_sample)
        self._phase_sampler, self._phase_start_iter = loader.sampler, start_iter
        self.num_iters_in_phase = start_iter + len(loader)
        self.data_iterator = iter(loader)
        self.model.train(self.train)

    def release_loaders(self) -> None:
        """Stop the workers of the current data iterator and of the persistent loaders (at the
        end of the run, also of a failed one: workers left to the garbage collector take
        seconds to stop)."""
        stop_workers(self.data_iterator)
        self.data_iterator = None
        for loader in self._loaders.values():
            stop_workers(getattr(loader, "_iterator", None))
        self._loaders.clear()

    def restore_rng_states(self) -> None:
        """Put back the RNG states saved with the checkpoint we resumed from (this rank's)."""
        if self._resume_rng_states is not None:
            rng.set_rng_state(rng.select_rank_state(self._resume_rng_states, get_rank()))
            self._resume_rng_states = None

    # ------------------------------------------------------------------ steps
    def run_hook(self, event: SSLClassyHookFunctions) -> None:
        start = time.perf_counter()
        for hook in self.hooks:
            getattr(hook, event.name)(self)
        self.hook_seconds += time.perf_counter() - start

    def set_hooks(self, hooks) -> "SelfSupervisionTask":
        self.hooks = list(hooks)
        return self

    def to_device(self, batch):  # DATA.<split>.DEVICE_AUGMENTATION: augmented there
        return batch_to_device(batch, self.datasets.get("TRAIN" if self.train else "TEST"),
                               self.device, bool(self.config.MODEL.CHANNELS_LAST))

    def train_step(self) -> None:
        self.train_step_fn(self)

    def eval_step(self) -> None:
        self.train_step_fn(self)

    def on_start(self):
        self.run_hook(SSLClassyHookFunctions.on_start)

    def on_phase_start(self):
        self.run_hook(SSLClassyHookFunctions.on_phase_start)

    def on_phase_end(self):
        self.run_hook(SSLClassyHookFunctions.on_phase_end)

    def on_end(self):
        self.run_hook(SSLClassyHookFunctions.on_end)

    # ------------------------------------------------------------------ state
    def get_classy_state(self, deep_copy: bool = False, phase_complete: bool = True):
        state = {
            "phase_idx": self.phase_idx,
            "train_phase_idx": self.train_phase_idx,
            "iteration": self.iteration,
            "iteration_num_in_phase": 0 if phase_complete else self.iteration_num_in_phase,
            "phase_complete": phase_complete,
            "base_model": self.base_model.get_classy_state(),
            "optimizer": self.optimizer.get_classy_state() if self.optimizer else None,
            "loss": self.loss.get_classy_state(),
            "meters": [meter.get_classy_state() for meter in self.meters],
            "losses": self.metrics.floats("loss"),
            "loss_terms": self.metrics.floats("loss_terms"),
            "amp_grad_scaler": self.amp.state_dict(),
            "position": self._position_state(phase_complete),
            "schedule": self.schedule.state(),
        }
        if self.ema_model is not None:
            state["ema_model"] = self.ema_model.get_classy_state()
        hook_states = self._hook_states()
        if hook_states:  # only hooks with state (e.g. the online probe's weights)
            state["hooks"] = hook_states
        if deep_copy:
            import copy

            state = copy.deepcopy(state)
        return state

    def _position_state(self, phase_complete: bool) -> Dict[str, Any]:
        """The run's settings and, inside a phase, the samples of its global order consumed."""
        batches = self.iteration_num_in_phase - self._phase_start_iter
        return position_state(self.run_settings(), self.phases[max(self.phase_idx, 0)],
                              None if phase_complete else self._phase_sampler, batches)

    def _hook_states(self) -> Dict[str, Any]:
        """``get_classy_state()`` of every hook that has state, by hook name (hooks/base.py)."""
        states = {}
        for hook in getattr(self, "hooks", []):
            hook_state = hook.get_classy_state() if isinstance(hook, SSLHook) else {}
            if hook_state:
                states[hook.name()] = hook_state
        return states

    def set_classy_state(self, state) -> None:
        self.base_model.set_classy_state(state["base_model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.set_classy_state(state["optimizer"])
        if state.get("loss"):
            self.loss.set_classy_state(state["loss"])
        self.amp.load_state_dict(state.get("amp_grad_scaler") or {})
        for hook in getattr(self, "hooks", []):
            if hook.name() in state.get("hooks", {}):  # absent: saved without it
                hook.set_classy_state(state["hooks"][hook.name()])
        if self.ema_model is not None:
            if state.get("ema_model") is not None:
                self.ema_model.set_classy_state(state["ema_model"])
            else:
                self.ema_model.set(self.base_model)
                logger.warning("the checkpoint holds no EMA model (HOOKS.EMA_MODEL was off): "
                               "the average starts from the restored weights")
        self.iteration = state["iteration"]
        plan = plan_resume(state, self.run_settings(),
                           self.config.CHECKPOINT.get("RESUME_SCHEDULE", "rescale"), self.phases)
        if plan.message and get_rank() == 0:
            logger.warning("%s", plan.message)
        self.phase_idx, self.train_phase_idx = plan.phase_idx, plan.train_phase_idx
        self.schedule, self._resume_cut = plan.schedule, plan.cut
        self._resume_start = (plan.start_iter, plan.start_sample)
        if plan.start_iter or plan.start_sample:  # the phase goes on
            for meter, meter_state in zip(self.meters, state["meters"]):
                meter.set_classy_state(meter_state)
            self.metrics.reset()  # the phase's averages go on from the saved values
            self.metrics.set_history("loss", state["losses"])
            self.metrics.set_history("loss_terms", state.get("loss_terms", []))
