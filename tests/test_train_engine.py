"""End-to-end training on the tiny synthetic config: files, hooks, train steps, resume."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine_utils import (QUICK, copy_of, crash_hooks_at, final_weights, metrics, run_engine,
                          small_tmpfs, step_losses)
from ssl_engine.checkpoint import load_checkpoint
from ssl_engine.hooks import SSLHook
from ssl_engine.trainer import register_train_step
from ssl_engine.trainer.train_steps.standard_train_step import standard_train_step

REPO = Path(__file__).resolve().parents[1]
# 32 synthetic images, batch 8: 4 iterations per epoch, 2 epochs
ITERS_PER_EPOCH, EPOCHS = 4, 2


CALLS = []


@register_train_step("test_counting_step")
def counting_step(task):
    standard_train_step(task)
    CALLS.append(task.iteration)
    return task


@pytest.fixture(scope="module")
def counted_run(tmp_path_factory):
    """One run for the three tests below: checkpoints every 3 iterations, a log line per step,
    the train step chosen by name (the standard step, counted): its folder and the iterations
    the step ran."""
    folder = tmp_path_factory.mktemp("counted")
    CALLS.clear()
    run_engine(folder, ["config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3", "config.LOG_FREQUENCY=1",
                        "config.TRAINER.TRAIN_STEP_NAME=test_counting_step"])
    return folder, list(CALLS)


def test_train_step_chosen_by_name(counted_run):
    assert counted_run[1] == list(range(1, ITERS_PER_EPOCH * EPOCHS + 1))


def test_checkpoint_files_keys_and_logs(counted_run):
    tmp_path = counted_run[0]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["checkpoint.torch", "log.txt", "metrics.json",
                     "model_final_checkpoint_phase1.torch", "model_iteration3.torch",
                     "model_iteration6.torch", "model_phase0.torch"]
    assert os.readlink(tmp_path / "checkpoint.torch") == "model_final_checkpoint_phase1.torch"

    final = load_checkpoint(tmp_path / "model_final_checkpoint_phase1.torch")
    assert final["type"] == "phase" and final["iteration"] == ITERS_PER_EPOCH * EPOCHS
    assert final["train_phase_idx"] == 1 and final["phase_idx"] == 1
    classy = final["classy_state_dict"]
    assert set(classy["base_model"]["model"]) == {"trunk", "heads"}
    assert "conv1.weight" in classy["base_model"]["model"]["trunk"]
    assert {"optimizer", "loss", "meters", "phase_idx", "train_phase_idx", "iteration",
            "iteration_num_in_phase"} <= set(classy)
    assert len(final["rng_states"]) == 1 and final["config"]["OPTIMIZER"]["num_epochs"] == 2

    mid = load_checkpoint(tmp_path / "model_iteration3.torch")
    assert mid["type"] == "iteration" and mid["classy_state_dict"]["iteration_num_in_phase"] == 3

    records = metrics(tmp_path)
    steps = [r for r in records if r.get("phase") == "train"]
    assert [r["iteration"] for r in steps] == list(range(1, 9))
    for r in steps:
        assert r["loss"] > 0 and r["lr"] > 0 and r["images_per_sec"] > 0
        assert r["peak_mem_mb"] > 0 and r["eta_seconds"] >= 0
    assert steps[-1]["eta_seconds"] == 0
    assert [r["phase_end"] for r in records if "phase_end" in r] == ["train", "train"]
    log = (tmp_path / "log.txt").read_text()
    assert "| eta " in log and "img/s" in log and "saved checkpoint" in log


def test_lr_follows_cosine_schedule_per_step(counted_run):
    import math

    total = ITERS_PER_EPOCH * EPOCHS
    for r in (r for r in metrics(counted_run[0]) if r.get("phase") == "train"):
        where = (r["iteration"] - 1) / total  # the lr used by the step that just ran
        expected = 0.001 + (0.1 - 0.001) * (1 + math.cos(math.pi * where)) / 2
        assert r["lr"] == pytest.approx(expected, rel=1e-9)


class RecordingHook(SSLHook):
    def __init__(self):
        super().__init__()
        self.events = []

    def __getattribute__(self, name):
        if name.startswith("on_"):
            events = object.__getattribute__(self, "events")
            return lambda task: events.append((name, task.phase_type))
        return object.__getattribute__(self, name)


def test_hooks_see_every_event_in_order(tmp_path):
    recorder = RecordingHook()
    run_engine(tmp_path, ["config.OPTIMIZER.num_epochs=1", "config.TEST_MODEL=true",
                          "config.DATA.TEST.DATA_SOURCES=[synthetic]",
                          "config.DATA.TEST.DATA_PATHS=['']",
                          "config.DATA.TEST.BATCHSIZE_PER_REPLICA=16",
                          "config.DATA.TEST.COLLATE_FUNCTION=simclr_collator",
                          "config.DATA.TEST.SYNTHETIC.NUM_SAMPLES=16",
                          "config.DATA.TEST.SYNTHETIC.IMAGE_SIZE=24",
                          "config.DATA.TEST.TRANSFORMS=[{name: ImgReplicatePil, num_times: 2},"
                          "{name: Resize, size: 16}, {name: ToTensor}]"],
               hook_generator=lambda cfg: [recorder])
    train_step = [("on_forward", "train"), ("on_loss_and_meter", "train"),
                  ("on_backward", "train"), ("on_update", "train"), ("on_step", "train")]
    test_step = [("on_forward", "test"), ("on_loss_and_meter", "test"), ("on_step", "test")]
    expected = ([("on_start", "train"), ("on_phase_start", "train")]
                + train_step * ITERS_PER_EPOCH + [("on_phase_end", "train")]
                + [("on_phase_start", "test")] + test_step + [("on_phase_end", "test")]
                + [("on_end", "test")])
    assert recorder.events == expected


# the first case also keeps an EMA of the weights (HOOKS.EMA_MODEL): copies at updates 0 and 2
# (warm-up), then averages every second update, in the checkpoints
EMA_EVERY_2 = ["config.HOOKS.EMA_MODEL.SAVE_EMA_MODEL=true", "config.HOOKS.EMA_MODEL.DECAY=0.6",
               "config.HOOKS.EMA_MODEL.WARMUP=0.3", "config.HOOKS.EMA_MODEL.UPDATE_ITER=2",
               "config.HOOKS.EMA_MODEL.EMA_DEVICE=cpu"]


def final_ema_weights(checkpoint_dir: Path):
    state = load_checkpoint(Path(checkpoint_dir) / "checkpoint.torch")
    model = state["classy_state_dict"]["ema_model"]["model"]
    return {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in model[part].items()}


@pytest.mark.parametrize("crash_at, frequency, workers, ema", [(6, 2, 0, True),
                                                               (3, 3, 2, False)])
def test_resume_after_crash_is_bit_exact(tmp_path, crash_at, frequency, workers, ema):
    overrides = [f"config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY={frequency}",
                 f"config.DATA.NUM_DATALOADER_WORKERS={workers}", "config.LOG_FREQUENCY=1",
                 *(EMA_EVERY_2 if ema else [])]
    run_engine(tmp_path / "straight", overrides)

    with pytest.raises(RuntimeError, match="simulated crash"):
        run_engine(tmp_path / "crashed", overrides, hook_generator=crash_hooks_at(crash_at))
    latest = load_checkpoint(tmp_path / "crashed" / "checkpoint.torch")
    assert latest["type"] == "iteration"  # mid-epoch: an epoch has 4 iterations
    assert 0 < latest["classy_state_dict"]["iteration_num_in_phase"] < ITERS_PER_EPOCH
    run_engine(tmp_path / "crashed", overrides + ["config.CHECKPOINT.AUTO_RESUME=true"])

    straight, resumed = final_weights(tmp_path / "straight"), final_weights(tmp_path / "crashed")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    if ema:
        straight_ema = final_ema_weights(tmp_path / "straight")
        resumed_ema = final_ema_weights(tmp_path / "crashed")
        assert straight_ema.keys() == straight.keys()
        for name in straight_ema:
            assert torch.equal(straight_ema[name], resumed_ema[name]), name
        assert not torch.equal(straight_ema["trunk.conv1.weight"], straight["trunk.conv1.weight"])
    # the steps after the resume point saw the same losses
    assert step_losses(tmp_path / "crashed") == step_losses(tmp_path / "straight")


def _cli(args, checkpoint_dir, env=None):
    return subprocess.run(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"), QUICK,
         f"config.CHECKPOINT.DIR={checkpoint_dir}", "config.LOG_FREQUENCY=1", *args],
        capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})},
    )


# checkpoints at iterations 3 and 6, and at the ends of the epochs (iterations 4 and 8)
EVERY_3 = ["config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3"]


@pytest.fixture(scope="module")
def straight_every_3(quick_straight_run):
    """The final weights of an uninterrupted command-line run with EVERY_3 (conftest.py)."""
    return final_weights(quick_straight_run)


def plugin_env(module, **variables):
    # this checkout's engine (not an installed one) and the test plugins
    return {"SSL_ENGINE_PLUGINS": f"plugins.{module}",
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
            **{f"SSL_ENGINE_TEST_{k}": str(v) for k, v in variables.items()}}


def test_sigkill_mid_epoch_then_auto_resume_from_the_command_line(tmp_path, straight_every_3):
    killed = _cli(EVERY_3 + ["config.TRAINER.TRAIN_STEP_NAME=kill_after_iteration"], tmp_path,
                  env=plugin_env("kill_step", KILL_AT=7))
    assert killed.returncode == -9
    assert os.readlink(tmp_path / "checkpoint.torch") == "model_iteration6.torch"
    assert (tmp_path / ".run.lock").exists()  # the killed run could not release its lock

    resumed = _cli(EVERY_3 + ["config.CHECKPOINT.AUTO_RESUME=true"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"took over the lock of {tmp_path}: the run of pid " in resumed.stderr
    assert "resuming from phase" in (tmp_path / "log.txt").read_text()
    assert not (tmp_path / ".run.lock").exists()
    resumed_weights = final_weights(tmp_path)
    assert all(torch.equal(straight_every_3[k], resumed_weights[k]) for k in straight_every_3)
    # iteration 7 was logged before the kill and again by the resumed run: metrics.json holds
    # it once (the rows after the checkpoint of iteration 6 were replaced), one curve
    rows = [(m.get("phase") or m.get("phase_end"), m["phase_idx"], m["iteration"])
            for m in metrics(tmp_path) if "phase_idx" in m and "iteration" in m]
    assert rows == [("train", 0, 1), ("train", 0, 2), ("train", 0, 3), ("train", 0, 4),
                    ("train", 0, 4), ("train", 1, 5), ("train", 1, 6), ("train", 1, 7),
                    ("train", 1, 8), ("train", 1, 8)]  # the second 4 and 8: the phase ends


def test_orphan_temporary_files_of_a_killed_save_are_removed_at_the_next_start(tmp_path):
    """A process killed while it wrote a checkpoint leaves its temporary file (the save is
    atomic: the checkpoint's own name is untouched); the next run in the folder removes it."""
    orphans = [".model_iteration3.torch.k2j4_x.tmp", ".checkpoint.torch.4242.tmp"]
    for name in orphans:
        (tmp_path / name).write_bytes(b"partial")
    (tmp_path / ".notes.tmp").write_text("not the engine's")
    proc = _cli(["config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=8"],
                tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not [name for name in orphans if (tmp_path / name).exists()]
    assert (tmp_path / ".notes.tmp").exists()
    assert "removed the temporary files of saves that did not finish" in proc.stderr


def test_second_run_in_the_same_folder_is_refused_before_launch(tmp_path):
    """A second launch (a requeued job: AUTO_RESUME on) while the first runs is refused,
    naming the first; the first is not disturbed and ends complete."""
    import socket
    import time

    started, go = tmp_path / "started", tmp_path / "go"
    folder = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"), QUICK,
         f"config.CHECKPOINT.DIR={folder}", "config.TRAINER.TRAIN_STEP_NAME=wait_for_go",
         "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **plugin_env("wait_step", STARTED=started, GO=go)})
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), first.communicate()[1]
        second = _cli(["config.CHECKPOINT.AUTO_RESUME=true"], folder)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"error: config.CHECKPOINT.DIR={folder} is in use by another run: pid {first.pid} "
            f"on host {socket.gethostname()} (started ")
        assert "Two runs in one folder overwrite each other's checkpoints" in lines[0]
        assert "init process group" not in second.stdout
    finally:
        go.touch()
        out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert not (folder / ".run.lock").exists()
    assert os.readlink(folder / "checkpoint.torch") == "model_final_checkpoint_phase1.torch"
    assert (folder / "log.txt").read_text().count("init process group") == 1


def test_full_disk_during_a_checkpoint_stops_with_one_message_then_resumes(
        tmp_path, straight_every_3):
    # the 3rd save is model_iteration6.torch (after iteration3 and phase0)
    proc = _cli(EVERY_3, tmp_path, env=plugin_env("full_disk", FULL_DISK_SAVE=3))
    assert proc.returncode == 1
    assert_one_full_disk_line(proc.stderr, tmp_path, "model_iteration6.torch", "model_phase0.torch")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".torch")) == [
        "checkpoint.torch", "model_iteration3.torch", "model_phase0.torch"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert not (tmp_path / ".run.lock").exists()
    assert load_checkpoint(tmp_path / "checkpoint.torch")["iteration"] == 4

    resumed = _cli(EVERY_3 + ["config.CHECKPOINT.AUTO_RESUME=true"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    resumed_weights = final_weights(tmp_path)
    assert all(torch.equal(straight_every_3[k], resumed_weights[k]) for k in straight_every_3)


def test_full_disk_in_a_two_process_run_reports_the_checkpoint_error(tmp_path):
    """Rank 0's error is reported, not the connection errors it causes in the other rank."""
    proc = _cli(["config.OPTIMIZER.num_epochs=1", "config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2",
                 "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
                 "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"], tmp_path,
                env=plugin_env("full_disk", FULL_DISK_SAVE=2))
    assert proc.returncode == 1
    assert_one_full_disk_line(proc.stderr, tmp_path, "model_iteration4.torch",
                              "model_iteration2.torch")


def test_full_disk_of_a_real_small_file_system_during_a_checkpoint(tmp_path):
    """CHECKPOINT.DIR on a 2 MB tmpfs: the first checkpoint (1.5 MB) fits, the second does not,
    and torch's writer reports it as "unexpected pos", which the engine recognises. (16
    images: 2 iterations per epoch.)"""
    with small_tmpfs(tmp_path / "disk") as disk:
        proc = _cli(["config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16"], disk)
        assert proc.returncode == 1
        assert_one_full_disk_line(proc.stderr, disk, "model_final_checkpoint_phase1.torch",
                                  "model_phase0.torch")
        assert sorted(p.name for p in disk.iterdir() if not p.name.endswith((".txt", ".json"))) \
            == ["checkpoint.torch", "model_phase0.torch"]
        assert load_checkpoint(disk / "checkpoint.torch")["iteration"] == 2


def assert_one_full_disk_line(stderr: str, folder: Path, failed: str, kept: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert re.fullmatch(
        re.escape(f"error: could not save checkpoint {folder / failed}: no space left on "
                  f"{folder}: ") + r"\d+\.\d MB free, the checkpoint needs about \d+\.\d MB"
        + re.escape(". Nothing already saved was touched: the last checkpoint saved is "
                    f"{folder / kept} (checkpoint.torch points to it); run again with "
                    "config.CHECKPOINT.AUTO_RESUME=true to continue from it"), lines[0]), lines[0]


@pytest.mark.parametrize("nproc", [1, 2])
def test_dead_data_loader_worker_ends_the_run_with_one_message(tmp_path, nproc):
    proc = _cli(["config.DATA.TRAIN.DATA_SOURCES=[worker_killing_synthetic]",
                 "config.DATA.NUM_DATALOADER_WORKERS=2",
                 f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
                 f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={8 // nproc}"], tmp_path,
                env=plugin_env("kill_worker", KILL_AT=6))  # _cli times out after 300 s
    assert proc.returncode == 1
    # with 2 processes, the C++ runtime of the process that is stopped mid-collective
    # sometimes prints "terminate called without an active exception" as it dies (seen once
    # in many runs); the engine's own output is the one error line
    lines = [line for line in proc.stderr.strip().splitlines()
             if line != "terminate called without an active exception"]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "error: a data-loader worker died while reading config.DATA.TRAIN (data sources "
        "['worker_killing_synthetic']): DataLoader worker (pid")
    assert lines[0].endswith("Checkpoints already written are intact: continue with "
                             "config.CHECKPOINT.AUTO_RESUME=true")
    assert not (tmp_path / ".run.lock").exists()


# one epoch, checkpoints at iterations 2 and 4 and at the epoch's end
ONE_EPOCH_EVERY_2 = ["config.CHECKPOINT.CHECKPOINT_ITER_FREQUENCY=2",
                     "config.OPTIMIZER.num_epochs=1"]


@pytest.fixture(scope="module")
def one_epoch_run(tmp_path_factory):
    """A finished run of ONE_EPOCH_EVERY_2; the tests below work in copies of its folder."""
    folder = tmp_path_factory.mktemp("one_epoch") / "run"
    run_engine(folder, ONE_EPOCH_EVERY_2)
    return folder


def test_existing_checkpoints_without_resume_are_refused(tmp_path, one_epoch_run):
    tmp_path = copy_of(one_epoch_run, tmp_path / "run")
    proc = _cli(["config.CHECKPOINT.AUTO_RESUME=false"], tmp_path)
    assert proc.returncode == 2
    assert "already holds checkpoints" in proc.stderr
    # a finished run resumed again does no more work and keeps its weights
    before = final_weights(tmp_path)
    run_engine(tmp_path, ONE_EPOCH_EVERY_2)
    after = final_weights(tmp_path)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_missing_data_path_is_named(tmp_path):
    proc = _cli(["config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
                 f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path}/nowhere]"], tmp_path / "out")
    assert proc.returncode == 2
    assert f"{tmp_path}/nowhere" in proc.stderr and "Traceback" not in proc.stderr


def test_documented_example_step_runs_as_a_plugin(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools/run_distributed_engines.py"),
         "config=supervised/digits_resnet", f"config.CHECKPOINT.DIR={tmp_path}",
         "config.TRAINER.TRAIN_STEP_NAME=accumulate_and_clip_step",
         "config.OPTIMIZER.num_epochs=1", "config.LOG_FREQUENCY=1",
         "config.DATA.TRAIN.DATA_LIMIT=256", "config.DATA.TEST.DATA_LIMIT=128",
         "config.HOOKS.RUN_REPORT.ENABLED=false"],  # seconds not tested here
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "SSL_ENGINE_PLUGINS": "my_train_step",
             "PYTHONPATH": str(REPO / "docs/examples")},
    )
    assert proc.returncode == 0, proc.stderr
    records = metrics(tmp_path)
    assert [r["iteration"] for r in records if r.get("phase") == "train"] == [1, 2, 3, 4]
    assert [r["phase_end"] for r in records if "phase_end" in r] == ["train", "test"]


def test_diverging_run_stops_with_one_message(tmp_path):
    proc = _cli(["config.OPTIMIZER.param_schedulers.lr.start_value=1e12",
                 "config.OPTIMIZER.param_schedulers.lr.end_value=1e12"], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: loss is nan at iteration 1 (phase 0, iteration 1 of the phase); lower the "
        "learning rate or check the data. Checkpoints already written are intact."]
    assert "Traceback" not in proc.stdout


def image_classes(root, bad=()):
    """root/a/0..3.png and root/b/0..3.png (index 4 * class + i); the names in ``bad`` hold
    text instead of an image."""
    from PIL import Image

    for cls in ("a", "b"):
        for i in range(4):
            path = root / cls / f"{i}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (24, 24), color=(40 * i, 80, 120)).save(path)
    for name in bad:
        (root / name).write_bytes(b"not a png")
    return ["config.DATA.TRAIN.DATA_SOURCES=[disk_folder]", f"config.DATA.TRAIN.DATA_PATHS=[{root}]"]


@pytest.mark.parametrize("workers, nproc", [(0, 1), ("auto", 1), (1, 2)])  # auto: 2 here
def test_corrupt_image_stops_training_with_one_line_whatever_the_workers(tmp_path, workers, nproc):
    data = image_classes(tmp_path / "images", bad=["b/2.png"])
    proc = _cli(data + [f"config.DATA.NUM_DATALOADER_WORKERS={workers}",
                        f"config.DISTRIBUTED.NUM_PROC_PER_NODE={nproc}",
                        f"config.DATA.TRAIN.BATCHSIZE_PER_REPLICA={8 // nproc}"], tmp_path / "out")
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: cannot read image {tmp_path / 'images/b/2.png'}: not an image file Pillow can "
        "decode (cannot identify image file) (index 6 of config.DATA.TRAIN); set "
        "config.DATA.TRAIN.ENABLE_QUEUE_DATASET=true to skip unreadable images, each replaced by "
        "the next readable sample (up to config.DATA.TRAIN.MAX_INVALID_IMAGES=100)"]


def test_too_many_unreadable_images_with_workers_stop_with_one_line(tmp_path):
    data = image_classes(tmp_path / "images", bad=["a/1.png", "b/2.png"])
    proc = _cli(data + ["config.DATA.NUM_DATALOADER_WORKERS=auto",
                        "config.DATA.TRAIN.ENABLE_QUEUE_DATASET=true",
                        "config.DATA.TRAIN.MAX_INVALID_IMAGES=1"], tmp_path / "out")
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(
        "error: 2 unreadable images in config.DATA.TRAIN, more than "
        "config.DATA.TRAIN.MAX_INVALID_IMAGES=1 (-1: no limit); the last: cannot read image "
        f"{tmp_path / 'images'}/")


def test_missing_images_of_a_file_list_are_skipped_in_a_two_process_run(tmp_path):
    import numpy as np

    image_classes(tmp_path / "images")
    files = [str(tmp_path / "images" / cls / f"{i}.png") for cls in "ab" for i in range(4)]
    files[5] = str(tmp_path / "images" / "gone.png")
    np.save(tmp_path / "files.npy", np.array(files))
    proc = _cli(["config.DATA.TRAIN.DATA_SOURCES=[disk_filelist]",
                 f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path / 'files.npy'}]",
                 "config.DATA.NUM_DATALOADER_WORKERS=1", "config.OPTIMIZER.num_epochs=1",
                 "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
                 "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
                 "config.DATA.TRAIN.ENABLE_QUEUE_DATASET=true"], tmp_path / "out")
    # the warning of the worker (started by spawn in a spawned process) is logged like the
    # process's own, not printed bare on stderr
    assert proc.returncode == 0 and proc.stderr == ""
    assert (f"replaced by another sample: cannot read image {files[5]}: no such file (index 5 of "
            "config.DATA.TRAIN)") in proc.stdout
    assert (tmp_path / "out" / "model_final_checkpoint_phase0.torch").exists()


def test_data_folder_without_images_is_refused_before_launch(tmp_path):
    (tmp_path / "images" / "a").mkdir(parents=True)
    (tmp_path / "images" / "b").mkdir()
    proc = _cli(["config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
                 f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path / 'images'}]"], tmp_path / "out")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: config.DATA.TRAIN.DATA_PATHS[0]={tmp_path / 'images'} has no images disk_folder "
        "can read: its 2 class folder(s) hold no image files. disk_folder reads "
        "<folder>/<class>/**/<image>, the images being files ending in .jpg, .jpeg, .png, .ppm, "
        ".bmp, .pgm, .tif, .tiff, .webp (in any case)"]
    assert not (tmp_path / "out").exists()


def test_corrupt_latest_checkpoint_refused_then_previous_resumes(tmp_path, one_epoch_run):
    tmp_path = copy_of(one_epoch_run, tmp_path / "run")
    latest = tmp_path / "model_final_checkpoint_phase0.torch"
    latest.write_bytes(latest.read_bytes()[:1000])  # truncated after the fact (disk trouble)
    proc = _cli(["config.OPTIMIZER.num_epochs=1"], tmp_path)
    assert proc.returncode == 2  # refused before launch
    assert f"checkpoint {latest} is corrupt or unreadable" in proc.stderr
    assert "the previous checkpoint" in proc.stderr and "model_iteration4.torch is intact" \
        in proc.stderr
    assert "Traceback" not in proc.stderr and "init process group" not in proc.stdout
    # as the message says: move the broken file and the link away; the run resumes from the
    # previous checkpoint (iteration 4, the end of the epoch) and ends complete
    os.remove(latest)
    os.remove(tmp_path / "checkpoint.torch")
    proc = _cli(["config.OPTIMIZER.num_epochs=1"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert load_checkpoint(tmp_path / "model_final_checkpoint_phase0.torch")["iteration"] == 4
