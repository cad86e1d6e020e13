"""Checkpoint files: their names, atomic writes, the ``checkpoint.torch`` pointer, safe loading.

A save writes to a temporary name in the same folder, fsyncs it, and renames it over the final
name, so a crash mid-write never leaves a broken file under a checkpoint's name.  The pointer
``checkpoint.torch`` is a symbolic link to the newest complete file, replaced atomically too.
A save that fails (a full disk) removes its temporary file, leaves the previous checkpoint and
the pointer as they were, and raises CheckpointWriteError naming the last checkpoint saved.
torch's zip writer reports a full disk as a RuntimeError ("unexpected pos ..."), not as
ENOSPC: a failed write is recognised as a full disk by the free space left after it.

Every file is loaded weights-only (``torch.load(weights_only=True)``): tensors, numbers,
strings and containers of them. Unpickling anything else can run code the file carries, so a
file that needs more is refused (UnsafeCheckpointError) and nothing of it is executed. The
one exception is numpy uint32 arrays (data, not code), the form of numpy's RNG state in
checkpoints of earlier versions of the engine. The engine's own checkpoints are plain data: a save refuses
state that a weights-only load could not read back.
"""
import collections
import errno
import logging
import os
import re
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

from ssl_engine.utils.io import errno_text, fsync_dir

logger = logging.getLogger(__name__)

LATEST_NAME = "checkpoint.torch"
_NAME_ORDER = re.compile(r"model_(final_checkpoint_)?(phase|iteration)(\d+)\.torch$")


def iteration_checkpoint_name(iteration: int) -> str:
    """The file of a save within a phase (VISSL's name): ``model_iteration<N>.torch``."""
    return f"model_iteration{iteration}.torch"


def phase_checkpoint_name(train_phase_idx: int, final: bool = False) -> str:
    """The file of a save at the end of a training phase (VISSL's names):
    ``model_phase<N>.torch``, ``model_final_checkpoint_phase<N>.torch`` for the last one."""
    return f"model_{'final_checkpoint_' if final else ''}phase{train_phase_idx}.torch"


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable or not a checkpoint of this engine."""


class UnsafeCheckpointError(CheckpointError):
    """A file that holds Python objects other than weights: loading it could run code."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (full disk, failing file system)."""


def folder_gone_error(folder: Path, writing: str) -> CheckpointWriteError:
    """The error of a write into CHECKPOINT.DIR after the folder itself vanished (deleted or
    unmounted while the run went on): ``writing`` is what could not be written."""
    return CheckpointWriteError(
        f"config.CHECKPOINT.DIR={folder} no longer exists: it was removed (or unmounted) while "
        f"the run went on, so {writing} could not be written there. The checkpoints it held "
        "went with it; restore the folder from a backup to continue with "
        "config.CHECKPOINT.AUTO_RESUME=true, or start the run again")


def _numpy_array_globals() -> list:
    """What unpickling a numpy uint32 array needs (its reconstruct function under numpy 2's and
    numpy 1's module names): the RNG states of checkpoints written before the engine saved them
    as tensors."""
    reconstruct = (getattr(np, "_core", None) or np.core).multiarray._reconstruct
    needed = [np.ndarray, np.dtype, (reconstruct, "numpy._core.multiarray._reconstruct"),
              (reconstruct, "numpy.core.multiarray._reconstruct")]
    uint32_dtype = getattr(getattr(np, "dtypes", None), "UInt32DType", None)  # numpy >= 1.25
    return needed + ([uint32_dtype] if uint32_dtype is not None else [])


_NUMPY_ARRAY_GLOBALS = _numpy_array_globals()
# torch's weights-only refusals of an object (other failures mean a corrupt file), and the
# names they give
# the errors of torch's zip writer (a failed write: "[enforce fail at inline_container.cc:672]
# . unexpected pos 704 vs 598", "PytorchStreamWriter failed writing file ...")
_TORCH_WRITER_ERROR = re.compile(r"inline_container|PytorchStreamWriter")
_NEEDS_OBJECTS = re.compile(r"GLOBAL |Can only (?:build|create)|call reduce|Unsupported class")
_OBJECT_NAME = re.compile(r"GLOBAL ([\w.]+)|got <class '([\w.]+)'>")
_PLAIN_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.Tensor,
                 torch.nn.Parameter, torch.dtype, torch.device, torch.Size)
_PLAIN_MAPPINGS = (dict, collections.OrderedDict)
_PLAIN_SEQUENCES = (list, tuple, set)


def check_plain_state(state: Any, where: str = "checkpoint") -> None:
    """Raise TypeError naming the first entry of ``state`` that a weights-only load would
    refuse (anything but tensors, numbers, strings and dicts/lists/tuples/sets of them)."""
    kind = type(state)
    if kind in _PLAIN_MAPPINGS:
        for key, value in state.items():
            check_plain_state(key, f"{where} (key {key!r})")
            check_plain_state(value, f"{where}/{key}")
    elif kind in _PLAIN_SEQUENCES:
        for index, value in enumerate(state):
            check_plain_state(value, f"{where}[{index}]")
    elif kind not in _PLAIN_LEAVES:
        raise TypeError(
            f"{where} is a {kind.__module__}.{kind.__qualname__}: checkpoints hold tensors, "
            "numbers, strings and dicts/lists of them only (a weights-only load refuses "
            "anything else); convert it in the get_classy_state / state_dict that returns it"
        )


def atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` that either leaves the complete file at ``path`` or nothing new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(path.parent)


def point_latest_to(folder: Path, filename: str) -> None:
    """Make ``folder/checkpoint.torch`` refer to ``filename`` (atomically)."""
    folder = Path(folder)
    tmp = folder / f".{LATEST_NAME}.{os.getpid()}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    try:
        os.symlink(filename, tmp)
        os.replace(tmp, folder / LATEST_NAME)
    except BaseException:
        if tmp.is_symlink():
            tmp.unlink()
        raise
    fsync_dir(folder)


def last_saved(folder: Path) -> str:
    """Which checkpoint a resumed run continues from, in words."""
    latest = latest_checkpoint_path(folder)
    if latest is None:
        return "no checkpoint had been saved yet, so a new run starts from the beginning"
    return (f"the last checkpoint saved is {latest} ({LATEST_NAME} points to it); run again "
            "with config.CHECKPOINT.AUTO_RESUME=true to continue from it")


def state_nbytes(state: Any) -> int:
    """The bytes of the tensors in ``state``, each storage once: about the size of its file."""
    seen, total, stack = set(), 0, [state]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set)):
            stack.extend(item)
    return total


def write_failure(err: Exception, folder: Path, needed_bytes: int) -> Optional[str]:
    """What went wrong in words when ``err`` is a failed write into ``folder`` (a full disk
    however it was reported, another OSError, torch's writer failing), else None."""
    is_os_error = isinstance(err, OSError)
    if not is_os_error and not _TORCH_WRITER_ERROR.search(str(err)):
        return None
    free = shutil.disk_usage(folder).free
    if (is_os_error and err.errno == errno.ENOSPC) or free < needed_bytes:
        return (f"no space left on {folder}: {free / 2**20:.1f} MB free, the checkpoint needs "
                f"about {needed_bytes / 2**20:.1f} MB")
    if is_os_error:
        return errno_text(err)
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"the file could not be written ({lines[0]})"


def save_checkpoint(folder: Path, filename: str, state: Dict[str, Any]) -> Path:
    """Write ``state`` as ``folder/filename`` and point ``checkpoint.torch`` to it.

    Raises TypeError for state a weights-only load could not read back, and
    CheckpointWriteError when the file system fails (nothing already saved is touched)."""
    check_plain_state(state)
    path = Path(folder) / filename
    if not Path(folder).is_dir():  # not recreated: the run's other files went with it
        raise folder_gone_error(Path(folder), f"checkpoint {filename}")
    try:
        atomic_torch_save(state, path)
        point_latest_to(folder, filename)
    except (OSError, RuntimeError) as err:
        reason = write_failure(err, Path(folder), state_nbytes(state))
        if reason is None:
            raise
        raise CheckpointWriteError(
            f"could not save checkpoint {path}: {reason}. Nothing already saved was touched: "
            f"{last_saved(folder)}"
        ) from err
    logger.info("saved checkpoint %s", path)
    return path


def _reason(err: Exception) -> str:
    """The useful line of a torch.load error (its weights-only errors are long)."""
    text = str(err)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


def _refusal(path: Path, err: Exception) -> Optional[str]:
    """The message for a file refused because it needs more than weights, else None."""
    text = str(err)
    if "weights only load failed" not in text.lower() or not _NEEDS_OBJECTS.search(text):
        return None
    names = sorted({a or b for a, b in _OBJECT_NAME.findall(text)})
    holds = f" ({', '.join(names)})" if names else ""
    return (f"{path} was not loaded: it holds Python objects other than weights{holds}, and "
            "loading those could run code the file carries. Only tensors, numbers, strings and "
            "containers of them are loaded; if you trust the file's origin, convert it once "
            "with extra_scripts/convert_to_weights_only.py (see docs/safety.md)")


def load_checkpoint(path: Path, mmap: bool = False) -> Dict[str, Any]:
    """Load a checkpoint (or any weights file) on the CPU, weights-only.

    ``mmap=True`` maps the tensors of a zip-format file instead of reading them (a cheap look
    at the file's structure). Raises UnsafeCheckpointError for a file that needs more than
    weights to load, CheckpointError for a missing, corrupt or unreadable one."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":  # tensors only by design: nothing to refuse
        return _load_safetensors(path)
    try:
        with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True,
                               mmap=mmap and zipfile.is_zipfile(path))
    except Exception as err:  # torch raises several kinds for truncated or foreign files
        refusal = _refusal(path, err)
        if refusal:
            raise UnsafeCheckpointError(refusal) from None
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({_reason(err)})") from err
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} does not hold a dict (got {type(state).__name__})")
    return state


def _load_safetensors(path: Path) -> Dict[str, Any]:
    """A ``.safetensors`` file (``tools/export_model.py``'s format) as a state dict."""
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as err:  # safetensors raises its own error for a damaged header
        raise CheckpointError(f"checkpoint {path} is corrupt or unreadable ({_reason(err)})") from err


def _sort_key(path: Path):
    match = _NAME_ORDER.search(path.name)
    return (path.stat().st_mtime_ns, path.name) if match else (0, path.name)


def list_checkpoints(folder: Path):
    """Checkpoint files of ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    files = [p for p in folder.iterdir() if _NAME_ORDER.search(p.name) and p.is_file()]
    return sorted(files, key=_sort_key)


def check_latest_pointer(folder: Path) -> None:
    """Refuse a folder where ``checkpoint.torch`` cannot be written: one of that name (the
    first save would fail on it, after the training that led to it)."""
    pointer = Path(folder) / LATEST_NAME
    if pointer.is_dir() and not pointer.is_symlink():
        raise CheckpointError(
            f"{pointer} is a folder: the engine keeps a link to the latest checkpoint under that "
            "name and could not save any checkpoint; move the folder away or pick another "
            "config.CHECKPOINT.DIR")


TEMPORARY_SAVES = ".*.torch.*.tmp"  # atomic_torch_save's and point_latest_to's temporary names


def remove_unfinished_saves(folder: Path) -> list:
    """Remove the temporary files of saves that never finished (a process killed while it
    wrote); call only while holding the folder's run lock. Returns the names removed."""
    removed = []
    for path in sorted(Path(folder).glob(TEMPORARY_SAVES)):
        if path.is_file() or path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path.name)
    if removed:
        logger.warning("removed the temporary files of saves that did not finish in %s: %s",
                       folder, ", ".join(removed))
    return removed


def latest_checkpoint_path(folder: Path) -> Optional[Path]:
    """The file ``checkpoint.torch`` points to, or the newest checkpoint file, or None."""
    folder = Path(folder)
    pointer = folder / LATEST_NAME
    if pointer.is_symlink() or pointer.exists():
        target = pointer.resolve()
        if target.is_file():
            return target
        if pointer.is_symlink():
            problem = f"points to {'a folder' if target.is_dir() else 'a missing file'} {target}"
        else:
            problem = "is not a file"
        logger.warning("%s %s; looking for the newest checkpoint", pointer, problem)
    files = list_checkpoints(folder)
    return files[-1] if files else None


def load_latest_checkpoint(folder: Path, mmap: bool = False) -> Optional[Dict[str, Any]]:
    """The newest checkpoint of ``folder``, or None. A corrupt one is refused, naming the
    previous file that a user can resume from instead."""
    path = latest_checkpoint_path(folder)
    if path is None:
        return None
    try:
        return load_checkpoint(path, mmap=mmap)
    except CheckpointError as err:
        older = [p for p in list_checkpoints(folder) if p.resolve() != path.resolve()]
        hint = (f"; the previous checkpoint {older[-1]} is intact: move {path.name} away "
                f"(and {LATEST_NAME}) to resume from it") if older else ""
        raise type(err)(f"{err}{hint}") from err
