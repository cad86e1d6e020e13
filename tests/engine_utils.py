"""Helpers for tests that run the engine on the tiny synthetic config."""
import contextlib
import copy
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Sequence

import pytest
import torch

from ssl_engine.checkpoint import load_checkpoint
from ssl_engine.config import load_config
from ssl_engine.engines.launcher import launch_distributed
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.hooks import SSLHook
from ssl_engine.losses import SSLLoss
from ssl_engine.trainer.default_hooks import default_hook_generator

QUICK = "config=test/quick_simclr_synthetic"


# the extraction tests' data: 21 synthetic test images of 4 classes (16 pixels) in batches of
# 8, the TEST split alone, a narrow ResNet whose heads are evaluated
TINY_TEST_SPLIT = [
    "config.DATA.TEST.DATA_SOURCES=[synthetic]",
    "config.DATA.TEST.SYNTHETIC.NUM_SAMPLES=21",
    "config.DATA.TEST.SYNTHETIC.IMAGE_SIZE=16",
    "config.DATA.TEST.SYNTHETIC.NUM_CLASSES=4",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=8",
    "config.EXTRACT_FEATURES.SPLITS=[TEST]",
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.125",
    "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=false",
]


def run_engine(checkpoint_dir: Path, overrides: Sequence[str] = (), hook_generator=None,
               config: str = QUICK):
    """Compose, check and run a config in this process (or spawned ones) like the CLI does."""
    engine_name, cfg = load_config([config, f"config.CHECKPOINT.DIR={checkpoint_dir}",
                                    *overrides])
    check_before_launch(engine_name, cfg)
    launch_distributed(cfg, engine_name, hook_generator=hook_generator)
    return cfg


class CrashAt(SSLHook):
    """Raises after the on_step of a given iteration (after that step's checkpoint)."""

    def __init__(self, iteration):
        super().__init__()
        self.iteration = iteration

    def on_step(self, task):
        if task.train and task.iteration == self.iteration:
            raise RuntimeError("simulated crash")


class CrashHooks:
    """A hook generator that pickles (for spawned processes): the default hooks, then a crash
    after iteration ``iteration``."""

    def __init__(self, iteration):
        self.iteration = iteration

    def __call__(self, cfg):
        return default_hook_generator(cfg) + [CrashAt(self.iteration)]


def crash_hooks_at(iteration):
    """A hook generator: the default hooks, then a crash after iteration ``iteration`` (in
    every process)."""
    return CrashHooks(iteration)


class FunctionLoss(SSLLoss):
    """The loss of a hand-made task: ``fn(output, target)``, with the loss contract's
    defaults."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, output, target):
        return self.fn(output, target)


def final_weights(checkpoint_dir: Path) -> Dict[str, torch.Tensor]:
    state = load_checkpoint(Path(checkpoint_dir) / "checkpoint.torch")
    model = state["classy_state_dict"]["base_model"]["model"]
    return {f"{part}.{k}": v for part in ("trunk", "heads") for k, v in model[part].items()}


def loss_state(checkpoint_dir: Path) -> Dict[str, torch.Tensor]:
    return load_checkpoint(Path(checkpoint_dir) / "checkpoint.torch")["classy_state_dict"]["loss"]


def copy_of(run_dir: Path, folder: Path) -> Path:
    """``folder``: a copy of the finished run (or extraction) ``run_dir``, links kept, for a
    test that works on a run another test shares."""
    return Path(shutil.copytree(run_dir, folder, symlinks=True))


def stopped_after(run_dir: Path, folder: Path, checkpoint: str) -> Path:
    """``folder``: a copy of the finished run ``run_dir`` as if it had stopped right after
    saving ``checkpoint`` (e.g. ``model_iteration1.torch``): the later checkpoints (files or
    sharded folders) removed and checkpoint.torch pointing to it."""
    shutil.copytree(run_dir, folder, symlinks=True)
    for path in folder.glob("model_*"):
        if not path.name.startswith(checkpoint):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (folder / "checkpoint.torch").unlink()
    (folder / "checkpoint.torch").symlink_to(checkpoint)
    return folder


def assert_trains_like_one_process(checkpoint_dir: Path, losses: Dict[int, float],
                                   weights: Dict[str, torch.Tensor]) -> None:
    """A two-process run's step losses and final weights against one process's (``losses``,
    ``weights``) on the same global batch: the losses to 1e-4 (the gradients of the first
    update were the same), the weights after the later updates to 1e-3 (batch statistics of a
    few samples amplify the rounding differences of the two summation orders, ~2e-4 measured
    with BYOL)."""
    two = step_losses(checkpoint_dir)
    for iteration in losses:
        assert two[iteration] == pytest.approx(losses[iteration], rel=1e-4, abs=1e-5)
    two_weights = final_weights(checkpoint_dir)
    for name in weights:
        torch.testing.assert_close(two_weights[name], weights[name], rtol=1e-3, atol=1e-3,
                                   msg=name)


def metrics(checkpoint_dir: Path) -> List[dict]:
    lines = (Path(checkpoint_dir) / "metrics.json").read_text().splitlines()
    return [json.loads(line) for line in lines]


def step_losses(checkpoint_dir: Path) -> Dict[int, float]:
    return {m["iteration"]: m["loss"] for m in metrics(checkpoint_dir)
            if m.get("phase") == "train"}


@contextlib.contextmanager
def small_tmpfs(folder: Path, size: str = "2m"):
    """A real file system of ``size`` on ``folder`` (a tmpfs: mounting needs root), unmounted
    afterwards; the test is skipped where it cannot be mounted."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def assert_checkpointing_keeps_gradients(make_model, inputs) -> None:
    """``make_model(checkpointed)`` built without, then with, activation checkpointing and run
    on each of ``inputs`` (e.g. multi-crop resolutions) before one backward: the same
    gradients."""
    grads = []
    for checkpointed in (False, True):
        model = make_model(checkpointed)
        loss = sum((out ** 2).sum() for x in inputs for out in model(x))
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def extract_with_weights(tmp_path: Path, model, overrides: Sequence[str], config: str,
                         out_name: str) -> Path:
    """Run an extraction engine in-process from ``model``'s weights (saved as a checkpoint in
    ``tmp_path``); returns its output folder ``tmp_path / out_name`` (log in ``tmp_path/ckpt``)."""
    weights = tmp_path / "weights.torch"
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, weights)
    out = tmp_path / out_name
    run_engine(tmp_path / "ckpt", [*overrides, f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}",
                                   f"config.EXTRACT_FEATURES.OUTPUT_DIR={out}"], config=config)
    return out


def assert_model_settings_refused(base, engine_name: str, cases) -> None:
    """Each ``(MODEL key, value, message)`` set on a copy of ``base`` is refused before launch
    with ``message``."""
    for key, value, message in cases:
        cfg = copy.deepcopy(base)
        section, name = key.rsplit(".", 1)
        cfg.MODEL[section][name] = value
        with pytest.raises(ValueError, match=message):
            check_before_launch(engine_name, cfg)
