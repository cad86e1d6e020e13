"""The test session's temporary files stay in its own temporary tree."""
import tempfile

import pytest


@pytest.fixture(autouse=True, scope="session")
def session_temporary_folder(tmp_path_factory):
    """TMPDIR (and Python's cached temporary folder) of this session and of every process it
    starts: a folder under pytest's temporary tree. Temporary folders that a process makes and
    would remove at its exit stay behind when it ends without Python's clean-up (a rank that
    leaves with os._exit, a killed process): W&B makes two at import (``wandb-media``,
    ``wandb-artifacts``), and timm imports W&B, so every process with a ViT makes them."""
    folder = tmp_path_factory.mktemp("tmpdir")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(folder))
        patch.setattr(tempfile, "tempdir", str(folder))
        yield folder
