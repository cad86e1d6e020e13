"""HOOKS.EMA_MODEL: the average of the weights follows its formula, is refused where it cannot
run, gives the test meters of the average, and is usable as MODEL.WEIGHTS_INIT."""
from types import SimpleNamespace

import pytest
import torch

from engine_utils import metrics, run_engine
from ssl_engine.checkpoint import load_checkpoint, load_weights_init
from ssl_engine.config import ConfigError, load_config
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.hooks.ema_model_hook import EmaModelHook
from ssl_engine.models import build_model
from ssl_engine.models.ema import ModelEMA

EMA = "config.HOOKS.EMA_MODEL"


def test_average_follows_the_formula_with_warmup_and_update_iter():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    ema = ModelEMA(model, decay=0.7, device=torch.device("cpu"))
    hook = EmaModelHook(update_iter=3, warmup=0.3)
    total = 12
    task = SimpleNamespace(base_model=model, ema_model=ema, iteration=0, where=0.0)
    expected = {name: value.clone() for name, value in model.state_dict().items()}
    for k in range(total):
        with torch.no_grad():  # new weights and batch-norm statistics, as a step would give
            for value in model.state_dict().values():
                value.add_(torch.randn_like(value.float()).to(value.dtype) if
                           value.is_floating_point() else 1)
        task.iteration, task.where = k, k / total
        hook.on_update(task)
        if k % 3 == 0:  # updates 0, 3 (copies: k/K < 0.3), 6 and 9 (averages)
            for name, value in model.state_dict().items():
                if k / total < 0.3 or not value.is_floating_point():
                    expected[name] = value.clone()
                else:
                    expected[name] = 0.7 * expected[name] + 0.3 * value
    got = ema.module.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7)
    assert not torch.equal(got["0.weight"], model.state_dict()["0.weight"])
    assert not any(param.requires_grad for param in ema.module.parameters())


@pytest.mark.parametrize("overrides, message", [
    ([f"{EMA}.SAVE_EMA_MODEL=true"],  # EMA_DEVICE's default is gpu
     "config.HOOKS.EMA_MODEL.EMA_DEVICE=gpu needs config.MACHINE.DEVICE=gpu"),
    ([f"{EMA}.SAVE_EMA_MODEL=true", f"{EMA}.EMA_DEVICE=cpu", f"{EMA}.UPDATE_ITER=0"],
     "config.HOOKS.EMA_MODEL.UPDATE_ITER must be an integer >= 1"),
    ([f"{EMA}.SAVE_EMA_MODEL=true", f"{EMA}.EMA_DEVICE=cpu", f"{EMA}.DECAY=1.5"],
     r"config.HOOKS.EMA_MODEL.DECAY must be in \[0, 1\]"),
    ([f"{EMA}.ENABLE_EMA_METERS=true", f"{EMA}.EMA_DEVICE=cpu"],
     "ENABLE_EMA_METERS=true .* needs config.TEST_MODEL=true"),
    ([f"{EMA}.SAVE_EMA_MODEL=true", f"{EMA}.EMA_DEVICE=cpu",
      "config.TRAINER.TASK_NAME=self_supervision_fsdp_task"],
     "self_supervision_fsdp_task with config.HOOKS.EMA_MODEL"),
])
def test_impossible_settings_are_refused_before_launch(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        engine_name, cfg = load_config(["config=test/quick_simclr_synthetic",
                                        f"config.CHECKPOINT.DIR={tmp_path}", *overrides])
        check_before_launch(engine_name, cfg)


def test_test_meters_of_the_average_and_its_weights_as_weights_init(tmp_path):
    cfg = run_engine(tmp_path, [
        "config.OPTIMIZER.num_epochs=1", "config.DATA.TRAIN.DATA_LIMIT=64",
        "config.DATA.TEST.DATA_LIMIT=64",
        f"{EMA}.SAVE_EMA_MODEL=true", f"{EMA}.ENABLE_EMA_METERS=true", f"{EMA}.DECAY=0.5",
        f"{EMA}.WARMUP=0.0", f"{EMA}.EMA_DEVICE=cpu"], config="config=supervised/digits_resnet")
    records = metrics(tmp_path)
    test_ends = [r for r in records if r.get("phase_end") == "test"]
    ema_ends = [r for r in records if r.get("ema_phase_end") == "test"]
    assert [r["phase_idx"] for r in ema_ends] == [r["phase_idx"] for r in test_ends] == [1]
    for plain, ema in zip(test_ends, ema_ends):
        assert set(ema["meters_ema"]) == set(plain["meters"]) == {"accuracy_list_meter"}
        assert 0.0 <= ema["meters_ema"]["accuracy_list_meter"]["top_1"]["0"] <= 100.0

    state = load_checkpoint(tmp_path / "checkpoint.torch")["classy_state_dict"]
    average, weights = state["ema_model"]["model"], state["base_model"]["model"]
    assert not torch.equal(average["trunk"]["conv1.weight"], weights["trunk"]["conv1.weight"])
    model = build_model(cfg.MODEL)
    load_weights_init(model, {"PARAMS_FILE": str(tmp_path / "checkpoint.torch"),
                              "STATE_DICT_KEY_NAME": "classy_state_dict.ema_model",
                              "SKIP_LAYERS": []})
    for part in ("trunk", "heads"):
        for name, value in getattr(model, part).state_dict().items():
            assert torch.equal(value, average[part][name]), f"{part}.{name}"
