"""A run resumed (CHECKPOINT.AUTO_RESUME=true) with another loss, trunk, trunk shape, head or
task (DDP / FSDP) than the run in CHECKPOINT.DIR is refused before launch, in one line naming what
differs, the checkpoint's value and the config's, with exit code 2; what may change on a
resume (batch size, epochs, processes, learning rate) is accepted and the run goes on."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine_utils import QUICK, run_engine
from ssl_engine.checkpoint import check_resume_files, load_checkpoint
from ssl_engine.config import load_config
from ssl_engine.engines.launcher import main

REPO = Path(__file__).resolve().parents[1]
# 8 images in one batch of 8: one iteration, one epoch
TINY = ["config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=8"]
RESUME = ["config.CHECKPOINT.AUTO_RESUME=true"]
FSDP = ["config.TRAINER.TASK_NAME=self_supervision_fsdp_task"]
START_OVER = ("pick another config.CHECKPOINT.DIR for this config, or start over in it with "
              "config.CHECKPOINT.AUTO_RESUME=false config.CHECKPOINT.OVERWRITE_EXISTING=true")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A finished SimCLR run with the DDP task (``ddp``) and one with the FSDP task
    (``fsdp``), one process each."""
    root = tmp_path_factory.mktemp("resume_refusals")
    run_engine(root / "ddp", TINY)
    run_engine(root / "fsdp", TINY + FSDP)
    return root


def _files(folder: Path):
    return sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())


def _refusal(capsys, folder: Path, *args, config: str = QUICK) -> str:
    """The one line ``main`` prints when it refuses to resume ``folder``; nothing there
    changes."""
    before = _files(folder)
    code = main([config, f"config.CHECKPOINT.DIR={folder}", *TINY, *RESUME, *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert _files(folder) == before
    return lines[0]


def test_another_loss_is_refused_by_the_command_line_before_launch(runs):
    """BYOL's config on SimCLR's run: one line and exit code 2, no traceback from a process."""
    folder = runs / "ddp"
    before = _files(folder)
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"),
         "config=test/quick_byol_synthetic", f"config.CHECKPOINT.DIR={folder}", *TINY, *RESUME],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: config.CHECKPOINT.DIR={folder} holds a run of loss simclr_info_nce_loss, and "
        "this config trains byol_loss: resume it with the config it was trained with "
        f"(config.LOSS.name=simclr_info_nce_loss), {START_OVER}"]
    assert _files(folder) == before


def test_another_trunk_is_refused(runs, capsys):
    folder = runs / "ddp"
    assert _refusal(capsys, folder, "config.MODEL.TRUNK.NAME=alexnet_rotnet") == (
        f"error: config.CHECKPOINT.DIR={folder} holds a run of trunk resnet, and this config "
        "trains alexnet_rotnet: resume it with the config it was trained with "
        f"(config.MODEL.TRUNK.NAME=resnet), {START_OVER}")


def test_another_trunk_depth_is_refused_naming_the_setting_and_a_tensor(runs, capsys):
    folder = runs / "ddp"
    assert _refusal(capsys, folder, "config.MODEL.TRUNK.RESNETS.DEPTH=50") == (
        f"error: config.CHECKPOINT.DIR={folder} holds a run of another model "
        "(config.MODEL.TRUNK.RESNETS.DEPTH is 18 there and 50 here; 221 tensors differ, the "
        "first trunk.layer1.0.conv1.weight: (8, 8, 3, 3) in the checkpoint, (8, 8, 1, 1) in "
        "this config's model): resume it with config.MODEL.TRUNK.RESNETS.DEPTH=18, "
        f"{START_OVER}")


def test_another_head_is_refused_naming_the_setting_and_a_tensor(runs, capsys):
    folder = runs / "ddp"
    head = "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,32,16],use_relu:true}]]"
    assert _refusal(capsys, folder, head) == (
        f"error: config.CHECKPOINT.DIR={folder} holds a run of another model "
        "(config.MODEL.HEAD.PARAMS[0][1].dims is [64,64,16] there and [64,32,16] here; 3 "
        "tensors differ, the first heads.0.clf.0.weight: (64, 64) in the checkpoint, (32, 64) "
        "in this config's model): resume it with the model settings it was trained with, "
        f"{START_OVER}")


def test_a_ddp_run_resumed_with_the_fsdp_task_is_refused(runs, capsys):
    folder = runs / "ddp"
    assert _refusal(capsys, folder, *FSDP) == (
        f"error: config.CHECKPOINT.DIR={folder} holds a run of the DDP task "
        "self_supervision_task (its optimizer state in the checkpoint, no sharded folder), and "
        "this config trains with the FSDP task self_supervision_fsdp_task: resume it with "
        f"config.TRAINER.TASK_NAME=self_supervision_task, {START_OVER}")


def test_an_fsdp_run_resumed_with_the_ddp_task_is_refused(runs, capsys):
    folder = runs / "fsdp"
    assert _refusal(capsys, folder) == (
        f"error: config.CHECKPOINT.DIR={folder} holds a run of the FSDP task "
        "self_supervision_fsdp_task (its model and optimizer state sharded in "
        "model_final_checkpoint_phase0.torch.sharded), and this config trains with the DDP "
        "task self_supervision_task: resume it with "
        f"config.TRAINER.TASK_NAME=self_supervision_fsdp_task, {START_OVER}")


def test_an_fsdp_checkpoint_without_its_sharded_folder_is_refused(runs, tmp_path, capsys):
    folder = tmp_path / "fsdp"
    shutil.copytree(runs / "fsdp", folder, symlinks=True)
    shutil.rmtree(folder / "model_final_checkpoint_phase0.torch.sharded")
    assert _refusal(capsys, folder, *FSDP) == (
        f"error: the latest checkpoint of config.CHECKPOINT.DIR={folder} keeps its model and "
        "optimizer state in the folder model_final_checkpoint_phase0.torch.sharded beside it, "
        f"which is missing: the checkpoint cannot be resumed without it; {START_OVER}")


def test_what_may_change_on_a_resume_is_accepted_and_the_run_goes_on(runs, tmp_path):
    """Another batch size, number of epochs, process count and learning rate: the check
    passes and the run (checked again before its launch, by ``run_engine``) resumes after its
    first epoch (1 iteration), the second taking 2 iterations of 4 images each (from scratch it
    would end at iteration 4)."""
    folder = tmp_path / "ddp"
    shutil.copytree(runs / "ddp", folder, symlinks=True)
    changed = ["config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=8", *RESUME,
               "config.OPTIMIZER.num_epochs=2", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
               "config.OPTIMIZER.param_schedulers.lr.start_value=0.05"]
    _, cfg = load_config([QUICK, f"config.CHECKPOINT.DIR={folder}", *changed,
                          "config.DISTRIBUTED.NUM_PROC_PER_NODE=2"])
    check_resume_files(cfg)  # not refused
    run_engine(folder, changed)
    final = load_checkpoint(folder / "model_final_checkpoint_phase1.torch")
    assert final["iteration"] == 3
    assert final["config"]["DATA"]["TRAIN"]["BATCHSIZE_PER_REPLICA"] == 4
