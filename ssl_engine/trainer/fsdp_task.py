"""``self_supervision_fsdp_task`` (TRAINER.TASK_NAME): the task with its model fully sharded
by torch's FSDP2 (``torch.distributed.fsdp.fully_shard``) instead of replicated by DDP.

Each process keeps 1/P of the parameters, of their gradients and of the optimizer state; a
sharded unit's parameters are all-gathered for its forward and backward and its gradients
reduce-scattered.  The units are the trunk's stages or blocks (``fsdp_units()``), every head
and the rest of the model.  Works on gloo (CPU) and NCCL.

Checkpoints come in two parts, both written at every save:
- ``<name>.sharded/``: the model and optimizer state, each rank writing its own shard with
  ``torch.distributed.checkpoint``, into a temporary folder renamed once complete. A resume
  reads them back, resharded for any number of processes.
- ``<name>``: the engine's usual checkpoint, with the whole model (rank 0 gathers it) for
  evaluation, extraction and export, the position of the run and the loss state; its
  optimizer entry names the sharded folder.
"""
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn

from ssl_engine.config import ConfigError
from ssl_engine.losses.momentum_target import MomentumTargetLoss
from ssl_engine.models import build_model
from ssl_engine.models.ema import ema_model_enabled
from ssl_engine.models.sync_bn import convert_sync_bn
from ssl_engine.optimizers.larc import LARC
from ssl_engine.trainer.task import SelfSupervisionTask
from ssl_engine.utils.classy import register_task
from ssl_engine.utils.distributed import BufferBroadcast, broadcast_buffers, get_rank

logger = logging.getLogger(__name__)

SHARDED_SUFFIX = ".sharded"


_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
FSDP_CONFIG = "config.MODEL.FSDP_CONFIG"


def _dtype(fsdp_cfg) -> torch.dtype:
    value = fsdp_cfg.get("compute_dtype", "float32")
    if isinstance(value, torch.dtype) and value in _DTYPES.values():
        return value
    name = str(value).replace("torch.", "")
    if name not in _DTYPES:
        raise ConfigError(f"{FSDP_CONFIG}.compute_dtype={value!r} is not one of "
                          f"{', '.join(_DTYPES)}")
    return _DTYPES[name]


def mixed_precision_policy(fsdp_cfg):
    """FSDP_CONFIG's fairscale precision as FSDP2's MixedPrecisionPolicy for the trunk (None:
    float32). As in fairscale, ``mixed_precision`` with a ``compute_dtype`` below float32
    gathers the parameters in that dtype for the forward and backward (the sharded parameters
    and the optimizer stay float32), and ``fp32_reduce_scatter`` reduces the gradients in
    float32 instead of the compute dtype."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    fsdp_cfg = fsdp_cfg or {}
    dtype = _dtype(fsdp_cfg)
    if not fsdp_cfg.get("mixed_precision", True) or dtype == torch.float32:
        return None
    reduce = torch.float32 if fsdp_cfg.get("fp32_reduce_scatter", False) else dtype
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=reduce)


def fsdp_units(model: torch.nn.Module, fsdp_cfg=None) -> List[Tuple[str, torch.nn.Module]]:
    """(name, module) of every unit ``shard_model`` shards on its own, inner ones first:
    with FSDP_CONFIG.AUTO_WRAP_THRESHOLD > 0 each trunk convolution with at least that many
    parameters, then the trunk's stages or blocks (``fsdp_units()``), then every head with
    parameters. The model itself is sharded last (the parameters left: stem, pools ...)."""
    threshold = int((fsdp_cfg or {}).get("AUTO_WRAP_THRESHOLD", 0) or 0)
    names = {id(module): name for name, module in model.named_modules()}
    units = []
    if threshold > 0:
        units += [module for module in model.trunk.modules() if isinstance(module, nn.Conv2d)
                  and sum(p.numel() for p in module.parameters()) >= threshold]
    units += list(getattr(model.trunk, "fsdp_units", lambda: [])())
    units += [head for head in model.heads if any(True for _ in head.parameters())]
    return [(names[id(unit)], unit) for unit in units]


def shard_model(model: torch.nn.Module, fsdp_cfg=None) -> torch.nn.Module:
    """Rank 0's weights on every rank, then ``fully_shard`` on the units of ``fsdp_units``, then
    the whole model (in place), with FSDP_CONFIG's precision (``mixed_precision_policy``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    with torch.no_grad():  # every rank starts from rank 0's weights, as with DDP
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)
        # FSDP2 shards contiguous parameters only: MODEL.CHANNELS_LAST then applies to the
        # activations (the inputs are channels_last, and convolutions keep that layout)
        for param in model.parameters():
            if not param.is_contiguous():
                param.data = param.data.contiguous()
    policy = mixed_precision_policy(fsdp_cfg)
    units = fsdp_units(model, fsdp_cfg)
    trunk_policy = {} if policy is None else {"mp_policy": policy}
    if policy is not None:
        # batch norms keep float32 parameters (their own units, inputs not cast), and heads
        # run in float32 (their inputs cast up), as without FSDP (see float32_heads)
        for module in model.trunk.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.affine:
                fully_shard(module, mp_policy=MixedPrecisionPolicy())
    heads = {id(head) for head in model.heads}
    for _, unit in units:
        fully_shard(unit, **({"mp_policy": MixedPrecisionPolicy(param_dtype=torch.float32)}
                             if policy is not None and id(unit) in heads else trunk_policy))
    fully_shard(model, **trunk_policy)
    if get_rank() == 0:
        logger.info("FSDP units: %s, and the rest of the model%s", ", ".join(n for n, _ in units),
                    "" if policy is None else
                    f" (parameters gathered in {policy.param_dtype}, gradients reduced in "
                    f"{policy.reduce_dtype}; batch norms and heads in float32)")
    return model


def torch_optimizer(task) -> torch.optim.Optimizer:
    """The torch optimizer whose state is checkpointed: the one LARC wraps under LARC."""
    optimizer = task.optimizer.classy_optimizer.optimizer
    return optimizer.optim if isinstance(optimizer, LARC) else optimizer


@register_task("self_supervision_fsdp_task")
class SelfSupervisionFSDPTask(SelfSupervisionTask):
    @classmethod
    def check_config(cls, cfg) -> None:
        """Refuse, before launch, what this task does not support yet."""
        fsdp_cfg = cfg.MODEL.FSDP_CONFIG
        mixed_precision_policy(fsdp_cfg)  # compute_dtype is known
        threshold = fsdp_cfg.get("AUTO_WRAP_THRESHOLD", 0)
        if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
            raise ConfigError(f"{FSDP_CONFIG}.AUTO_WRAP_THRESHOLD must be an integer >= 0 (0: "
                              f"no convolution is a unit of its own), got {threshold!r}")
        why = None
        if (cfg.MODEL.get("SHARDED_DDP_SETUP") or {}).get("USE_SDP", False):
            why = ("config.MODEL.SHARDED_DDP_SETUP.USE_SDP=true: FSDP already shards the "
                   "gradients; leave USE_SDP off")
        elif cfg.OPTIMIZER.get("use_zero", False):
            why = ("config.OPTIMIZER.use_zero=true: FSDP already shards the optimizer state; "
                   "leave use_zero off")
        elif ema_model_enabled(cfg):
            why = ("config.HOOKS.EMA_MODEL (SAVE_EMA_MODEL or ENABLE_EMA_METERS on): the "
                   "average of sharded weights is not supported yet; use DDP "
                   "(TRAINER.TASK_NAME=self_supervision_task)")
        if why:
            raise ConfigError(f"TRAINER.TASK_NAME=self_supervision_fsdp_task with {why}")

    def channels_last_weights(self) -> bool:
        return False  # FSDP2 shards contiguous parameters only

    def _wrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        fsdp_cfg = self.config.MODEL.FSDP_CONFIG
        if get_rank() == 0:
            logger.info("%s.flatten_parameters=%s: FSDP2 shards every parameter on its own "
                        "(no flat buffers); the setting does not change the results",
                        FSDP_CONFIG, fsdp_cfg.get("flatten_parameters", True))
        model = shard_model(model, fsdp_cfg)  # the model itself, its parameters sharded DTensors
        if broadcast_buffers(self.config) and any(True for _ in model.buffers()):
            # fully_shard leaves buffers replicated and does not sync them
            model.register_forward_pre_hook(BufferBroadcast(model))
        return model

    def _bind_loss(self) -> None:
        """A momentum target (MoCo, BYOL, DINO ...) is copied from an unsharded model with the
        sharded model's weights, then sharded into the same units (FSDP modules cannot be
        copied): its parameters are sharded like the online ones, so that each rank moves its
        own shard of the target towards its shard of the online weights."""
        if not isinstance(self.loss, MomentumTargetLoss):
            super()._bind_loss()
            return
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        plain = convert_sync_bn(build_model(self.config.MODEL), self.config).to(self.device)
        plain.load_state_dict(get_model_state_dict(self.base_model,
                                                   options=self._options(full=True, offload=False)))
        self.loss.bind_model(plain)
        target = shard_model(self.loss.target_network, self.config.MODEL.FSDP_CONFIG)
        # FSDP keeps the root unit's parameters gathered after a forward (for the backward,
        # which the target never runs): shard them again, so that they are the same shards
        # as the online model's when the target moves
        target.register_forward_hook(lambda module, inputs, output: module.reshard())

    def _full_loss_state(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """The loss state with a sharded target's tensors gathered (on every rank)."""
        from torch.distributed.tensor import DTensor

        return {key: value.full_tensor().cpu() if isinstance(value, DTensor) else value
                for key, value in state.items()}

    def _sharded_loss_state(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """A checkpoint's loss state with the target's tensors as this run's shards."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        current = self.loss.state_dict()
        sharded = dict(state)
        for key, value in state.items():
            now = current.get(key)
            if isinstance(now, DTensor) and not isinstance(value, DTensor):
                sharded[key] = distribute_tensor(value.to(now.device, now.dtype), now.device_mesh,
                                                 now.placements, src_data_rank=None)
        return sharded

    # ------------------------------------------------------------------ state
    def _options(self, full: bool, offload: Optional[bool] = None, strict: bool = True):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=full, strict=strict,
                                cpu_offload=full if offload is None else offload)

    def get_classy_state(self, deep_copy: bool = False, phase_complete: bool = True):
        """The usual state with the whole model, gathered on rank 0 (every rank must call
        this); the optimizer state lives in the sharded checkpoint saved beside it."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        full = get_model_state_dict(self.base_model, options=self._options(full=True))
        optimizer, self.optimizer = self.optimizer, None  # not gathered: see save_sharded
        try:
            state = super().get_classy_state(deep_copy=False, phase_complete=phase_complete)
        finally:
            self.optimizer = optimizer
        state["base_model"] = {"model": {
            part: {key[len(part) + 1:]: value for key, value in full.items()
                   if key.startswith(part + ".")}
            for part in ("trunk", "heads")
        }}
        state["optimizer"] = {"sharded_checkpoint": self._sharded_name}
        if isinstance(state.get("loss"), dict):
            state["loss"] = self._full_loss_state(state["loss"])
        return state

    def save_sharded(self, folder: str, filename: str) -> None:
        """Write the model and optimizer shards of every rank to ``folder/filename.sharded``
        (complete or absent: written under a temporary name, renamed by rank 0).

        What is not sharded (the buffers: batch-norm statistics, ``num_batches_tracked`` ...)
        is written from rank 0, as in the consolidated checkpoint: each rank updates its own
        copy of the statistics from its part of the batch (rank 0's reach every rank at the next
        forward pass), and ``torch.distributed.checkpoint`` would otherwise write each such
        entry from whichever rank has the least to write."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import DefaultSavePlanner
        from torch.distributed.checkpoint.state_dict import get_state_dict

        name = filename + SHARDED_SUFFIX
        final, partial = Path(folder) / name, Path(folder) / (name + ".partial")
        if get_rank() == 0:
            shutil.rmtree(partial, ignore_errors=True)
        dist.barrier()
        model_state, optimizer_state = get_state_dict(
            self.base_model, torch_optimizer(self), options=self._options(full=False))
        dcp.save({"model": model_state, "optimizer": optimizer_state},
                 checkpoint_id=str(partial),
                 planner=DefaultSavePlanner(dedup_save_to_lowest_rank=True))
        dist.barrier()
        if get_rank() == 0:
            shutil.rmtree(final, ignore_errors=True)
            os.replace(partial, final)
        dist.barrier()
        self._sharded_name = name

    _sharded_name: Optional[str] = None

    def set_classy_state(self, state: Dict[str, Any]) -> None:
        """Resume: the model and optimizer from the sharded checkpoint the state names, the
        rest as usual."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        sharded = (state.get("optimizer") or {}).get("sharded_checkpoint")
        if not sharded:
            raise ValueError(
                "this checkpoint holds no sharded model and optimizer state: resume an FSDP run "
                "from a checkpoint of an FSDP run (TRAINER.TASK_NAME=self_supervision_fsdp_task)")
        path = Path(self.checkpoint_folder) / sharded
        if not path.is_dir():
            raise FileNotFoundError(f"the sharded checkpoint {path} named by the checkpoint is "
                                    "missing")
        model_state, optimizer_state = get_state_dict(
            self.base_model, torch_optimizer(self), options=self._options(full=False))
        loaded = {"model": model_state, "optimizer": _saved_optimizer_state(optimizer_state, path)}
        dcp.load(loaded, checkpoint_id=str(path))
        # not strict: parameters without optimizer state stay without (dcp.load above has
        # refused a checkpoint that lacks any model tensor)
        set_state_dict(self.base_model, torch_optimizer(self),
                       model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"],
                       options=self._options(full=False, strict=False))
        rest = dict(state, base_model=None, optimizer=None)
        if rest.get("loss"):
            rest["loss"] = self._sharded_loss_state(rest["loss"])
        base_model, self.base_model = self.base_model, _NoModelState()
        try:
            super().set_classy_state(rest)
        finally:
            self.base_model = base_model


def _saved_optimizer_state(optimizer_state: Dict[str, Any], path: Path) -> Dict[str, Any]:
    """``optimizer_state`` without the parameters the checkpoint holds no state of: those not
    yet updated when it was saved (frozen by MODEL.TEMP_FROZEN_PARAMS_ITER_MAP).  Reading the
    state gives every parameter one (torch's ``get_state_dict``); they go without, as in the
    run that was saved, so that their first update is the same."""
    import torch.distributed.checkpoint as dcp

    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state = {name: value for name, value in optimizer_state.get("state", {}).items()
             if all(f"optimizer.state.{name}.{key}" in saved for key in value)}
    return dict(optimizer_state, state=state)


class _NoModelState:
    """Stands in for the model while the base class restores the rest of the state."""

    def set_classy_state(self, state) -> None:
        pass
