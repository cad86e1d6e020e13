"""Atomic checkpoint writes, the latest pointer, and refusal of corrupt files."""
import os

import pytest
import torch

from ssl_engine.utils.checkpoint import (
    LATEST_NAME, CheckpointError, atomic_torch_save, latest_checkpoint_path, load_checkpoint,
    load_latest_checkpoint, save_checkpoint,
)


def test_save_points_latest_to_newest(tmp_path):
    save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})
    save_checkpoint(tmp_path, "model_phase1.torch", {"a": 2})
    assert os.readlink(tmp_path / LATEST_NAME) == "model_phase1.torch"
    assert load_latest_checkpoint(tmp_path) == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        LATEST_NAME, "model_phase0.torch", "model_phase1.torch"]  # no temporary files left


def test_crash_mid_write_keeps_previous(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, "model_phase0.torch", {"a": 1})

    def exploding_save(obj, handle):
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", exploding_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, "model_phase1.torch", {"a": 2})
    monkeypatch.undo()
    assert not (tmp_path / "model_phase1.torch").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert load_latest_checkpoint(tmp_path) == {"a": 1}


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
