"""The loss contract: ``SSLLoss``, the base class of every loss of the engine, and
``StepContext``, what a loss is told before each computation.

A loss is called as ``loss(output, target)`` (``output`` the model's list of output tensors, a
lone tensor accepted; ``target`` the batch's targets) and returns a scalar tensor.  Besides
``forward``, a loss may override any member below; each says who calls it and when, and its
default is what a loss that does not override it gets.  A loss registered as a plain classy
``ClassyLoss`` is given these defaults by ``with_contract`` (``build_loss`` does it), keeping
any of these members it defines itself.
"""
import functools
import inspect
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Type

import torch

from ssl_engine.config.derive import crops_per_sample
from ssl_engine.utils.classy import ClassyLoss
from ssl_engine.utils.errors import ConfigError


@dataclass(frozen=True)
class StepContext:
    """Where the run stands when a loss is computed."""

    # the schedules' iteration: optimizer updates done so far in the run (resumed: from the
    # checkpoint; resumed with other settings: the run's position counted in its new updates)
    iteration: int = 0
    phase_idx: int = 0  # index of the current phase in ``task.phases``
    train: bool = True  # whether the step trains: evaluation steps leave the loss's state alone
    total_iterations: int = 0  # the schedules' length: optimizer updates of the whole run

    @classmethod
    def of_task(cls, task) -> "StepContext":
        """The context of ``task``'s current step (the train step calls it before the loss)."""
        return cls(iteration=task.schedule_iteration, phase_idx=task.phase_idx,
                   train=task.train, total_iterations=task.schedule_length)


class SSLLoss(ClassyLoss):
    """The base of every loss: the members the engine reads, each with its default."""

    # ------------------------------------------------------------------ building
    # Config keys that are not the parameter's name: {parameter: dotted key under LOSS.<name>}.
    config_keys: Mapping[str, str] = MappingProxyType({})

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "SSLLoss":
        """The loss built from its settings ``LOSS.<name>`` (``build_loss``): each parameter of
        ``__init__`` takes the value of the key of its name (or of ``config_keys``), or its
        default when the key is absent.  Keys that name no parameter are not read."""
        return cls(**cls.config_arguments(config))

    @classmethod
    def config_arguments(cls, config: Mapping[str, Any]) -> Dict[str, Any]:
        """The keyword arguments of ``__init__`` that ``config`` gives."""
        arguments = {}
        for name, parameter in list(inspect.signature(cls.__init__).parameters.items())[1:]:
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            node, found = config, True
            for key in cls.config_keys.get(name, name).split("."):
                found = isinstance(node, Mapping) and key in node
                if not found:
                    break
                node = node[key]
            if found:
                arguments[name] = node
        return arguments

    # The key of ``LOSS.<name>`` that takes the crops per sample of the training transforms
    # (ImgPilToMultiCrop's total_num_crops, ImgReplicatePil's num_times), e.g. "num_crops".
    # Default None: the loss reads no crop count.
    crops_key: Optional[str] = None
    # Whether the loss's targets are the samples' indices (a memory bank of the training set):
    # DATA.TRAIN.LABEL_TYPE must then be sample_index.  Default False.
    sample_index_targets: bool = False
    # The parameter of the last head (MODEL.HEAD.PARAMS) whose size is the loss's output_dim
    # (DINO's num_clusters: the prototypes the loss centers and sharpens).  Default None.
    output_dim_head_key: Optional[str] = None

    @classmethod
    def derive_config(cls, cfg) -> None:
        """Fill, in place and before launch, the settings of ``cfg`` (the whole config, this
        loss's own under ``cfg.LOSS[cfg.LOSS.name]``) that follow from the rest of it, and refuse
        what cannot work (``ConfigError``); called by the config's derivations
        (``derive_settings``) for the loss ``LOSS.name``, before anything is built.  Default:
        ``crops_key`` set from the training transforms and ``sample_index_targets`` checked
        (unless TEST_ONLY), output_dim from ``output_dim_head_key``; nothing for a loss that
        declares none of these.  An override calls ``super().derive_config(cfg)`` to keep
        them."""
        if cls.crops_key and not cfg.TEST_ONLY:
            crops = crops_per_sample(cfg.DATA.TRAIN.TRANSFORMS)
            if crops:
                cfg.LOSS.setdefault(cfg.LOSS.name, {})[cls.crops_key] = crops
        if cls.output_dim_head_key and cfg.MODEL.HEAD.PARAMS:
            head = cfg.MODEL.HEAD.PARAMS[-1]
            params = head[1] if isinstance(head, (list, tuple)) and len(head) == 2 else None
            size = params.get(cls.output_dim_head_key) if isinstance(params, dict) else None
            if size:
                size = size[0] if isinstance(size, (list, tuple)) else size
                cfg.LOSS.setdefault(cfg.LOSS.name, {})["output_dim"] = int(size)
        if cls.sample_index_targets and not cfg.TEST_ONLY \
                and cfg.DATA.TRAIN.LABEL_TYPE != "sample_index":
            raise ConfigError(f"config.LOSS.name={cfg.LOSS.name} keeps a memory bank of the "
                              "training set indexed by sample: set "
                              "config.DATA.TRAIN.LABEL_TYPE=sample_index (got "
                              f"{cfg.DATA.TRAIN.LABEL_TYPE!r})")

    @classmethod
    def check_model_config(cls, model_cfg) -> None:
        """Refuse, before launch, a model the loss cannot train (``engines/train.py``'s checks,
        with ``config.MODEL``); e.g. a missing predictor head.  Default: accept any."""

    @classmethod
    def build_hooks(cls) -> List:
        """The hooks the loss works with, added to the run's hooks when they are built
        (``trainer/default_hooks.py``); e.g. the one driving a momentum target. Default:
        none."""
        return []

    def bind_model(self, model) -> None:
        """Called once by the task after the model is built and wrapped, before any checkpoint
        is restored, with the base model (every rank holds the same weights); e.g. to copy a
        momentum target from it or to find a head.  Default: nothing."""

    # ------------------------------------------------------------------ every step
    # The step the loss computes for; read it in ``forward`` (``self.step_context.iteration``).
    step_context: StepContext = StepContext()

    def begin_step(self, context: StepContext) -> None:
        """Called by the train step right before every loss computation, in training and
        evaluation steps (each micro-batch of an accumulated update gets the update's
        context); a train step that computes the loss itself calls it too.  Default: keep
        ``context`` as ``self.step_context``."""
        self.step_context = context

    # The named parts of the last computation, logged beside the total (read by the train
    # step after each loss); set them with ``outputs.total_of``.  Default: none.
    loss_terms: Mapping[str, torch.Tensor] = MappingProxyType({})

    # Why the loss of N accumulated micro-batches is not the loss of one N times larger batch
    # (e.g. "its negatives are the other samples of the batch"): the task warns with it when
    # OPTIMIZER.gradient_accumulation_steps > 1.  Default None: a mean of per-sample terms.
    batch_coupling: Optional[str] = None

    # ------------------------------------------------------------------ collapse monitor
    # Whether the collapse monitor (HOOKS.COLLAPSE_MONITOR) measures the spread of the model's
    # first output; False where that output is not an embedding (DINO's prototype scores).
    monitor_embedding: bool = True

    def collapse_statistics(self) -> Dict[str, torch.Tensor]:
        """Named scalars of the last computation that show collapse, logged by the collapse
        monitor after every training loss (e.g. the entropy of SwAV's assignments).
        Default: none."""
        return {}

    @staticmethod
    def collapse_warning(statistics: Mapping[str, torch.Tensor]) -> Optional[str]:
        """Why ``statistics`` (the monitor's, the loss's included) mean collapse, or None; the
        collapse monitor logs the first such message of the run.  Default: None."""
        return None

    # ------------------------------------------------------------------ checkpoints
    def get_classy_state(self) -> Dict[str, Any]:
        """The loss's state in every checkpoint (the task's ``get_classy_state``, on every
        rank).  Default: the ``state_dict`` (buffers such as a queue or a center)."""
        return super().get_classy_state()

    def set_classy_state(self, state: Dict[str, Any]) -> None:
        """Restore a ``get_classy_state`` (the task, on resume, when the saved state is not
        empty; after ``bind_model``).  Default: ``load_state_dict``."""
        super().set_classy_state(state)


@functools.lru_cache(maxsize=None)
def with_contract(loss_class: Type[ClassyLoss]) -> Type[SSLLoss]:
    """``loss_class`` as an ``SSLLoss`` class: itself when it derives from ``SSLLoss``, else a
    subclass of it and ``SSLLoss`` of the same name (a plain ``ClassyLoss``, e.g. one of
    classy_vision's): the members it defines win, ``SSLLoss`` gives the others their default.
    Its instances are instances of ``loss_class`` with the same state."""
    if issubclass(loss_class, SSLLoss):
        return loss_class
    return type(loss_class.__name__, (loss_class, SSLLoss),
                {"__module__": loss_class.__module__, "__qualname__": loss_class.__qualname__,
                 "__doc__": loss_class.__doc__})
