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


class _CurrentStreamHandler(logging.StreamHandler):
    """Writes to ``sys.stdout`` or ``sys.stderr`` as it is when a record comes (one swapped in
    later, e.g. by a test's capture, is followed; a closed one is never kept)."""

    def __init__(self, name: str):
        self._stream_name = name
        super().__init__(getattr(sys, name))

    @property
    def stream(self):
        return getattr(sys, self._stream_name)

    @stream.setter
    def stream(self, value):
        pass


@contextlib.contextmanager
def launcher_logging():
    """What the launching process logs before an engine sets up its own logging
    (``setup_logging``, which replaces these handlers): INFO on stdout, warnings and errors on
    stderr. The root logger's handlers and level are as before afterwards, so that calling the
    launcher in a process leaves no trace."""
    root = logging.getLogger()
    level = root.level
    formatter = logging.Formatter(_FORMAT, datefmt="%H:%M:%S")
    info, problems = _CurrentStreamHandler("stdout"), _CurrentStreamHandler("stderr")
    info.setLevel(logging.INFO)
    info.addFilter(lambda record: record.levelno < logging.WARNING)
    problems.setLevel(logging.WARNING)
    handlers = (info, problems)
    for handler in handlers:
        handler.setFormatter(formatter)
        handler._ssl_engine = True
        root.addHandler(handler)
    root.setLevel(min(level, logging.INFO) if level else logging.INFO)
    try:
        yield
    finally:
        if any(handler in root.handlers for handler in handlers):  # no engine replaced them
            for handler in handlers:
                if handler in root.handlers:
                    root.removeHandler(handler)
            root.setLevel(level)
