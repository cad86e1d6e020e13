"""Logging set-up: rank 0 logs INFO to stdout and ``log.txt``; other ranks log warnings only."""
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
