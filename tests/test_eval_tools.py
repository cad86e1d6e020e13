"""tools/nearest_neighbor_test.py and tools/low_shot_test.py end to end on a tiny config."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import torch

from ssl_engine.extraction.files import extracted_paths, load_extracted
from ssl_engine.evaluation.knn import knn_classify
from ssl_engine.evaluation.low_shot import low_shot_eval
from test_extract_features import CONFIG, TINY

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def load_tool(name):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def records(folder, key):
    lines = (folder / "metrics.json").read_text().splitlines()
    return [json.loads(line)[key] for line in lines if key in json.loads(line)]


def mtimes(folder):
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.suffix == ".npy"}


def test_knn_tool_extracts_once_then_reuses_and_low_shot_tool_shares_the_files(tmp_path, capsys):
    argv = [CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}", "config.NEAREST_NEIGHBOR.TOPK=5"]
    knn_tool = load_tool("nearest_neighbor_test")
    assert knn_tool.main(argv) == 0
    first = mtimes(tmp_path)
    assert len(first) == 12  # {train,test} x {res4,res5avg} x {features,targets,inds}
    assert "top-1" in capsys.readouterr().out

    assert knn_tool.main(argv) == 0  # second run: the files are reused as they are
    assert mtimes(tmp_path) == first
    out = capsys.readouterr().out
    assert "reusing the extracted features of layer res5avg" in out

    train, test = (load_extracted(tmp_path, split, "res5avg") for split in ("train", "test"))
    expected = knn_classify(train.features, train.targets, test.features, test.targets,
                            topk=5, sigma=0.07, chunk_size=1024)
    runs = records(tmp_path, "knn")
    assert len(runs) == 2 and runs[0] == runs[1]
    assert runs[0] == {"layer": "res5avg", "topk": 5, "sigma": 0.07, **expected}
    assert f"top-1 {expected['top1']:.2f}%  top-5 {expected['top5']:.2f}%" in out

    # a missing split is extracted again, the other reused; the low-shot tool reads the same files
    for path in extracted_paths(tmp_path, "test", "res5avg").values():
        path.unlink()
    low_shot_tool = load_tool("low_shot_test")
    low_shot_argv = argv + ["config.LOW_SHOT.SHOTS=[1,2]", "config.LOW_SHOT.SEEDS=[0,1]"]
    assert low_shot_tool.main(low_shot_argv) == 0
    now = mtimes(tmp_path)
    assert {k: v for k, v in now.items() if k.startswith("train_")} == \
        {k: v for k, v in first.items() if k.startswith("train_")}
    assert now["test_res5avg_features.npy"] != first["test_res5avg_features.npy"]
    test = load_extracted(tmp_path, "test", "res5avg")
    expected = low_shot_eval(train.features, train.targets, test.features, test.targets,
                             shots=(1, 2), seeds=(0, 1), k=1)
    (record,) = records(tmp_path, "low_shot")
    assert record["layer"] == "res5avg" and record["k"] == 1
    assert record["shots"] == {str(shot): stats for shot, stats in expected.items()}
    out = capsys.readouterr().out
    for shot, stats in expected.items():
        assert f"{shot:>4}-shot top-1 {stats['mean']:.2f} ± {stats['std']:.2f} %" in out


def test_tool_reports_a_layer_the_config_does_not_extract(tmp_path, capsys):
    argv = [CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}",
            "config.NEAREST_NEIGHBOR.FEATURES_LAYER=res3"]
    assert load_tool("nearest_neighbor_test").main(argv) == 2
    err = capsys.readouterr().err
    assert "layer 'res3' is not extracted by this config; its layers are: res4, res5avg" in err
    assert not any(p.suffix == ".npy" for p in tmp_path.iterdir())


def test_features_of_other_weights_are_not_reused(tmp_path):
    """Features extracted from one checkpoint are re-extracted when another is asked for."""
    from ssl_engine.config import load_config
    from ssl_engine.engines.evaluate_extracted import get_or_extract
    from ssl_engine.extraction.files import has_extracted
    from ssl_engine.models import build_model

    weights = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        _, cfg = load_config([CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}"])
        path = tmp_path / f"weights{seed}.torch"
        torch.save(build_model(cfg.MODEL).state_dict(), path)
        weights.append(path)

    def config_for(path):
        _, cfg = load_config([CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}",
                              f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={path}",
                              "config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME=''"])
        return cfg

    first = get_or_extract(config_for(weights[0]), "res5avg")
    assert has_extracted(tmp_path, "train", "res5avg", config_for(weights[0]))
    assert not has_extracted(tmp_path, "train", "res5avg", config_for(weights[1]))
    second = get_or_extract(config_for(weights[1]), "res5avg")
    assert not np.array_equal(first["TRAIN"].features, second["TRAIN"].features)
    np.testing.assert_array_equal(first["TRAIN"].inds, second["TRAIN"].inds)


def test_low_shot_tool_runs_vissls_logistic_regression_on_a_limited_train_split(tmp_path, capsys):
    """DATA.TRAIN.DATA_LIMIT > 0: per seed a balanced draw of the train split extracted into
    seed<k>/, the logistic regression of each lambda on it, mean and std over the seeds."""
    from ssl_engine.evaluation.low_shot import logistic_regression_eval

    argv = [CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}",
            "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true",
            "config.DATA.TRAIN.DATA_LIMIT=8",
            "config.DATA.TRAIN.DATA_LIMIT_SAMPLING.IS_BALANCED=true",
            "config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.SEEDS=[0,1]",
            "config.LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.LAMBDA=[0.1,10.0]"]
    assert load_tool("low_shot_test").main(argv) == 0
    out = capsys.readouterr().out
    (record,) = records(tmp_path, "low_shot_benchmark")
    assert record["seeds"] == [0, 1] and record["data_limit"] == 8
    assert sorted(record["layers"]) == ["res4", "res5avg"]
    draws = []
    for layer, summary in record["layers"].items():
        top1 = []
        for seed, run in zip((0, 1), summary["runs"]):
            train, test = (load_extracted(tmp_path / f"seed{seed}", split, layer)
                           for split in ("train", "test"))
            assert len(train.targets) == 8 and np.bincount(train.targets).tolist() == [2] * 4
            assert len(test.targets) == 21
            draws.append(train.features)
            expected = logistic_regression_eval(train.features, train.targets, test.features,
                                                test.targets, [0.1, 10.0])
            assert run == expected
            top1.append(expected["top1"])
        assert summary["per_seed"] == top1
        assert summary["mean"] == np.mean(top1) and summary["std"] == np.std(top1)
        assert f"({layer}, 2 seeds): top-1 {np.mean(top1):.2f} ± {np.std(top1):.2f} %" in out
    assert not np.array_equal(draws[0], draws[1])  # each seed draws its own train images
