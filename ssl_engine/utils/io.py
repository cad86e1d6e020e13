"""Small file-system helpers."""
import errno
import json
import os
from pathlib import Path
from typing import Iterable, List, Optional


def fsync_dir(folder: Path) -> None:
    """Make the entries of ``folder`` (a rename into it) durable; a file system that cannot
    sync a folder is left as it is."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _file_in_the_way(path) -> Optional[Path]:
    """The first part of ``path`` that is a file where a folder is needed, or None."""
    for part in reversed(Path(path).parents):
        if part.exists() and not part.is_dir():
            return part
    return None


def errno_text(err: OSError) -> str:
    """What an OSError says, with its errno's name: "No space left on device (ENOSPC)"."""
    code = errno.errorcode.get(err.errno, "") if err.errno is not None else ""
    return f"{err.strerror or err} ({code})" if code else str(err.strerror or err)


def os_error_text(err: OSError) -> str:
    """An OSError in words, without Python's "[Errno 20]": what failed, on which path, and for
    a path through a file, which file is in the way."""
    text = errno_text(err)
    if err.filename is None:
        return text
    blocking = _file_in_the_way(err.filename) if err.errno == errno.ENOTDIR else None
    if blocking is not None:
        return f"{text}: {blocking} is a file, not a folder"
    return f"{err.filename}: {text}"


def writable_folder_error(folder: Path):
    """Create ``folder`` and write a probe file there; return the OSError if that fails."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write_test_{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        return err
    return None


def json_objects(lines: Iterable[str]) -> List[dict]:
    """The JSON objects of ``lines`` (e.g. metrics.json's), one a line; a line that is not a
    JSON object (a half-written last line, a stray value) is skipped."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
