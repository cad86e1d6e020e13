"""Where the checkout's ``configs/`` and ``tools/`` folders are, however the engine is installed.

Both live beside the ``ssl_engine`` package in the repository, not inside it. From a checkout
or an editable install (``pip install -e .``) they are found there. A regular install
(``pip install .``) copies them as data files (setup.py's ``data_files``) to
``<prefix>/share/ssl_engine/``, where ``<prefix>`` is the environment's (a virtualenv's root,
or the user base for ``pip install --user``). This module imports nothing heavy: the
``ssl-engine`` command reads it before torch is imported.
"""
import site
import sys
import sysconfig
from pathlib import Path
from typing import List, Optional

REPOSITORY = Path(__file__).resolve().parents[2]  # the folder holding ssl_engine/


def installed_bases() -> List[Path]:
    """The prefixes a regular install may have put the data files under, most likely first."""
    bases = [Path(sys.prefix), Path(sysconfig.get_path("data")), Path(site.getuserbase())]
    return list(dict.fromkeys(bases))


def installed_folder(name: str) -> Path:
    """Where a regular install puts the repository's folder ``name`` (the first prefix's)."""
    return installed_bases()[0] / "share" / "ssl_engine" / name


def data_folder(name: str) -> Optional[Path]:
    """The repository's folder ``name`` (``configs`` or ``tools``): beside the package, else
    the copy a regular install made; None when neither is there."""
    beside = REPOSITORY / name
    if beside.is_dir():
        return beside
    for base in installed_bases():
        copy = base / "share" / "ssl_engine" / name
        if copy.is_dir():
            return copy
    return None
