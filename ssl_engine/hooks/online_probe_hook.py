"""A linear classifier trained beside pretraining on the detached features of one trunk stage
and evaluated on the labelled TEST split (HOOKS.ONLINE_LINEAR_PROBE)."""
import logging
import math
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ssl_engine.config import ConfigError
from ssl_engine.data import build_dataloader
from ssl_engine.evaluation.labelled_features import EvalSplits, evaluation_mode
from ssl_engine.hooks.base import SSLHook
from ssl_engine.models.base_ssl_model import check_model_config
from ssl_engine.utils.cpu_budget import loader_workers
from ssl_engine.utils.distributed import all_reduce_sum, gather_from_all, is_primary

logger = logging.getLogger(__name__)
KEY = "config.HOOKS.ONLINE_LINEAR_PROBE"
LR_SCHEDULES = ("cosine", "constant")
CACHE_BYTES = 256 * 2 ** 20  # a TEST split whose inputs fit is kept in memory between evaluations


def check_probe_config(cfg) -> None:
    """Refuse, before launch, the settings the probe cannot work with, naming the key."""
    probe = cfg.HOOKS.ONLINE_LINEAR_PROBE
    if not float(probe.LR) > 0:
        raise ConfigError(f"{KEY}.LR must be > 0, got {probe.LR}")
    if not float(probe.WEIGHT_DECAY) >= 0:
        raise ConfigError(f"{KEY}.WEIGHT_DECAY must be >= 0, got {probe.WEIGHT_DECAY}")
    if probe.get("LR_SCHEDULE", "cosine") not in LR_SCHEDULES:
        raise ConfigError(f"{KEY}.LR_SCHEDULE must be one of {', '.join(LR_SCHEDULES)}, got "
                          f"{probe.LR_SCHEDULE!r}")
    if not 0 <= float(probe.MOMENTUM) < 1:
        raise ConfigError(f"{KEY}.MOMENTUM must be in [0, 1), got {probe.MOMENTUM}")
    if int(probe.NUM_CLASSES) < 0:
        raise ConfigError(f"{KEY}.NUM_CLASSES must be >= 0 (0: from the data's labels), "
                          f"got {probe.NUM_CLASSES}")
    if not cfg.DATA.TEST.DATA_SOURCES:
        raise ConfigError(f"{KEY}.ENABLED is evaluated on the labelled TEST split: set "
                          "config.DATA.TEST.DATA_SOURCES (or ENABLED=false)")
    if cfg.DATA.TRAIN.LABEL_TYPE != "standard":
        raise ConfigError(f"{KEY}.ENABLED trains on the class labels of the training batches: "
                          "it needs config.DATA.TRAIN.LABEL_TYPE=standard, got "
                          f"'{cfg.DATA.TRAIN.LABEL_TYPE}'")
    if probe.LAYER:
        model = check_model_config(cfg.MODEL)
        if model is not None:
            try:
                model.trunk.check_out_feat_keys([probe.LAYER])
            except ValueError as error:
                raise ConfigError(f"{KEY}.LAYER={probe.LAYER}: {error}") from None


def pooled(features: torch.Tensor) -> torch.Tensor:
    """[N, D] features: a stage map [N, C, ...] is averaged over its positions."""
    return features if features.dim() == 2 else features.flatten(2).mean(dim=2)


def num_classes_of(datasets) -> int:
    """1 + the largest class index of ``datasets``' sources (their ``labels()``)."""
    largest = -1
    for dataset in datasets:
        labels = dataset.source.labels() if hasattr(dataset.source, "labels") else None
        labels = None if labels is None else torch.as_tensor(labels)
        if labels is None or labels.dim() != 1 or labels.is_floating_point():
            raise ConfigError(f"{KEY}: the labels of config.DATA.{dataset.split} are not class "
                              f"indices the probe can count; set {KEY}.NUM_CLASSES")
        if len(labels):
            largest = max(largest, int(labels.max()))
    if largest < 0:
        raise ConfigError(f"{KEY}: the data has no labels; set {KEY}.NUM_CLASSES")
    return largest + 1


class OnlineLinearProbeHook(SSLHook):
    """Trains ``probe`` (a batch norm without affine parameters, then a linear layer from
    zeros) on the trunk stage HOOKS.ONLINE_LINEAR_PROBE.LAYER (default: the trunk's output),
    with SGD of its own (LR, WEIGHT_DECAY, MOMENTUM), its lr decayed with a cosine from LR
    to 0 over the run (``task.where``; LR_SCHEDULE=constant keeps LR: its last evaluations
    then scatter as much as its first steps, see docs/evaluation.md).

    Its features are those of the training forward pass: a forward hook on the trunk keeps,
    detached, its output of the first input group of each batch (every view of the first
    resolution), with the matching rows of the batch's targets; the stage is added to what
    the trunk is asked for when it is not among them. Every rank gathers the features and
    labels of all ranks and takes the same step, so the probe is the same everywhere; it never
    touches the trunk's graph, the model's parameters or the random generators.

    Evaluated on the labelled TEST split (read as the k-NN hook reads it) at the end of every
    test phase, or of every train phase when TEST_MODEL is false: rank 0 logs top-1 / top-5
    and writes ``{"online_probe": ...}`` to the task's metrics store (the same on every rank:
    not reduced), for metrics.json, TensorBoard (``online_probe/top1``) and the trackers. The
    training batches' top-1 is the store's ``online_probe_train_top1``.
    Its weights and optimizer are checkpointed (``get_classy_state``)."""

    def __init__(self, cfg):
        super().__init__()
        check_probe_config(cfg)
        self.cfg = cfg
        settings = cfg.HOOKS.ONLINE_LINEAR_PROBE
        self.layer: Optional[str] = settings.LAYER or None  # None: the trunk's default output
        self.lr, self.weight_decay = float(settings.LR), float(settings.WEIGHT_DECAY)
        self.momentum = float(settings.MOMENTUM)
        self.cosine = settings.get("LR_SCHEDULE", "cosine") == "cosine"
        self.num_classes = int(settings.NUM_CLASSES)
        self.eval_after_test_phase = bool(cfg.TEST_MODEL)
        self.probe: Optional[nn.Module] = None
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.splits: Optional[EvalSplits] = None
        self._restored: Optional[Dict[str, Any]] = None
        self._handles = []
        self._armed = False  # in a train phase: keep the trunk's first output of each batch
        self._capturing = False  # this trunk call's output is kept
        self._added = False  # the stage was added to the trunk's requested outputs
        self._features: Optional[torch.Tensor] = None
        self._cached = None  # the TEST batches, when they fit in CACHE_BYTES

    # ------------------------------------------------------------------ state
    def get_classy_state(self) -> Dict[str, Any]:
        if self.probe is None:
            return dict(self._restored or {})
        return {"probe": self.probe.state_dict(), "optimizer": self.optimizer.state_dict()}

    def set_classy_state(self, state: Dict[str, Any]) -> None:
        self._restored = state  # applied once the probe is built (on_start)
        if self.probe is not None:
            self._load(state)

    def _load(self, state: Dict[str, Any]) -> None:
        self.probe.load_state_dict(state["probe"])
        self.optimizer.load_state_dict(state["optimizer"])

    # ------------------------------------------------------------------ events
    def on_start(self, task) -> None:
        trunk = task.base_model.trunk
        self.layer = trunk.check_out_feat_keys([self.layer] if self.layer else None)[0]
        if self.splits is None:
            self.splits = EvalSplits(self.cfg, splits=("TEST",))
        if not self.num_classes:
            labelled = [task.datasets["TRAIN"], self.splits.datasets["TEST"].dataset]
            self.num_classes = num_classes_of(labelled)
        dim = trunk.stage_dims[self.layer]
        linear = nn.Linear(dim, self.num_classes)
        nn.init.zeros_(linear.weight)  # no random draw: the run's generators are untouched
        nn.init.zeros_(linear.bias)
        self.probe = nn.Sequential(nn.BatchNorm1d(dim, affine=False), linear).to(task.device)
        self.optimizer = torch.optim.SGD(self.probe.parameters(), lr=self.lr,
                                         momentum=self.momentum,
                                         weight_decay=self.weight_decay)
        if self._restored:
            self._load(self._restored)
        self._handles = [trunk.register_forward_pre_hook(self._ask_stage, with_kwargs=True),
                         trunk.register_forward_hook(self._keep_stage, with_kwargs=True)]

    def on_phase_start(self, task) -> None:
        self._armed, self._features = task.train, None

    def on_forward(self, task) -> None:
        if not task.train:
            return
        features, self._features = self._features, None
        if features is None:
            return
        # the labels: the batch's "label" where its target is something else (the masking
        # collator's patch masks), else its target
        targets = task.last_batch.get("label", task.last_batch["target"])
        targets = targets.reshape(len(targets), -1)[: len(features), 0]
        self._train_step(task, pooled(features.float()), targets)

    def on_phase_end(self, task) -> None:
        self._armed = False
        if task.train == self.eval_after_test_phase:
            return
        top1, top5 = self._evaluate(task)
        if not is_primary():
            return
        logger.info("online linear probe top-1 %.2f / top-5 %.2f (layer %s, train phase %d)",
                    top1, top5, self.layer, task.train_phase_idx)
        task.metrics.write({"online_probe": {
            "layer": self.layer, "top1": top1, "top5": top5,
            "train_phase_idx": task.train_phase_idx}}, task.iteration)

    def on_end(self, task) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    on_exception = on_end

    # ------------------------------------------------------------------ the trunk's forward
    def _ask_stage(self, trunk, args, kwargs):
        """Adds the probe's stage to the outputs requested by the first training forward of a
        batch (gradients on: the evaluations of other hooks run without)."""
        self._capturing = (self._armed and self._features is None
                           and torch.is_grad_enabled())
        self._added = False
        if not self._capturing:
            return None
        keys = trunk.check_out_feat_keys(args[1] if len(args) > 1
                                         else kwargs.get("out_feat_keys"))
        if self.layer in keys:
            return None
        self._added = True
        return args[:1], {**kwargs, "out_feat_keys": keys + [self.layer]}

    def _keep_stage(self, trunk, args, kwargs, output):
        """Keeps the probe's stage (detached) and gives the model what it asked for."""
        if not self._capturing:
            return None
        self._capturing = False
        if self._added:
            self._features = output[-1].detach()
            return output[:-1]
        keys = trunk.check_out_feat_keys(args[1] if len(args) > 1
                                         else kwargs.get("out_feat_keys"))
        self._features = output[keys.index(self.layer)].detach()
        return None

    # ------------------------------------------------------------------ the probe
    def _train_step(self, task, features: torch.Tensor, targets: torch.Tensor) -> None:
        """One SGD step of the probe on the batch of every rank (a collective)."""
        features, targets = gather_from_all(features), gather_from_all(targets)
        with torch.autocast(features.device.type, enabled=False), torch.enable_grad():
            self.probe.train()
            # the unlabelled images (target < 0) weigh nothing; weights instead of a boolean
            # selection, whose size the host would wait for (a batch without labels then
            # makes a step of weight decay and momentum alone)
            labelled = (targets >= 0).float()
            count = labelled.sum().clamp(min=1)
            logits = self.probe(features)
            losses = F.cross_entropy(logits, targets.long().clamp(min=0), reduction="none")
            loss = (losses * labelled).sum() / count
            if self.cosine:  # from LR at the start of the run to 0 at its end
                for group in self.optimizer.param_groups:
                    group["lr"] = self.lr * 0.5 * (1 + math.cos(math.pi * task.where))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        correct = (logits.detach().argmax(dim=1) == targets).float() * labelled
        task.metrics.put("online_probe_train_top1", 100 * correct.sum() / count)

    @torch.no_grad()
    def _evaluate(self, task):
        """(top-1, top-5) in % of the probe on the TEST split, on every rank (a collective):
        each rank classifies its share; the sampler's padding repeats are counted once."""
        model, probe, layer, device = task.base_model, self.probe, self.layer, task.device
        size = len(self.splits.datasets["TEST"])
        hits = torch.zeros(2, size, device=device)  # top-1 and top-5 hits by sample
        seen = torch.zeros(size, device=device)
        with evaluation_mode(model, probe):
            for inputs, targets, data_idx in self._test_batches(device):
                stage = model.trunk(inputs, out_feat_keys=[layer])[0]
                logits = probe(pooled(stage.float()))
                ranked = logits.topk(min(5, logits.shape[1]), dim=1).indices
                correct = ranked == targets.to(device).reshape(-1, 1)
                data_idx = data_idx.to(device)
                hits[0].index_add_(0, data_idx, correct[:, 0].float())
                hits[1].index_add_(0, data_idx, correct.any(dim=1).float())
                seen.index_add_(0, data_idx, torch.ones_like(data_idx, dtype=seen.dtype))
        hits, seen = all_reduce_sum(hits), all_reduce_sum(seen)
        top = 100 * (hits / seen.clamp(min=1)).sum(dim=1) / size
        return top[0].item(), top[1].item()

    def _test_batches(self, device):
        """This rank's (inputs, targets, data_idx) batches of the TEST split on ``device``. They
        are the same at every evaluation (epoch 0, no shuffling, augmentation seeded by
        sample), so they are kept in memory after the first when they fit in CACHE_BYTES."""
        if self._cached is not None:
            yield from ((x.to(device), t, i) for x, t, i in self._cached)
            return
        cfg = self.splits.cfg
        loader = build_dataloader(self.splits.datasets["TEST"], cfg.DATA.TEST,
                                  num_workers=loader_workers(cfg),
                                  pin_memory=cfg.DATA.PIN_MEMORY and device.type == "cuda",
                                  epoch=0, shuffle=False)
        kept, size = [], 0
        for batch in loader:
            inputs, targets, data_idx = batch["input"], batch["target"], batch["data_idx"]
            if isinstance(inputs, torch.Tensor):
                size += inputs.numel() * inputs.element_size()
                kept.append((inputs, targets, data_idx))
            else:  # several resolutions: not kept
                size, inputs = CACHE_BYTES + 1, [x.to(device) for x in inputs]
            yield (inputs.to(device) if isinstance(inputs, torch.Tensor) else inputs,
                   targets, data_idx)
        if size <= CACHE_BYTES:
            self._cached = kept
