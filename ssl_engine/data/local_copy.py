"""COPY_TO_LOCAL_DISK: a split's data files and folders copied once to a local folder.

The process of local rank 0 on each machine copies; the others wait for it at a barrier and
then read the copy too. A copy is written under a temporary name and renamed into place, so a
copy that exists is complete: a later run (or a machine sharing the folder) reuses it. Each
copy's name is the source's base name plus a short hash of its absolute path, so two datasets
with the same folder name never share a copy. For disk_filelist only the .npy files are copied
(the images they list are read where they are).
"""
import hashlib
import logging
import os
import shutil
import tempfile

from ssl_engine.utils import distributed
from ssl_engine.utils.io import fsync_dir

logger = logging.getLogger(__name__)


def destination_dir(split_cfg) -> str:
    """COPY_DESTINATION_DIR, or a folder in the system's temporary directory when empty."""
    folder = split_cfg.COPY_DESTINATION_DIR
    return os.path.expanduser(folder) if folder else os.path.join(
        tempfile.gettempdir(), "ssl_engine_local_data")


def local_path(source: str, dest_dir: str) -> str:
    """Where the copy of ``source`` lives under ``dest_dir``."""
    absolute = os.path.abspath(source)
    digest = hashlib.sha1(absolute.encode()).hexdigest()[:8]
    stem, ext = os.path.splitext(os.path.basename(absolute.rstrip(os.sep)))
    return os.path.join(dest_dir, f"{stem}-{digest}{ext}")


def copy_once(source: str, dest_dir: str) -> str:
    """Copy the file or folder ``source`` into ``dest_dir`` unless its copy exists; return the
    copy's path."""
    target = local_path(source, dest_dir)
    if os.path.exists(target):
        return target
    os.makedirs(dest_dir, exist_ok=True)
    partial = f"{target}.partial-{os.getpid()}"
    try:
        if os.path.isdir(source):
            shutil.copytree(source, partial)
        else:
            shutil.copy2(source, partial)
            with open(partial, "rb") as f:
                os.fsync(f.fileno())
        try:
            os.rename(partial, target)
        except OSError:
            if not os.path.exists(target):  # not another machine's finished copy
                raise
        fsync_dir(dest_dir)
    finally:
        if os.path.isdir(partial):
            shutil.rmtree(partial, ignore_errors=True)
        elif os.path.exists(partial):
            os.remove(partial)
    logger.info("copied %s to %s", source, target)
    return target


def local_split_paths(split_cfg, local_rank: int):
    """(data paths, label paths) of a split, replaced by their local copies when
    COPY_TO_LOCAL_DISK is set (the paths as they are otherwise). Every process of the run must
    call it (it waits at a barrier)."""
    data_paths = [str(p) for p in split_cfg.DATA_PATHS]
    label_paths = [str(p) for p in split_cfg.LABEL_PATHS]
    if not split_cfg.COPY_TO_LOCAL_DISK:
        return data_paths, label_paths
    dest = destination_dir(split_cfg)
    if local_rank == 0:
        for path in data_paths + label_paths:
            if path:
                copy_once(path, dest)
    distributed.barrier()

    def local(path):
        return local_path(path, dest) if path else path

    return [local(p) for p in data_paths], [local(p) for p in label_paths]
