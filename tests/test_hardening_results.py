"""Settings that used to end with exit code 0 and a wrong result, refused before launch in one
line (or fixed): DROP_LAST with less than one batch, heads extracted from a file that lacks
some of their tensors, negative learning rates, a stage pooled twice under one name; and a
broken metrics.json read by tools/compare_runs.py, whose skipped lines are named."""
import logging
import sys
from pathlib import Path

import pytest
import torch

from engine_utils import QUICK, TINY_TEST_SPLIT
from ssl_engine.config import load_config
from ssl_engine.engines.launcher import main
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.models import build_model
from ssl_engine.report import read_run_folder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import compare_runs  # noqa: E402


def _refusal(capsys, folder, *args) -> str:
    """The one stderr line of the launcher's refusal (exit code 2); nothing written."""
    code = main([QUICK, f"config.CHECKPOINT.DIR={folder}", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert not Path(folder).exists() or not any(Path(folder).iterdir())
    return lines[0]


def _checked(tmp_path, *args, engine="train"):
    """check_before_launch of the quick config with ``args`` (raises what it refuses)."""
    engine_name, cfg = load_config([QUICK, f"config.CHECKPOINT.DIR={tmp_path / 'run'}", *args])
    check_before_launch(engine_name, cfg)


# ---- DROP_LAST with less than one batch ------------------------------------------------------


def test_drop_last_with_fewer_images_than_one_batch_is_refused(tmp_path, capsys):
    line = _refusal(capsys, tmp_path / "run", "config.DATA.TRAIN.DROP_LAST=true",
                    "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=6")
    assert line == (
        "error: config.DATA.TRAIN.DROP_LAST=true with 6 sample(s) and "
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8 x 1 process(es) = 8 per batch: every batch "
        "is incomplete and dropped, so the phase would run no iteration. Set "
        "config.DATA.TRAIN.DROP_LAST=false or a BATCHSIZE_PER_REPLICA of at most 6")


def test_drop_last_counts_every_process_and_the_data_limit(tmp_path, capsys):
    line = _refusal(capsys, tmp_path / "run", "config.DATA.TRAIN.DROP_LAST=true",
                    "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
                    "config.DATA.NUM_DATALOADER_WORKERS=auto",
                    "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=12")  # 6 each of 2 processes
    assert "with 12 sample(s) and config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8 x 2 process(es) = " \
           "16 per batch" in line and line.endswith("a BATCHSIZE_PER_REPLICA of at most 6")
    line = _refusal(capsys, tmp_path / "run", "config.DATA.TRAIN.DROP_LAST=true",
                    "config.DATA.TRAIN.DATA_LIMIT=5")  # of the 32 samples
    assert "DROP_LAST=true with 5 sample(s)" in line


def test_drop_last_with_one_full_batch_or_without_drop_last_is_accepted(tmp_path):
    _checked(tmp_path, "config.DATA.TRAIN.DROP_LAST=true", "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=8")
    _checked(tmp_path, "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=6")


# ---- heads extracted from a file that lacks some of them -------------------------------------

EXTRACT_HEADS = ["engine_name=extract_features", *TINY_TEST_SPLIT]


def _weights_of(config: str, path: Path) -> Path:
    """The weights of ``config``'s model (seed 0), saved as a checkpoint of this engine."""
    _, cfg = load_config([config])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL)
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, path)
    return path


def test_heads_extracted_from_another_methods_file_are_refused(tmp_path, capsys):
    byol = _weights_of("config=test/quick_byol_synthetic", tmp_path / "byol.torch")
    line = _refusal(capsys, tmp_path / "run", *EXTRACT_HEADS,
                    f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={byol}")
    assert line == (
        f"error: config.MODEL.WEIGHTS_INIT.PARAMS_FILE={byol} lacks 2 head tensor(s) of the "
        "model (heads.0.clf.2.weight, heads.0.clf.2.bias): the extracted features would come "
        "out of partly random heads. Give config.MODEL.HEAD.PARAMS the heads the file was "
        "trained with, extract the trunk's features "
        "(config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true), or keep those "
        "layers at their initial values with "
        "config.MODEL.WEIGHTS_INIT.SKIP_LAYERS=[num_batches_tracked, heads.0.clf.2]")


def test_heads_left_at_initial_values_on_request_or_a_fitting_file_are_accepted(tmp_path):
    byol = _weights_of("config=test/quick_byol_synthetic", tmp_path / "byol.torch")
    _checked(tmp_path, *EXTRACT_HEADS, f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={byol}",
             "config.MODEL.WEIGHTS_INIT.SKIP_LAYERS=[num_batches_tracked,heads.0.clf.2]")
    _checked(tmp_path, *EXTRACT_HEADS, f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={byol}",
             "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true")
    simclr = _weights_of(QUICK, tmp_path / "simclr.torch")
    _checked(tmp_path, *EXTRACT_HEADS, f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={simclr}")


# ---- negative learning rates -----------------------------------------------------------------

LR = "config.OPTIMIZER.param_schedulers.lr"


@pytest.mark.parametrize("overrides, named, gives", [
    ([f"{LR}.start_value=-0.1"], f"{LR}.start_value=-0.1", " (the schedule gives -0.1 at 0% of "
                                                          "training)"),
    ([f"{LR}.end_value=-0.001"], f"{LR}.end_value=-0.001", " (the schedule gives -0.001 at "
                                                          "100% of training)"),
    ([f"{LR}.auto_lr_scaling.base_value=-0.1"], f"{LR}.auto_lr_scaling.base_value=-0.1", ""),
    ([f"{LR}.name=multistep", f"{LR}.values=[0.1,-0.01]", f"{LR}.milestones=[1]"],
     f"{LR}.values=[0.1, -0.01]", " (the schedule gives -0.01 at 50% of training)"),
    ([f"{LR}.name=composite", f"{LR}.lengths=[0.5,0.5]",
      f"{LR}.schedulers=[{{name:constant,value:0.1}},{{name:linear,start_value:0.1,"
      f"end_value:-0.2}}]"],
     f"{LR}.schedulers[1].end_value=-0.2", " (the schedule gives -0.2 at 100% of training)"),
])
def test_a_negative_learning_rate_is_refused(tmp_path, capsys, overrides, named, gives):
    line = _refusal(capsys, tmp_path / "run", *overrides)
    assert line == (f"error: {named}: a negative learning rate{gives} steps up the gradient, "
                    "so the loss climbs; give learning rates of 0 or more")


def test_restarts_whose_peaks_turn_negative_are_refused(tmp_path):
    restarts = [f"{LR}.name=cosine_warm_restart", f"{LR}.start_value=0.1", f"{LR}.end_value=0.0",
                f"{LR}.restart_interval_length=0.5", f"{LR}.wave_type=half"]
    with pytest.raises(ValueError, match=rf"^{LR}.lr_multiplier=-1.0: a negative learning "
                                         r"rate \(the schedule gives -0.1 at 50% of training\)"):
        _checked(tmp_path, *restarts, f"{LR}.lr_multiplier=-1.0")  # peaks 0.1, then -0.1
    _checked(tmp_path, *restarts, f"{LR}.lr_multiplier=0.5")


def test_learning_rates_ending_at_zero_are_accepted(tmp_path):
    _checked(tmp_path, f"{LR}.end_value=0.0")


# ---- one stage pooled twice under one name ---------------------------------------------------

TRUNK_STAGES = [
    "engine_name=extract_features", *TINY_TEST_SPLIT,
    "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=true",
    "config.MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_AND_HEAD=true",
    "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true",
]


def test_a_stage_listed_twice_for_features_named_by_stage_is_refused(tmp_path, capsys):
    line = _refusal(capsys, tmp_path / "run", *TRUNK_STAGES,
                    "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP="
                    "[[res4,[AdaptiveAvgPool2d,[[2,2]]]],[res5,[AdaptiveAvgPool2d,[[1,1]]]],"
                    "[res4,[AdaptiveMaxPool2d,[[1,1]]]]]")
    assert line == (
        "error: config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP lists res4 2 "
        "times ([0] AdaptiveAvgPool2d(output_size=(2, 2)), [2] AdaptiveMaxPool2d(output_size=(1, "
        "1))): with config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true the "
        "features are named by stage, so only the last would be kept. List each stage once, or "
        "set EXTRACT_TRUNK_FEATURES_ONLY=false with one head per entry")


def test_stages_listed_once_are_accepted(tmp_path):
    _checked(tmp_path, *TRUNK_STAGES,
             "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP="
             "[[res4,[AdaptiveAvgPool2d,[[2,2]]]],[res5,[AdaptiveAvgPool2d,[[1,1]]]]]")


# ---- a broken metrics.json -------------------------------------------------------------------


def test_lines_of_a_broken_metrics_json_that_are_skipped_are_named(tmp_path, capsys, caplog):
    run = tmp_path / "run"
    run.mkdir()
    rows = [f'{{"iteration": {i}, "phase": "train", "loss": {1.0 / i}}}' for i in range(1, 6)]
    rows[1] = rows[1][:12]  # broken mid-file, e.g. by a crash of the file system
    rows[3] = "[1, 2]"  # a JSON value that is no row
    (run / "metrics.json").write_text("\n".join(rows) + '\n{"iteration": 6, "lo')
    with caplog.at_level(logging.WARNING):
        assert [row["iteration"] for row in read_run_folder(run).rows] == [1, 3, 5]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"{run / 'metrics.json'}: skipped 2 line(s) that are not JSON objects (line 2, 4); the "
        "steps they held are left out"]  # the half-written last line of a run is not named
    caplog.clear()
    assert compare_runs.main([str(run), "--out", str(tmp_path / "runs.png")]) == 0
    assert sum("skipped 2 line(s)" in r.getMessage() for r in caplog.records) == 1


def test_an_intact_metrics_json_warns_nothing(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.json").write_text('{"iteration": 1}\n{"iteration": 2}\n')
    with caplog.at_level(logging.WARNING):
        assert len(read_run_folder(run).rows) == 2
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
