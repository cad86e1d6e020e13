"""Counting the operations that make the host wait for the device.

On a GPU the host queues kernels and runs ahead; an operation whose result the host needs
(a value read back, or an output whose shape depends on the data) stops it until the device
has caught up. A training step should have none except where the log line reads its values
(docs/performance.md). The GPU is not always at hand, so the count is taken on any device
with a ``TorchDispatchMode`` that sees every aten operation: on a CPU these operations cost
nothing, yet they are the same calls that wait on a GPU. Where CUDA is present,
``torch.cuda.set_sync_debug_mode("warn")`` also reports what the device itself saw (the
host-wait test, tests/host_wait_utils.py, counts both).

``HostWaitCounter`` counts while it is entered and ``active``; ``paused()`` leaves out code
that is not the step's own (the data loader's transforms read random draws back on the host,
which is no wait). Python-level read-backs of a host tensor (``tolist``, ``numpy``,
``cpu``) do not reach the dispatcher; ``watch_python_readbacks`` counts them by wrapping the
Tensor methods for a while (a test's tool: on a CPU every tensor is a host tensor, so it
counts the harmless ones too).
"""
import collections
import contextlib
from typing import Callable, Counter, Iterator, List

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

# aten operations that read a value back or whose output shape depends on the data
WAITING_OPS = {
    aten._local_scalar_dense.default: "item",  # .item(), int(t), float(t), bool(t)
    aten.is_nonzero.default: "is_nonzero",
    aten.equal.default: "equal",
    aten.allclose.default: "allclose",
    aten.nonzero.default: "nonzero",
    aten.nonzero_static.default: None,  # a fixed output size: no wait
    aten.masked_select.default: "masked_select",
    aten._unique2.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique",
    aten.bincount.default: "bincount",
    aten.histc.default: None,
}
for _name in ("_unique", "unique_dim_consecutive"):
    if hasattr(aten, _name):
        WAITING_OPS[getattr(aten, _name).default] = "unique"


def _waits(func, args, kwargs) -> str:
    """The kind of wait ``func(*args, **kwargs)`` makes the host do, or ""."""
    kind = WAITING_OPS.get(func)
    if kind:
        return kind
    if func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                aten._index_put_impl_.default):
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in indices or ()):
            return "boolean mask"  # the number of selected elements sizes the output
    if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return "repeat_interleave"
    if func in (aten._to_copy.default, aten.copy_.default):
        source = args[0] if func is aten._to_copy.default else args[1]
        target = (kwargs.get("device") if func is aten._to_copy.default else args[0].device)
        if isinstance(source, torch.Tensor) and source.device.type != "cpu" and \
                target is not None and torch.device(target).type == "cpu":
            return "copy to host"
    return ""


class HostWaitCounter(TorchDispatchMode):
    """Counts the waiting operations (WAITING_OPS, boolean-mask indexing, copies to the
    host) run while entered and ``active``; ``counts`` by kind, ``where`` one short stack
    per wait (the innermost engine frames), to say which line did it."""

    def __init__(self, record_stacks: bool = True,
                 host_resident: Callable[[torch.Tensor], bool] = None):
        super().__init__()
        self.active = True
        # tensors that stay on the host on a GPU too (the loader's batch before it moves to the
        # device, torch's optimizers' step counts): reading them waits for nothing
        self.host_resident = host_resident or (lambda tensor: False)
        self.record_stacks = record_stacks
        self.counts: Counter[str] = collections.Counter()
        self.where: List[str] = []

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        self.counts.clear()
        self.where = []

    def record(self, kind: str) -> None:
        """Count one wait of ``kind`` (also called by the Python-level watchers)."""
        if not self.active:
            return
        self.counts[kind] += 1
        if self.record_stacks:
            self.where.append(f"{kind} at {_caller()}")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Nothing is counted inside (the data loader's own work)."""
        was, self.active = self.active, False
        try:
            yield
        finally:
            self.active = was

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.active:
            kind = _waits(func, args, kwargs)
            if kind and not (args and isinstance(args[0], torch.Tensor)
                             and self.host_resident(args[0])):
                self.record(kind)
        return func(*args, **kwargs)


def _caller() -> str:
    """The innermost frames of ssl_engine or of a test (file:line), outermost first."""
    import traceback

    frames = [f for f in traceback.extract_stack()[:-3]
              if "ssl_engine" in f.filename or "/tests/" in f.filename or
              "benchmarks" in f.filename]
    frames = [f for f in frames if not f.filename.endswith("host_waits.py")]
    return " <- ".join(f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}" for f in frames[-3:][::-1])


@contextlib.contextmanager
def watch_python_readbacks(counter: HostWaitCounter,
                           methods=("tolist", "numpy", "cpu")) -> Iterator[None]:
    """Counts calls of the Tensor ``methods`` (read-backs that bypass the dispatcher on a host
    tensor) into ``counter`` while inside; the methods are restored on the way out."""
    originals = {name: getattr(torch.Tensor, name) for name in methods}

    def wrapped(name: str, original: Callable):
        def method(self, *args, **kwargs):
            if not counter.host_resident(self):
                counter.record(name)
            with counter.paused():
                return original(self, *args, **kwargs)
        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, wrapped(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
