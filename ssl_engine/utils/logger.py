"""Logging set-up: rank 0 logs INFO to stdout and ``log.txt``; other ranks log warnings only."""
import contextlib
import logging
import sys
from pathlib import Path
from typing import Optional

_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


def setup_logging(output_dir: Optional[str], rank: int = 0) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_ssl_engine", False):
            root.removeHandler(handler)
            handler.close()
    level = logging.INFO if rank == 0 else logging.WARNING
    root.setLevel(level)
    formatter = logging.Formatter(_FORMAT, datefmt="%H:%M:%S")
    handlers = [logging.StreamHandler(sys.stdout)]
    if output_dir and rank == 0:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(output_dir) / "log.txt", mode="a"))
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.setLevel(level)
        handler._ssl_engine = True
        root.addHandler(handler)


class _CurrentStderrHandler(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a record comes (one swapped in later, e.g. by a
    test's capture, is followed; a closed one is never kept)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


@contextlib.contextmanager
def launcher_logging():
    """INFO and above of the launching process on stderr until an engine sets up its own
    logging (``setup_logging``, which replaces this handler); the root logger's handlers and
    level are as before afterwards, so that calling the launcher in a process leaves no trace."""
    root = logging.getLogger()
    level = root.level
    handler = _CurrentStderrHandler()
    handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
    handler.setLevel(logging.INFO)
    handler._ssl_engine = True
    root.addHandler(handler)
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        yield
    finally:
        if handler in root.handlers:  # no engine replaced it
            root.removeHandler(handler)
            root.setLevel(level)
