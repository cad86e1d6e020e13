"""What is in the way in CHECKPOINT.DIR (or on the way to it) is refused before launch in one
line naming it; what a killed run leaves behind there is cleaned at the next start."""
import os

from engine_utils import QUICK
from ssl_engine.config import load_config
from ssl_engine.engines.launcher import _report_folder, main


def _refusal(capsys, *args) -> str:
    code = main([QUICK, *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_a_lock_that_is_a_folder_is_named(tmp_path, capsys):
    (tmp_path / ".run.lock").mkdir()
    assert _refusal(capsys, f"config.CHECKPOINT.DIR={tmp_path}") == (
        f"error: {tmp_path / '.run.lock'} is a folder, not the lock file of a run: remove it "
        "(the engine creates that file to keep two runs out of one folder)")


def test_an_unreadable_lock_left_by_a_failed_start_does_not_block_the_launch(tmp_path, capsys):
    """A lock is written whole (under another name, then linked), so one that cannot be read
    was left by a start that failed while writing it: the launch takes it over and trains."""
    (tmp_path / ".run.lock").write_text("{not json")
    code = main([QUICK, f"config.CHECKPOINT.DIR={tmp_path}", "config.OPTIMIZER.num_epochs=1"])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "model_final_checkpoint_phase0.torch").exists()
    assert not (tmp_path / ".run.lock").exists()  # released at the end


def test_a_checkpoint_pointer_that_is_a_folder_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "checkpoint.torch").mkdir()
    assert _refusal(capsys, f"config.CHECKPOINT.DIR={tmp_path}") == (
        f"error: {tmp_path / 'checkpoint.torch'} is a folder: the engine keeps a link to the "
        "latest checkpoint under that name and could not save any checkpoint; move the folder "
        "away or pick another config.CHECKPOINT.DIR")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.torch"]  # nothing ran


def test_a_folder_through_a_file_is_explained(tmp_path, capsys):
    (tmp_path / "notes").write_text("a file")
    folder = tmp_path / "notes" / "run"
    line = _refusal(capsys, f"config.CHECKPOINT.DIR={folder}")
    assert "[Errno" not in line
    assert line == (f"error: config.CHECKPOINT.DIR={folder} is not writable: Not a directory "
                    f"(ENOTDIR): {tmp_path / 'notes'} is a file, not a folder")


def test_a_folder_given_as_the_weights_file_is_called_a_folder(tmp_path, capsys):
    line = _refusal(capsys, f"config.CHECKPOINT.DIR={tmp_path / 'run'}",
                    f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={tmp_path}")
    assert line == (f"error: MODEL.WEIGHTS_INIT.PARAMS_FILE {tmp_path} is a folder, not a "
                    "weights file")


def test_rank_reports_live_in_the_run_folder_and_a_killed_launchers_are_replaced(tmp_path):
    """The spawned processes report their errors through a folder of CHECKPOINT.DIR (not the
    system's temporary folder, where each killed launcher used to leave one)."""
    _, cfg = load_config([QUICK, f"config.CHECKPOINT.DIR={tmp_path}"])
    stale = tmp_path / ".rank_reports.node0"
    stale.mkdir()
    (stale / "00001.txt").write_text("the error of a run killed long ago")
    with _report_folder(cfg) as folder:
        assert folder == str(stale) and os.listdir(folder) == []
    assert not stale.exists()
