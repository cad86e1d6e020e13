"""Small file-system helpers."""
import os
from pathlib import Path


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
