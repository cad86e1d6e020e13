"""Hooks turned on by HOOKS.* keys: CHECK_NAN, PERF_STATS, MODEL_COMPLEXITY, EXTRA_HOOKS."""
import json
from types import SimpleNamespace

import pytest
import torch

from engine_utils import run_engine
from ssl_engine.config import ConfigError, load_config
from ssl_engine.hooks import (
    ModelComplexityHook,
    PerfStatsHook,
    SSLHook,
    default_hook_generator,
    register_hook,
)
from ssl_engine.hooks.perf_hooks import model_complexity
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
    assert not any(isinstance(h, (PerfStatsHook, ModelComplexityHook, EventRecorder))
                   for h in plain)
    hooks = default_hook_generator(quick_cfg(
        "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=true",
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


def test_perf_stats_split_the_step_into_its_parts(monkeypatch):
    clock = iter([0.0, 0.010, 0.013, 0.033, 0.034, 0.035] + [0.035 + 0.05 * i for i in range(1, 6)])
    monkeypatch.setattr("ssl_engine.hooks.perf_hooks.time.perf_counter", lambda: next(clock))
    hook, task = PerfStatsHook(), SimpleNamespace(train=True)
    hook.on_phase_start(task)
    for event in ("on_forward", "on_loss_and_meter", "on_backward", "on_update", "on_step"):
        getattr(hook, event)(task)
    assert hook.mean_ms() == pytest.approx({"data_and_forward": 10.0, "loss_and_meters": 3.0,
                                            "backward": 20.0, "update": 1.0, "step_end": 1.0})
    assert list(hook.batch_times) == pytest.approx([0.035])


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
                          "config.HOOKS.MODEL_COMPLEXITY.INPUT_SHAPE=[3,16,16]",
                          "config.HOOKS.PERF_STATS.MONITOR_PERF_STATS=true"])
    seen = EventRecorder.instances[-1].seen
    assert seen[0] == "on_start" and seen[-1] == "on_end" and "on_step" in seen
    records = [json.loads(line) for line in (tmp_path / "metrics.json").read_text().splitlines()]
    complexity = [r for r in records if "model_complexity" in r]
    assert len(complexity) == 1 and complexity[0]["model_complexity"]["flops"] > 0
    assert complexity[0]["model_complexity"]["params"] > 0
    assert "perf stats of the phase" in (tmp_path / "log.txt").read_text()
