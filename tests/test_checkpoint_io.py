"""Atomic checkpoint writes, the latest pointer, refusal of corrupt files, weights-only
loading (files that would run code are refused) and plain-data checkpoints."""
import errno
import os
import random
import re
import shutil

import numpy as np
import pytest
import torch

from engine_utils import small_tmpfs
from ssl_engine.checkpoint import (
    LATEST_NAME, CheckpointError, CheckpointWriteError, UnsafeCheckpointError, atomic_torch_save,
    latest_checkpoint_path, load_checkpoint, load_latest_checkpoint, save_checkpoint,
)
from ssl_engine.utils import rng


def test_save_points_latest_to_newest(tmp_path):
    save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})
    save_checkpoint(tmp_path, "model_phase1.torch", {"a": 2})
    assert os.readlink(tmp_path / LATEST_NAME) == "model_phase1.torch"
    assert load_latest_checkpoint(tmp_path) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        LATEST_NAME, "model_phase0.torch", "model_phase1.torch"]  # no temporary files left


def test_full_disk_mid_write_keeps_previous_and_says_what_was_saved(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})

    def exploding_save(obj, handle):
        handle.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", exploding_save)
    with pytest.raises(CheckpointWriteError) as err:
        save_checkpoint(tmp_path, "model_phase1.torch", {"a": 2, "w": torch.zeros(2**18)})
    monkeypatch.undo()
    assert re.fullmatch(
        re.escape(f"could not save checkpoint {tmp_path / 'model_phase1.torch'}: no space left "
                  f"on {tmp_path}: ") + r"\d+\.\d MB free, the checkpoint needs about 1\.0 MB"
        + re.escape(". Nothing already saved was touched: the last checkpoint saved is "
                    f"{tmp_path / 'model_phase0.torch'} (checkpoint.torch points to it); run "
                    "again with config.CHECKPOINT.AUTO_RESUME=true to continue from it"),
        str(err.value))
    assert not (tmp_path / "model_phase1.torch").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert load_latest_checkpoint(tmp_path) == {"a": 1}


def _full_disk_as_torch_reports_it(obj, handle):
    handle.write(b"partial")
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")


def test_full_disk_reported_by_torchs_zip_writer_is_recognised(tmp_path, monkeypatch):
    """torch's writer says "unexpected pos", not ENOSPC: the free space left tells."""
    save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})
    monkeypatch.setattr(torch, "save", _full_disk_as_torch_reports_it)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(
        10 * 2**20, 10 * 2**20 - 300 * 2**10, 300 * 2**10))
    with pytest.raises(CheckpointWriteError) as err:
        save_checkpoint(tmp_path, "model_phase1.torch", {"w": torch.zeros(2**19)})
    monkeypatch.undo()
    assert str(err.value).startswith(
        f"could not save checkpoint {tmp_path / 'model_phase1.torch'}: no space left on "
        f"{tmp_path}: 0.3 MB free, the checkpoint needs about 2.0 MB. Nothing already saved was "
        f"touched: the last checkpoint saved is {tmp_path / 'model_phase0.torch'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST_NAME, "model_phase0.torch"]


def test_other_errors_of_torchs_writer_are_named_and_others_raised_as_they_are(
        tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "save", _full_disk_as_torch_reports_it)
    with pytest.raises(CheckpointWriteError, match=r"model_phase0.torch: the file could not be "
                       r"written \(\[enforce fail at inline_container.cc:672\] . unexpected pos"):
        save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})  # the disk has room

    def bug(obj, handle):
        raise RuntimeError("a bug, not a write")

    monkeypatch.setattr(torch, "save", bug)
    with pytest.raises(RuntimeError, match="^a bug, not a write$"):
        save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})
    assert list(tmp_path.iterdir()) == []


def test_full_disk_on_a_real_small_file_system(tmp_path):
    """A 2 MB tmpfs: the second 1.2 MB checkpoint does not fit."""
    with small_tmpfs(tmp_path / "disk") as disk:
        save_checkpoint(disk, "model_phase0.torch", {"w": torch.zeros(300_000)})
        with pytest.raises(CheckpointWriteError) as err:
            save_checkpoint(disk, "model_phase1.torch", {"w": torch.ones(300_000)})
        assert re.fullmatch(
            re.escape(f"could not save checkpoint {disk / 'model_phase1.torch'}: no space left "
                      f"on {disk}: ") + r"0\.\d MB free, the checkpoint needs about 1\.1 MB"
            + re.escape(". Nothing already saved was touched: the last checkpoint saved is "
                        f"{disk / 'model_phase0.torch'} (checkpoint.torch points to it); run "
                        "again with config.CHECKPOINT.AUTO_RESUME=true to continue from it"),
            str(err.value))
        assert sorted(p.name for p in disk.iterdir()) == [LATEST_NAME, "model_phase0.torch"]
        assert torch.equal(load_latest_checkpoint(disk)["w"], torch.zeros(300_000))


def test_failing_pointer_update_keeps_the_previous_pointer(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})

    def failing_replace(src, dst):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(CheckpointWriteError, match="Input/output error"):
        save_checkpoint(tmp_path, "model_phase1.torch", {"a": 2})
    monkeypatch.undo()
    assert os.readlink(tmp_path / LATEST_NAME) == "model_phase0.torch"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_corrupt_checkpoint_refused_and_previous_usable(tmp_path):
    save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})
    save_checkpoint(tmp_path, "model_phase1.torch", {"a": 2})
    (tmp_path / "model_phase1.torch").write_bytes(b"\x00garbage" * 10)  # bit rot after the write
    with pytest.raises(CheckpointError) as err:
        load_latest_checkpoint(tmp_path)
    text = str(err.value)
    assert "model_phase1.torch is corrupt or unreadable" in text
    assert "model_phase0.torch is intact" in text
    assert load_checkpoint(tmp_path / "model_phase0.torch") == {"a": 1}
    # following the advice: move the corrupt file and its pointer away, then resume works
    os.remove(tmp_path / "model_phase1.torch")
    os.remove(tmp_path / LATEST_NAME)
    assert load_latest_checkpoint(tmp_path) == {"a": 1}


def test_dangling_pointer_falls_back_to_newest_file(tmp_path):
    save_checkpoint(tmp_path, "model_iteration4.torch", {"a": 1})
    save_checkpoint(tmp_path, "model_iteration8.torch", {"a": 2})
    os.remove(tmp_path / "model_iteration8.torch")
    assert latest_checkpoint_path(tmp_path).name == "model_iteration4.torch"


def test_missing_and_empty(tmp_path):
    assert load_latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.torch")
    atomic_torch_save([1, 2], tmp_path / "list.torch")
    with pytest.raises(CheckpointError, match="does not hold a dict"):
        load_checkpoint(tmp_path / "list.torch")


# ---------------------------------------------------------------- weights-only loading
class RunsCommand:
    """An object whose unpickling runs a shell command (what a malicious file carries)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("zip_format", [True, False])
def test_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path, zip_format):
    marker = tmp_path / "code_ran"
    path = tmp_path / "evil.torch"
    torch.save({"classy_state_dict": RunsCommand(f"touch {marker}"), "w": torch.ones(2)}, path,
               _use_new_zipfile_serialization=zip_format)
    for mmap in (False, True):
        with pytest.raises(UnsafeCheckpointError) as err:
            load_checkpoint(path, mmap=mmap)
        assert str(err.value).startswith(
            f"{path} was not loaded: it holds Python objects other than weights (posix.system), "
            "and loading those could run code the file carries.")
    assert not marker.exists()


def test_other_python_objects_are_refused_too(tmp_path):
    import argparse

    path = tmp_path / "with_args.pth"
    torch.save({"model": {"w": torch.ones(1)}, "args": argparse.Namespace(lr=0.1)}, path)
    with pytest.raises(UnsafeCheckpointError, match=r"\(argparse.Namespace\)"):
        load_checkpoint(path)


def test_checkpoint_state_must_be_plain_data(tmp_path):
    with pytest.raises(TypeError, match=r"checkpoint/loss/queue is a numpy.ndarray"):
        save_checkpoint(tmp_path, "model_phase0.torch",
                        {"loss": {"queue": np.zeros(3)}, "phase_idx": 0})
    with pytest.raises(TypeError, match=r"checkpoint/best\[0\] is a numpy.float64"):
        save_checkpoint(tmp_path, "model_phase0.torch", {"best": [np.float64(1.0)]})
    assert list(tmp_path.iterdir()) == []


def _draws():
    return random.random(), float(np.random.randn()), float(torch.rand(1))


def test_rng_states_are_plain_data_and_restore_exactly(tmp_path):
    rng.set_seeds(7)
    np.random.randn()  # a cached gaussian is part of numpy's state
    state = rng.get_rng_state()
    expected = _draws()
    save_checkpoint(tmp_path, "model_phase0.torch", {"rng_states": [state]})
    # torch's own weights-only load, without the engine's allowance for numpy arrays
    loaded = torch.load(tmp_path / "model_phase0.torch", weights_only=True)
    rng.set_rng_state(loaded["rng_states"][0])
    assert _draws() == expected


def test_checkpoints_of_the_previous_version_still_load_and_restore(tmp_path):
    """Earlier versions saved numpy's and python's RNG states as they come (a numpy array in
    a tuple): those files load, weights-only, and their states restore."""
    rng.set_seeds(11)
    legacy = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
              "python": random.getstate()}
    expected = _draws()
    torch.save({"rng_states": [legacy], "classy_state_dict": {}}, tmp_path / "old.torch")
    rng.set_seeds(0)
    rng.set_rng_state(load_checkpoint(tmp_path / "old.torch")["rng_states"][0])
    assert _draws() == expected
