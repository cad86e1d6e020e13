"""Hooks turned on by HOOKS.* keys: CHECK_NAN, PERF_STATS, MODEL_COMPLEXITY, EXTRA_HOOKS."""
import json
import os
from types import SimpleNamespace

import pytest
import torch

from engine_utils import run_engine
from ssl_engine.config import ConfigError, load_config
from ssl_engine.hooks import (ModelComplexityHook, PerfStatsHook, SSLHook, TensorboardHook,
                              register_hook)
from ssl_engine.hooks.perf_hooks import model_complexity
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.trainer.train_steps.standard_train_step import check_loss_is_finite


@register_hook("test_event_recorder")
class EventRecorder(SSLHook):
    """Counts the events it sees, so a test can check the trainer called it."""

    instances = []

    def __init__(self, cfg):
        self.seen = []
        self.checkpoint_dir = cfg.CHECKPOINT.DIR
        EventRecorder.instances.append(self)

    def on_start(self, task):
        self.seen.append("on_start")

    def on_step(self, task):
        self.seen.append("on_step")

    def on_end(self, task):
        self.seen.append("on_end")


def quick_cfg(*overrides):
    return load_config(["config=test/quick_simclr_synthetic", *overrides])[1]


def test_switches_add_their_hooks_and_unknown_extra_hook_is_refused():
    plain = default_hook_generator(quick_cfg())
    assert isinstance(plain[0], PerfStatsHook)  # on by default, first: it times the others
    assert not any(isinstance(h, (ModelComplexityHook, EventRecorder)) for h in plain)
    off = default_hook_generator(quick_cfg("config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=false"))
    assert not any(isinstance(h, PerfStatsHook) for h in off)
    hooks = default_hook_generator(quick_cfg(
        "config.HOOKS.MODEL_COMPLEXITY.COMPUTE_COMPLEXITY=true",
        "config.HOOKS.EXTRA_HOOKS=[test_event_recorder]"))
    kinds = [type(h) for h in hooks]
    assert PerfStatsHook in kinds and ModelComplexityHook in kinds
    assert kinds[-1] is EventRecorder
    with pytest.raises(ConfigError, match=r"HOOKS.EXTRA_HOOKS\[0\]: no hook is registered as "
                                          r"'no_such_hook'.*test_event_recorder"):
        default_hook_generator(quick_cfg("config.HOOKS.EXTRA_HOOKS=[no_such_hook]"))


def test_model_complexity_counts_conv_and_linear_multiply_adds():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 5))
    counted = model_complexity(model.train(), [3, 8, 8])
    conv = (6 * 6) * 4 * (3 * 3 * 3)  # output positions x output channels x kernel volume
    linear = 4 * 6 * 6 * 5
    assert counted == {"flops": conv + linear, "params": 4 * 27 + 144 * 5 + 5,
                       "trainable_params": 4 * 27 + 144 * 5 + 5}
    assert model.training  # put back in the mode it was in


def test_perf_stats_split_the_step_into_its_parts(monkeypatch, tmp_path):
    # a step of 100 ms: 4 ms data wait, 10 ms forward, 3 ms loss, 20 ms backward, 1 ms
    # update, 2 ms after it; the hooks took 60 ms: 50 in on_loss_and_meter, 10 in on_step
    marks = {"on_forward": (0.014, 0.0), "on_loss_and_meter": (0.067, 0.050),
             "on_backward": (0.087, 0.050), "on_update": (0.088, 0.050),
             "on_step": (0.100, 0.060)}
    clock = iter([0.0] + [at for at, _ in marks.values()])
    monkeypatch.setattr("ssl_engine.hooks.perf_hooks.time.perf_counter", lambda: next(clock))
    hook = PerfStatsHook(str(tmp_path))
    task = SimpleNamespace(train=True, hook_seconds=0.0, data_time=0.004, phase_type="train",
                           phase_idx=0)
    hook.on_phase_start(task)
    for event, (_, hook_seconds) in marks.items():
        task.hook_seconds = hook_seconds
        getattr(hook, event)(task)
    expected = {"data": 4.0, "forward": 10.0, "loss": 3.0, "backward": 20.0, "optimizer": 1.0,
                "other": 2.0, "hooks": 60.0, "total": 100.0}
    assert hook.mean_ms() == pytest.approx(expected)
    assert list(hook.batch_times) == pytest.approx([0.100])
    hook.on_phase_end(task)
    hook.on_end(task)
    records = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    assert [r["scope"] for r in records] == ["phase", "run"]
    assert records[1]["step_time_ms"] == pytest.approx(expected) and records[1]["iterations"] == 1


def test_check_nan_off_lets_a_nan_loss_through():
    task = SimpleNamespace(config=quick_cfg(), iteration=3, phase_idx=0,
                           iteration_num_in_phase=3)
    with pytest.raises(FloatingPointError, match="loss is nan at iteration 3"):
        check_loss_is_finite(task, torch.tensor(float("nan")))
    task.config = quick_cfg("config.HOOKS.CHECK_NAN=false")
    check_loss_is_finite(task, torch.tensor(float("nan")))


def test_a_run_calls_the_configured_hooks(tmp_path):
    EventRecorder.instances.clear()
    run_engine(tmp_path, ["config.HOOKS.EXTRA_HOOKS=[test_event_recorder]",
                          "config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.DATA_LIMIT=16",
                          "config.HOOKS.MODEL_COMPLEXITY.COMPUTE_COMPLEXITY=true",
                          "config.HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE=[3,16,16]"])
    seen = EventRecorder.instances[-1].seen
    assert seen[0] == "on_start" and seen[-1] == "on_end" and "on_step" in seen
    records = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    complexity = [r for r in records if "model_complexity" in r]
    assert len(complexity) == 1 and complexity[0]["model_complexity"]["flops"] > 0
    assert complexity[0]["model_complexity"]["params"] > 0
    # the step's breakdown, on by default: the run's means in the log and metrics.json
    (run,) = [r for r in records if r.get("scope") == "run"]
    parts = run["step_time_ms"]
    assert {"data", "forward", "loss", "backward", "optimizer", "hooks"} <= set(parts)
    assert parts["total"] == pytest.approx(sum(v for k, v in parts.items() if k != "total"))
    assert parts["backward"] > 0 and parts["forward"] > 0
    assert "step time (mean of this run's" in (tmp_path / "log.txt").read_text()


def test_an_empty_tensorboard_folder_writes_the_events_into_the_run_folder():
    """VISSL's files leave EXPERIMENT_LOG_DIR empty (null) in places: the events go to
    CHECKPOINT.DIR itself instead of the hook list failing to build."""
    cfg = quick_cfg("config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=true",
                    "config.HOOKS.TENSORBOARD_SETUP.EXPERIMENT_LOG_DIR=null")
    (board,) = [h for h in default_hook_generator(cfg) if isinstance(h, TensorboardHook)]
    assert os.path.normpath(board.log_dir) == os.path.normpath(cfg.CHECKPOINT.DIR)
