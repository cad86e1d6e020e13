"""The data loader of one phase: sampler position, collator and worker settings; the error
that replaces torch's when a loader worker process dies."""
import functools
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from typing import Optional

import torch
from torch.utils.data import DataLoader

from ssl_engine.data.collators import build_collator
from ssl_engine.data.device_augmentation import DeviceParamsCollator
from ssl_engine.data.labels import MixedLabelShapes
from ssl_engine.data.sampler import StatefulDistributedSampler
from ssl_engine.utils.logger import setup_logging
from ssl_engine.utils.process_watch import end_with
from ssl_engine.utils.stop_request import ignore_interrupts


def build_dataloader(
    dataset,
    split_cfg,
    num_workers: int,
    pin_memory: bool,
    epoch: int,
    start_sample: int = 0,
    seed: int = 0,
    shuffle: bool = True,
    persistent: bool = False,
) -> DataLoader:
    """A loader over this rank's share of ``dataset`` for ``epoch``, starting after the first
    ``start_sample`` samples of the epoch's global order (data/sampler.py). ``split_cfg`` is
    cfg.DATA.TRAIN or cfg.DATA.TEST.

    The loader has its own generator (seeded with ``seed + epoch``), so creating its iterator does
    not draw from the caller's global random state.  With ``persistent`` (and workers), the
    workers live as long as the loader: move it to another epoch or start with
    ``set_loader_position`` and iterate again; the sampler hands every index to the workers
    with its epoch, so augmentations are those of non-persistent workers.
    """
    if num_workers > 0:
        quiet_dead_worker_transfers()
    dataset.set_epoch(epoch)
    persistent = persistent and num_workers > 0
    sampler = StatefulDistributedSampler(
        len(dataset),
        split_cfg.BATCHSIZE_PER_REPLICA,
        shuffle=shuffle,
        seed=seed,
        drop_last=split_cfg.DROP_LAST,
        with_epoch=persistent,
    )
    sampler.set_epoch(epoch)
    sampler.set_start_sample(start_sample)
    return DataLoader(
        dataset,
        batch_size=split_cfg.BATCHSIZE_PER_REPLICA,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.accelerator.is_available(),
        collate_fn=with_device_params(dataset, LabelNamingCollator(
            build_collator(split_cfg.COLLATE_FUNCTION, split_cfg.COLLATE_FUNCTION_PARAMS),
            list(split_cfg.get("LABEL_PATHS", None) or []))),
        drop_last=split_cfg.DROP_LAST,
        persistent_workers=persistent,
        worker_init_fn=functools.partial(init_worker, rank_pid=os.getpid()),
        generator=torch.Generator().manual_seed(seed + epoch),
    )


def init_worker(worker_id: int, rank_pid: Optional[int] = None) -> None:
    """Each loader worker at its start: the logging of its rank, a Ctrl-C stops the rank, not
    its workers, and the worker ends with the rank ``rank_pid`` (a rank killed by SIGKILL
    leaves no worker behind, holding memory and the run's output)."""
    worker_logging(worker_id)
    ignore_interrupts(worker_id)
    if rank_pid is not None:
        end_with(rank_pid)


def worker_logging(worker_id: int) -> None:
    """Give a loader worker the logging of its rank when it inherited none (a worker started
    by spawn, as in the processes the launcher spawns): its warnings, e.g. of a skipped
    unreadable image, go where the rank's go, not bare to stderr."""
    if not logging.getLogger().handlers:
        setup_logging(None, int(os.environ.get("RANK", 0)))


def with_device_params(dataset, collate):
    """``collate``, adding the rows' drawn parameters when ``dataset`` leaves augmentations to
    the device (DATA.<split>.DEVICE_AUGMENTATION)."""
    if getattr(dataset, "device_augmentation", None) is None:
        return collate
    return DeviceParamsCollator(collate, dataset.device_augmentation)


class LabelNamingCollator:
    """``collate`` whose error for labels of different shapes in one batch also names the label
    files of the split (picklable, for loader workers)."""

    def __init__(self, collate, label_files):
        self.collate, self.label_files = collate, [str(f) for f in label_files if f]

    def __call__(self, samples):
        try:
            return self.collate(samples)
        except MixedLabelShapes as err:
            files = ", ".join(self.label_files) or "none (the labels come from the data source)"
            raise MixedLabelShapes(f"{err}. Label file(s) of this split (LABEL_PATHS): "
                                   f"{files}") from None


def set_loader_position(loader: DataLoader, epoch: int, start_sample: int = 0) -> None:
    """Point a loader built by ``build_dataloader`` at sample ``start_sample`` of ``epoch``'s
    global order."""
    loader.dataset.set_epoch(epoch)
    loader.sampler.set_epoch(epoch)
    loader.sampler.set_start_sample(start_sample)


def quiet_dead_worker_transfers() -> None:
    """Keep the resource-sharer thread's traceback about a dead worker off stderr (installed
    once per process); every other thread error is printed as before."""
    previous = threading.excepthook
    if not getattr(previous, "quiet_dead_worker_transfers", False):
        def hook(args):
            if not _is_broken_transfer(args.exc_value):  # the loader reports the death itself
                previous(args)

        hook.quiet_dead_worker_transfers = True
        threading.excepthook = hook
    # the resource sharer's server thread catches its errors and hands them to sys.excepthook
    # itself (which torch.distributed replaces when the process group starts: wrapped here,
    # after it)
    previous_sys = sys.excepthook
    if not getattr(previous_sys, "quiet_dead_worker_transfers", False):
        def sys_hook(exc_type, exc_value, exc_traceback):
            if not _is_broken_transfer(exc_value):
                previous_sys(exc_type, exc_value, exc_traceback)

        sys_hook.quiet_dead_worker_transfers = True
        sys.excepthook = sys_hook


class DataWorkerDiedError(RuntimeError):
    """A data-loader worker process died (a crashing decoder, an out-of-memory kill)."""


# torch's messages: "DataLoader worker (pid 123) is killed by signal: Killed.",
# "DataLoader worker (pid(s) 123, 456) exited unexpectedly", "... exited unexpectedly with exit
# code 1"
_WORKER_DIED = re.compile(r"DataLoader worker \(pid")


def _killed_workers(iterator) -> str:
    """The worker processes of a loader iterator that a signal ended, in torch's words ("" if
    none, or if the loader has no worker processes)."""
    killed = []
    for worker in getattr(iterator, "_workers", None) or []:
        code = worker.exitcode  # negative: the number of the signal that ended it
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            killed.append(f"DataLoader worker (pid {worker.pid}) was killed by signal {name}")
    return "; ".join(killed)


def _is_broken_transfer(err: BaseException) -> bool:
    """Reading a batch failed because the worker handing its shared memory over went away (a
    connection error raised through multiprocessing's resource sharer)."""
    if not isinstance(err, (ConnectionError, EOFError)):
        return False
    frames = traceback.extract_tb(err.__traceback__)
    return any(frame.filename.endswith("resource_sharer.py") for frame in frames)


def _killed_workers_soon(iterator, seconds: float = 2.0) -> str:
    """``_killed_workers`` once the dying worker's exit is known (it can lag the broken
    connection that revealed it by a moment); "" if none within ``seconds``."""
    deadline = time.monotonic() + seconds
    try:
        while True:
            reason = _killed_workers(iterator)
            if reason or time.monotonic() > deadline:
                return reason
            time.sleep(0.05)
    except RuntimeError as err:  # torch's SIGCHLD handler, reporting the same death
        if _WORKER_DIED.search(str(err)):
            return str(err).strip().rstrip(".")
        raise


def worker_death_error(err: BaseException, cfg, split: str, iterator=None,
                       then: str = "") -> Optional[DataWorkerDiedError]:
    """The error to report instead of ``err`` when a worker of the ``split`` loader ("TRAIN" /
    "TEST") died: ``err`` is torch's report of it, or any error while a worker of ``iterator``
    (the loader's iterator) lies killed by a signal (reading from a dead worker fails in
    several ways). It names the data and ends with ``then`` (what to do next). None for any
    other error."""
    if not isinstance(err, Exception):  # Ctrl-C and exits are what they say
        return None
    if isinstance(err, RuntimeError) and _WORKER_DIED.search(str(err)):
        reason = str(err).strip().rstrip(".")
    else:
        reason = _killed_workers(iterator)
        if not reason and _is_broken_transfer(err):
            reason = _killed_workers_soon(iterator) or (
                f"a worker's connection broke while it handed a batch over "
                f"({type(err).__name__}: {err})")
        if not reason:
            return None
    data = cfg.DATA[split]
    paths = [str(p) for p in data.DATA_PATHS if str(p)]
    where = f"data sources {list(data.DATA_SOURCES)}" + (f", paths {paths}" if paths else "")
    return DataWorkerDiedError(
        f"a data-loader worker died while reading config.DATA.{split} ({where}): {reason}. "
        "A decoder crashing on a file, or the machine running out of memory "
        f"(config.DATA.NUM_DATALOADER_WORKERS={cfg.DATA.NUM_DATALOADER_WORKERS}), are the usual "
        "causes; to find a failing file, run with config.DATA.NUM_DATALOADER_WORKERS=0 (the "
        "samples are then read in the main process, where an error names its file)" + then
    )


def stopped_on_worker_death(err: BaseException, cfg, split: str, iterator,
                            then: str = "") -> Optional[DataWorkerDiedError]:
    """``worker_death_error``, with the workers of ``iterator`` stopped when it is one (so that
    torch does not report the death again): what the trainer and the extraction raise in
    place of ``err``. None, with the workers left as they are, for any other error."""
    died = worker_death_error(err, cfg, split, iterator, then=then)
    if died is not None:
        stop_workers(iterator)
    return died


def stop_workers(iterator) -> None:
    """Shut the worker processes of a loader iterator down now, with torch's own clean-up:
    afterwards a worker that died is not reported again (torch's SIGCHLD handler would
    otherwise raise about it at any later point, even while the process exits)."""
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:  # a clean-up after a failure: the failure is what gets reported
            pass
