"""Running one recipe for two tiny iterations in this process with a ``HostWaitCounter``
(ssl_engine/utils/host_waits.py) around each training step, its hooks included and the data
loading left out: tests/test_host_waits.py's tool."""
import contextlib
import traceback
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from ssl_engine.hooks import SSLHook
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.utils.host_waits import HostWaitCounter, watch_python_readbacks

from ssl_engine.config import load_config
from ssl_engine.engines.launcher import launch_distributed
from ssl_engine.engines.prelaunch import check_before_launch


def _tensors(obj):
    """Every tensor in a nested batch (dicts, lists, tuples)."""
    if torch.is_tensor(obj):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _tensors(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value)


class _PausedIterator:
    """The phase's data iterator, with the counter paused while a batch is made (the loader's
    transforms draw random numbers on the host; that is no wait for the device)."""

    def __init__(self, iterator, counter: HostWaitCounter):
        self._iterator, self._counter = iterator, counter

    def __iter__(self):
        return self

    def __next__(self):
        with self._counter.paused():
            batch = next(self._iterator)
        self.host_tensors = {id(t): t for t in _tensors(batch)}  # kept alive: ids stay unique
        return batch

    def __getattr__(self, name):
        return getattr(self._iterator, name)


class CountHostWaits(SSLHook):
    """Counts the waits of every training step: from the start of the phase or the end of the
    previous step's hooks to the end of this step's hooks. It is the last hook; its ``opener``
    is the first, so that a dispatch mode another hook enters for a step (the FLOP counter)
    nests inside the counter's. ``per_iteration``: {iteration: total}; ``where``: {iteration:
    the waits' places}; ``logged``: {iteration: whether it wrote the log line};
    ``cuda_syncs``: {iteration: the places of the synchronisations the CUDA runtime reported}
    on a GPU."""

    def __init__(self):
        super().__init__()
        self.counter = HostWaitCounter(host_resident=self._host_resident)
        self.opener = _Opener(self)
        self.per_iteration: Dict[int, int] = {}
        self.where: Dict[int, List[str]] = {}
        self.logged: Dict[int, bool] = {}
        self.cuda_syncs: Dict[int, List[str]] = {}
        self._task = None
        self._watch = None
        self._cuda: List = []

    def start(self, task) -> None:
        self._task = task
        task.data_iterator = _PausedIterator(task.data_iterator, self.counter)
        self.counter.reset()
        self.counter.__enter__()
        self._watch = contextlib.ExitStack()
        self._watch.enter_context(watch_python_readbacks(self.counter))
        if task.device.type == "cuda":  # what the CUDA runtime itself sees, step by step
            self._watch.enter_context(warnings.catch_warnings())
            warnings.simplefilter("always")
            warnings.showwarning = self._cuda_warning  # its Python stack, while it is there
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            self._watch.callback(torch.cuda.set_sync_debug_mode, previous)

    def _cuda_warning(self, message, *args, **kwargs) -> None:
        if "synchroniz" in str(message):
            stack = traceback.extract_stack()[-7:-1]
            self._cuda.append(" <- ".join(f"{Path(frame.filename).name}:{frame.lineno}"
                                          for frame in reversed(stack)))

    def _host_resident(self, tensor: torch.Tensor) -> bool:
        """A tensor of the loader's batch (before it moves to the device), or the step count of
        an optimizer's state (torch keeps it on the host unless ``capturable`` or ``fused``)."""
        iterator = getattr(self._task, "data_iterator", None)
        if id(tensor) in getattr(iterator, "host_tensors", {}):
            return True
        optimizer = getattr(self._task, "optimizer", None)
        inner = getattr(getattr(optimizer, "classy_optimizer", None), "optimizer", None)
        if inner is None or tensor.dim() != 0:
            return False
        return any(state.get("step") is tensor for state in inner.state.values())

    def on_step(self, task) -> None:
        if not task.train:
            return
        # the CUDA runtime's own reports of this step, on a GPU (the same waits seen again)
        self.cuda_syncs[task.iteration] = list(self._cuda)
        self._cuda.clear()
        self.per_iteration[task.iteration] = self.counter.total
        self.where[task.iteration] = list(self.counter.where)
        frequency = task.config.LOG_FREQUENCY
        self.logged[task.iteration] = (task.iteration % frequency == 0 or
                                       task.iteration_num_in_phase == task.num_iters_in_phase)
        self.counter.reset()

    def on_phase_end(self, task) -> None:
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
            self.counter.__exit__(None, None, None)
            self._watch = None
            task.data_iterator = getattr(task.data_iterator, "_iterator", task.data_iterator)

    on_exception = on_phase_end


class _Opener(SSLHook):
    """The first hook: starts the counter of a training phase."""

    def __init__(self, owner: CountHostWaits):
        super().__init__()
        self.owner = owner

    def on_phase_start(self, task) -> None:
        if task.train:
            self.owner.start(task)


class WithCounter:
    """A hook generator: ``hook.opener``, the default hooks, then ``hook``."""

    def __init__(self, hook: CountHostWaits):
        self.hook = hook

    def __call__(self, cfg):
        return [self.hook.opener] + default_hook_generator(cfg) + [self.hook]


# two iterations of 4 images, no loader processes, one epoch, no evaluation or report; the
# first iteration writes no log line, the second (the phase's last) does
TINY = [
    "config.DATA.TRAIN.DATA_LIMIT=8",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
    "config.DATA.TEST.DATA_LIMIT=8",
    "config.DATA.NUM_DATALOADER_WORKERS=0",
    "config.OPTIMIZER.num_epochs=1",
    "config.TEST_MODEL=false",
    "config.HOOKS.FEATURE_REPORT.ENABLED=false",
    "config.LOG_FREQUENCY=100",
    # on a machine with a GPU the steps run there, and the CUDA runtime's reports count too
    f"config.MACHINE.DEVICE={'gpu' if torch.cuda.is_available() else 'cpu'}",
    # there, in bfloat16: float16's GradScaler reads its overflow flag back at every step
    # (docs/performance.md, "No waits in a step"), which would hide any other wait
    *(["+config.MODEL.AMP_PARAMS.AMP_ARGS.dtype=bfloat16"] if torch.cuda.is_available() else []),
    "config.DISTRIBUTED.NUM_PROC_PER_NODE=1",
    "config.HOOKS.RUN_REPORT.ENABLED=false",
]


def shrink(cfg, head_input: int) -> None:
    """An ImageNet recipe at a tiny size, its components as written: crops of 32 (and 16)
    pixels, ViT patches of 8, the first head's input narrowed to the trunk's ``head_input``
    and its hidden layers to at most 256 wide (its output as the loss expects it)."""
    for transform in cfg.DATA.TRAIN.TRANSFORMS:
        if "size" in transform:
            transform["size"] = 32
        if "size_crops" in transform:
            transform["size_crops"] = [32, 16]
        if transform.get("name") == "RandomPatchMasking":
            transform["patch_size"] = 8
    vit = cfg.MODEL.TRUNK.VISION_TRANSFORMERS
    vit.update({"IMAGE_SIZE": 32, "PATCH_SIZE": 8})
    params = vit.MASKED_IMAGE_MODELING.PARAMS or {}
    if params.get("global_view_tokens"):
        params["global_view_tokens"] = 16
    head = cfg.MODEL.HEAD.PARAMS[0][1]
    if "dims" in head:
        head["dims"] = [head_input, *(min(d, 256) for d in head["dims"][1:-1]), head["dims"][-1]]
    else:
        head["in_dim"] = head_input
    for key in ("hidden_dim", "decoder_dim"):
        if key in head:
            head[key] = min(head[key], 256)
    if "patch_size" in head:
        head["patch_size"] = 8
    if "mae_loss" in cfg.LOSS:
        cfg.LOSS.mae_loss["patch_size"] = 8


def count_host_waits(tmp_path: Path, config: str, overrides: Sequence[str] = (),
                     head_input: Optional[int] = None):
    """The CountHostWaits hook after a tiny run of ``config`` (TINY, then ``overrides``);
    ``head_input``: an ImageNet recipe, ``shrink``-ed to a trunk of that output width."""
    hook = CountHostWaits()
    engine_name, cfg = load_config([f"config={config}", f"config.CHECKPOINT.DIR={tmp_path}",
                                    *TINY, *overrides])
    if head_input is not None:
        shrink(cfg, head_input)
    check_before_launch(engine_name, cfg)
    launch_distributed(cfg, engine_name, hook_generator=WithCounter(hook))
    return hook
