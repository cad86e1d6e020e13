"""Small file-system helpers."""
import os
from pathlib import Path


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
