"""Learning-rate schedules from cfg.OPTIMIZER against hand formulas, and auto lr scaling."""
import copy
import logging
import math
from pathlib import Path

import pytest
import yaml

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.optimizers import apply_auto_lr_scaling, build_lr_scheduler
from ssl_engine.utils.registry import UnknownNameError

DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "config" / "defaults.yaml"


def optimizer_cfg(num_epochs=90, **lr_settings) -> AttrDict:
    """cfg.OPTIMIZER from defaults.yaml with the lr schedule settings replaced."""
    cfg = AttrDict(yaml.safe_load(DEFAULTS.read_text())["config"]["OPTIMIZER"])
    cfg.num_epochs = num_epochs
    for key, value in lr_settings.items():
        cfg.param_schedulers.lr[key] = value  # AttrDict wraps nested dicts on item assignment
    return cfg


def cosine(start, end, where):
    return end + (start - end) * (1 + math.cos(math.pi * where)) / 2


@pytest.mark.parametrize("where", [0.0, 0.13, 0.5, 0.77, 0.999])
def test_cosine_and_linear_per_step(where):
    cos = build_lr_scheduler(optimizer_cfg(name="cosine", update_interval="step", start_value=0.8, end_value=0.01))
    lin = build_lr_scheduler(optimizer_cfg(name="linear", update_interval="step", start_value=0.1, end_value=0.5))
    assert cos(where) == pytest.approx(cosine(0.8, 0.01, where), rel=1e-12)
    assert lin(where) == pytest.approx(0.1 + (0.5 - 0.1) * where, rel=1e-12)


def test_multistep_changes_exactly_at_milestones():
    schedule = build_lr_scheduler(
        optimizer_cfg(name="multistep", update_interval="step", values=[0.1, 0.01, 0.001], milestones=[30, 60])
    )
    assert schedule(29.99 / 90) == 0.1
    assert schedule(30 / 90) == 0.01
    assert schedule(59.99 / 90) == 0.01
    assert schedule(60 / 90) == 0.001
    assert schedule(0.9999) == 0.001


def test_multistep_num_epochs_of_its_own():
    schedule = build_lr_scheduler(
        optimizer_cfg(name="multistep", values=[1.0, 0.5], milestones=[5], num_epochs=10, update_interval="step")
    )
    assert (schedule(0.49), schedule(0.5)) == (1.0, 0.5)


def test_step_and_constant():
    step = build_lr_scheduler(optimizer_cfg(num_epochs=9, name="step", values=[1.0, 0.5, 0.25]))
    assert [step(w) for w in (0.0, 0.3, 1 / 3, 0.6, 2 / 3, 0.99)] == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    constant = build_lr_scheduler(optimizer_cfg(name="constant", value=0.3))
    assert constant(0.0) == constant(0.7) == 0.3


WARMUP_THEN_COSINE = {
    "name": "composite",
    "update_interval": "step",
    "schedulers": [
        {"name": "linear", "start_value": 0.0, "end_value": 0.4},
        {"name": "cosine", "start_value": 0.4, "end_value": 0.0},
    ],
    "lengths": [0.1, 0.9],
    "interval_scaling": ["rescaled", "rescaled"],
}


@pytest.mark.parametrize("where", [0.0, 0.03, 0.05, 0.0999, 0.1, 0.3, 0.55, 0.9])
def test_composite_warmup_then_cosine(where):
    schedule = build_lr_scheduler(optimizer_cfg(**copy.deepcopy(WARMUP_THEN_COSINE)))
    if where < 0.1:
        expected = 0.4 * where / 0.1
    else:
        expected = cosine(0.4, 0.0, (where - 0.1) / 0.9)
    assert schedule(where) == pytest.approx(expected, abs=1e-5)


def test_composite_fixed_interval_and_default_scaling():
    settings = copy.deepcopy(WARMUP_THEN_COSINE)
    settings["interval_scaling"] = ["rescaled", "fixed"]
    fixed = build_lr_scheduler(optimizer_cfg(**settings))
    assert fixed(0.55) == pytest.approx(cosine(0.4, 0.0, 0.55), rel=1e-12)
    settings["interval_scaling"] = []  # the default: all rescaled
    rescaled = build_lr_scheduler(optimizer_cfg(**settings))
    assert rescaled(0.55) == pytest.approx(cosine(0.4, 0.0, 0.5), rel=1e-12)


def test_epoch_interval_holds_the_value_of_the_epoch_start():
    schedule = build_lr_scheduler(
        optimizer_cfg(num_epochs=10, name="cosine", update_interval="epoch", start_value=1.0, end_value=0.0)
    )
    assert schedule(0.37) == pytest.approx(cosine(1.0, 0.0, 0.3), rel=1e-12)
    assert schedule(0.3999) == pytest.approx(cosine(1.0, 0.0, 0.3), rel=1e-12)
    assert schedule(0.4) == pytest.approx(cosine(1.0, 0.0, 0.4), rel=1e-12)
    # 0.57 * 100 is 56.99999999999999 in floating point: still the start of epoch 57
    hundred = build_lr_scheduler(
        optimizer_cfg(num_epochs=100, name="linear", update_interval="epoch", start_value=0.0, end_value=1.0)
    )
    assert hundred(0.57) == pytest.approx(0.57, rel=1e-12)


def test_bad_schedules_are_refused():
    with pytest.raises(UnknownNameError, match="did you mean 'cosine'"):
        build_lr_scheduler(optimizer_cfg(name="cosin"))
    with pytest.raises(ValueError, match="'linear' needs the key 'start_value'"):
        build_lr_scheduler(optimizer_cfg(name="linear", start_value=None))
    with pytest.raises(ValueError, match="update_interval must be step or epoch, got 'batch'"):
        build_lr_scheduler(optimizer_cfg(name="constant", update_interval="batch"))
    with pytest.raises(ValueError, match="interval_scaling \\(1\\) must have the same length"):
        build_lr_scheduler(optimizer_cfg(**dict(WARMUP_THEN_COSINE, interval_scaling=["fixed"])))


def test_auto_lr_scaling_is_linear_in_the_global_batch(caplog):
    cfg = optimizer_cfg(**copy.deepcopy(WARMUP_THEN_COSINE), values=[0.1, 0.01], value=0.3)
    cfg.param_schedulers.lr.auto_lr_scaling.update({"auto_scale": True, "base_lr_batch_size": 256})
    with caplog.at_level(logging.INFO):
        scaled = apply_auto_lr_scaling(cfg, global_batch_size=1024)
    lr = scaled.param_schedulers.lr
    assert lr.value == pytest.approx(1.2) and lr["values"] == pytest.approx([0.4, 0.04])  # .values is dict.values
    assert lr.schedulers[0].end_value == pytest.approx(1.6)
    assert lr.schedulers[1].start_value == pytest.approx(1.6)
    assert build_lr_scheduler(scaled)(0.05) == pytest.approx(0.8)
    assert "factor 4" in caplog.text and "schedulers[0].end_value 0.4 -> 1.6" in caplog.text
    # the input is untouched and the result is marked as scaled: scaling it again is a no-op
    assert cfg.param_schedulers.lr.schedulers[0].end_value == 0.4
    assert apply_auto_lr_scaling(scaled, 1024) == scaled


def test_auto_lr_scaling_off_returns_an_equal_copy():
    cfg = optimizer_cfg(name="cosine")
    scaled = apply_auto_lr_scaling(cfg, global_batch_size=4096)
    assert scaled == cfg and scaled is not cfg


def warm_restart_expected(where, start, end, length, wave, multiplier=1.0, adaptive=False):
    """cosine_warm_restart written out per wave: the restart that ``where`` falls in, its peak,
    and the position inside the wave."""
    if wave == "half":
        k = math.floor(where / length)          # restarts at 0, L, 2L, ...
        restart_at, position = k * length, (where - k * length) / length
        adaptive_at = restart_at
    else:
        # restarts at 0, L, 3L, 5L, ...
        k = 0 if where < length else 1 + math.floor((where - length) / (2 * length))
        restart_at = 0.0 if k == 0 else length * (2 * k - 1)
        position = where / length               # the full wave is never reset
        adaptive_at = restart_at + length
    peak = cosine(start, end, adaptive_at) if adaptive else start * multiplier ** k
    return end + (peak - end) * (1 + math.cos(math.pi * position)) / 2


@pytest.mark.parametrize("wave,length,multiplier,adaptive", [
    ("half", 0.5, 1.0, False), ("half", 0.5, 1.0, True), ("half", 0.25, 0.5, False),
    ("full", 0.334, 1.0, False), ("full", 0.334, 1.0, True), ("full", 0.2, 0.5, False),
])
def test_cosine_warm_restart_values(wave, length, multiplier, adaptive):
    settings = dict(name="cosine_warm_restart", update_interval="step", start_value=4.8,
                    end_value=0.0048, restart_interval_length=length, wave_type=wave,
                    is_adaptive=adaptive)
    if multiplier != 1.0:
        settings["lr_multiplier"] = multiplier
    schedule = build_lr_scheduler(optimizer_cfg(**settings))
    for where in (0.0, 0.1, 0.2499, 0.26, 0.3, 0.45, 0.55, 0.61, 0.7, 0.9, 0.999):
        expected = warm_restart_expected(where, 4.8, 0.0048, length, wave, multiplier, adaptive)
        assert schedule(where) == pytest.approx(expected, rel=1e-9), where


def test_cosine_warm_restart_shapes():
    half = build_lr_scheduler(optimizer_cfg(
        name="cosine_warm_restart", update_interval="step", start_value=1.0, end_value=0.0,
        restart_interval_length=0.5, wave_type="half", lr_multiplier=0.5))
    assert [half(w) for w in (0.0, 0.25, 0.5, 0.75)] == pytest.approx([1.0, 0.5, 0.5, 0.25])
    assert half(0.4999) == pytest.approx(0.0, abs=1e-6)
    full = build_lr_scheduler(optimizer_cfg(
        name="cosine_warm_restart", update_interval="step", start_value=1.0, end_value=0.0,
        restart_interval_length=0.25, wave_type="full", lr_multiplier=0.5))
    # down to 0 at 0.25, back up to the second peak (0.5) at 0.5, down to 0 at 0.75, up to 0.25
    assert [full(w) for w in (0.0, 0.25, 0.5, 0.75, 0.9999)] == pytest.approx(
        [1.0, 0.0, 0.5, 0.0, 0.25], abs=1e-6)


def test_cosine_warm_restart_after_a_warmup_and_scaled():
    """VISSL's bs64_8node_cos_1restart_half schedule: a linear warmup then the restarts."""
    settings = {
        "name": "composite", "update_interval": "step", "lengths": [0.1, 0.9],
        "interval_scaling": ["rescaled", "rescaled"],
        "schedulers": [
            {"name": "linear", "start_value": 0.6, "end_value": 4.8},
            {"name": "cosine_warm_restart", "start_value": 4.8, "end_value": 0.0048,
             "restart_interval_length": 0.5, "wave_type": "half"},
        ],
        "auto_lr_scaling": {"auto_scale": True, "base_lr_batch_size": 256},
    }
    schedule = build_lr_scheduler(apply_auto_lr_scaling(optimizer_cfg(**settings), 512))
    assert schedule(0.05) == pytest.approx(2 * (0.6 + 4.2 * 0.5))
    for where in (0.2, 0.5, 0.56, 0.8):
        expected = warm_restart_expected((where - 0.1) / 0.9, 9.6, 0.0096, 0.5, "half")
        assert schedule(where) == pytest.approx(expected, rel=1e-9)


def test_cosine_warm_restart_refusals():
    base = dict(name="cosine_warm_restart", start_value=1.0, end_value=0.0, wave_type="half",
                restart_interval_length=0.5)
    with pytest.raises(ValueError, match="needs the key 'restart_interval_length'"):
        build_lr_scheduler(optimizer_cfg(**dict(base, restart_interval_length=None)))
    with pytest.raises(ValueError, match="wave_type must be half or full, got 'quarter'"):
        build_lr_scheduler(optimizer_cfg(**dict(base, wave_type="quarter")))
    with pytest.raises(ValueError, match=r"restart_interval_length .* in \(0, 1\], got 1.5"):
        build_lr_scheduler(optimizer_cfg(**dict(base, restart_interval_length=1.5)))
    with pytest.raises(ValueError, match="lr_multiplier=0.5 would be ignored"):
        build_lr_scheduler(optimizer_cfg(**dict(base, is_adaptive=True, lr_multiplier=0.5)))
