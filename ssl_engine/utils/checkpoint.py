"""Checkpoint files: atomic writes, the ``checkpoint.torch`` pointer, safe loading.

A save writes to a temporary name in the same folder, fsyncs it, and renames it over the final
name, so a crash mid-write never leaves a broken file under a checkpoint's name.  The pointer
``checkpoint.torch`` is a symbolic link to the newest complete file, replaced atomically too.
"""
import logging
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from ssl_engine.utils.io import fsync_dir

logger = logging.getLogger(__name__)

LATEST_NAME = "checkpoint.torch"
_NAME_ORDER = re.compile(r"model_(final_checkpoint_)?(phase|iteration)(\d+)\.torch$")


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, unreadable or not a checkpoint of this engine."""


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
    os.symlink(filename, tmp)
    os.replace(tmp, folder / LATEST_NAME)
    fsync_dir(folder)


def save_checkpoint(folder: Path, filename: str, state: Dict[str, Any]) -> Path:
    path = Path(folder) / filename
    atomic_torch_save(state, path)
    point_latest_to(folder, filename)
    logger.info("saved checkpoint %s", path)
    return path


def load_checkpoint(path: Path) -> Dict[str, Any]:
    """Load a checkpoint on the CPU, refusing unreadable files with a clear error."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        # our checkpoints hold RNG states (numpy arrays, tuples): not weights-only data
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # torch raises several kinds for truncated or foreign files
        raise CheckpointError(
            f"checkpoint {path} is corrupt or unreadable ({type(err).__name__}: {err})"
        ) from err
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} does not hold a dict (got {type(state).__name__})")
    return state


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


def latest_checkpoint_path(folder: Path) -> Optional[Path]:
    """The file ``checkpoint.torch`` points to, or the newest checkpoint file, or None."""
    folder = Path(folder)
    pointer = folder / LATEST_NAME
    if pointer.is_symlink() or pointer.exists():
        target = pointer.resolve()
        if target.is_file():
            return target
        logger.warning("%s points to a missing file %s; looking for the newest checkpoint",
                       pointer, target)
    files = list_checkpoints(folder)
    return files[-1] if files else None


def load_latest_checkpoint(folder: Path) -> Optional[Dict[str, Any]]:
    """The newest checkpoint of ``folder``, or None. A corrupt one is refused, naming the
    previous file that a user can resume from instead."""
    path = latest_checkpoint_path(folder)
    if path is None:
        return None
    try:
        return load_checkpoint(path)
    except CheckpointError as err:
        older = [p for p in list_checkpoints(folder) if p.resolve() != path.resolve()]
        hint = (f"; the previous checkpoint {older[-1]} is intact: move {path.name} away "
                f"(and {LATEST_NAME}) to resume from it") if older else ""
        raise CheckpointError(f"{err}{hint}") from err
