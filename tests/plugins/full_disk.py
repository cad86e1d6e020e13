"""Simulated full disk, for the crash tests: the $SSL_ENGINE_TEST_FULL_DISK_SAVE-th
``torch.save`` into a file of the process (a checkpoint; torch also saves into memory buffers,
which are not counted) or the $SSL_ENGINE_TEST_FULL_DISK_ROWS-th batch of rows written by
feature extraction writes a few bytes, then raises OSError(ENOSPC)."""
import errno
import io
import os

import torch

from ssl_engine.extraction import rank_files

_counts = {"save": 0, "rows": 0}


def _fails(kind: str) -> bool:
    at = os.environ.get(f"SSL_ENGINE_TEST_FULL_DISK_{kind.upper()}")
    _counts[kind] += 1
    return at is not None and _counts[kind] == int(at)


def _full_disk():
    return OSError(errno.ENOSPC, "No space left on device")


_save = torch.save


def save(obj, f, *args, **kwargs):
    if isinstance(f, io.BufferedWriter) and _fails("save"):
        f.write(b"partial")
        raise _full_disk()
    return _save(obj, f, *args, **kwargs)


_append = rank_files.NpyAppender.append


def append(self, rows):
    if _fails("rows"):
        self.handle.write(b"partial")
        raise _full_disk()
    return _append(self, rows)


torch.save = save
rank_files.NpyAppender.append = append
