"""The errors of an extraction, each one message for the user: raised by the extraction
(``write_splits.py``, ``rank_files.py``) and reported without a traceback by the launcher and the
evaluation tools (``ssl_engine.engines``)."""
import errno
from pathlib import Path
from typing import Sequence

from ssl_engine.utils.io import errno_text


class ExtractionError(RuntimeError):
    """Extraction cannot run or its output is inconsistent."""


class NonFiniteFeatures(ExtractionError):
    """A batch of features holds NaN or infinite values."""


# file-system errors of writing the output (the reads of the data raise other ones)
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}


def _completed(folder: Path, done: Sequence[str]) -> str:
    """What this run completed before it stopped, for the messages."""
    return (f"the {', '.join(s.lower() for s in done)} features are complete in {folder}"
            if done else "no split of this run was complete")


def write_failure(err: OSError, folder: Path, split: str, done: Sequence[str]) -> ExtractionError:
    """The one message of an extraction stopped by a failing write of ``split``'s files."""
    return ExtractionError(
        f"could not write the {split.lower()} features to {folder}: {errno_text(err)}. Its "
        "temporary files were removed and files of earlier runs left as they were; "
        f"{_completed(folder, done)}. Free space and run the extraction again"
    )


def non_finite_failure(err: NonFiniteFeatures, folder: Path, split: str,
                       done: Sequence[str]) -> ExtractionError:
    """The one message of an extraction stopped by a non-finite feature of ``split``."""
    return ExtractionError(
        f"{err}: the model gives non-finite values with these weights "
        "(config.MODEL.WEIGHTS_INIT.PARAMS_FILE) or inputs. Its temporary files were removed "
        f"and files of earlier runs left as they were; {_completed(folder, done)}"
    )
