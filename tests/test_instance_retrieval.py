"""Instance retrieval (IMG_RETRIEVAL): the Revisited Oxford/Paris and Copydays scores against
hand computations, R-MAC regions and GeM against values worked out by hand, the ground-truth
pickle read safely, and tools/instance_retrieval_test.py on tiny datasets the test writes."""
import importlib.util
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ssl_engine.evaluation.retrieval import (Whitening, average_precision, describe,
                                             mean_average_precision, region_vectors,
                                             revisited_scores, rmac_regions)
from ssl_engine.evaluation.retrieval_data import copydays_scores, load_ground_truth

TOOL = Path(__file__).resolve().parents[1] / "tools/instance_retrieval_test.py"
CONFIG = "config=feature_extraction/extract_resnet_digits"


def test_average_precision_by_hand():
    # positives at positions 0 and 2 of 2: (1 + 1)/2 * 1/2 + (1/2 + 2/3)/2 * 1/2
    assert average_precision(np.array([0, 2]), 2) == pytest.approx(0.5 + 7 / 24)
    # one positive at position 3: (0 + 1/4)/2
    assert average_precision(np.array([3]), 1) == pytest.approx(0.125)


def test_revisited_protocol_easy_medium_hard_by_hand():
    # query 0 ranks the database as 1, 0, 3, 2, 4: easy 0, hard 2, junk 1
    # query 1 ranks it 2, 4, 0, 1, 3: easy 4, hard 3, no junk
    ranks = np.array([[1, 0, 3, 2, 4], [2, 4, 0, 1, 3]])
    gnd = [{"easy": [0], "hard": [2], "junk": [1], "bbx": None},
           {"easy": [4], "hard": [3], "junk": []}]
    scores = revisited_scores(ranks, gnd, ks=(1, 5))
    # easy: q0 without 1, 2 -> 0, 3, 4: AP 1; q1 without 3 -> 2, 4, 0, 1: 4 at 1: AP 1/4
    assert scores["easy"]["mAP"] == pytest.approx(100 * (1 + 0.25) / 2)
    # medium: q0 without 1 -> 0, 3, 2, 4: AP 0.5 + 7/24; q1: 4 at 1, 3 at 4:
    # (0 + 1/2)/2/2 + (1/4 + 2/5)/2/2
    q1 = 0.125 + (0.25 + 0.4) / 4
    assert scores["medium"]["mAP"] == pytest.approx(100 * (0.5 + 7 / 24 + q1) / 2, abs=1e-3)
    # hard: q0 without 1, 0 -> 3, 2, 4: 2 at 1: AP 1/4; q1 without 4 -> 2, 0, 1, 3: 3 at 3: 1/8
    assert scores["hard"]["mAP"] == pytest.approx(100 * (0.25 + 0.125) / 2)
    # P@k with the last positive at m (1-based): positives among the first min(k, m)
    # medium q0 at 1, 3: P@1 1, P@5 2/3; q1 at 2, 5: P@1 0, P@5 2/5
    assert scores["medium"]["mP@k"] == pytest.approx(
        {"1": 50.0, "5": round(100 * (2 / 3 + 2 / 5) / 2, 4)})
    # a query without positives is left out of the mean
    alone = mean_average_precision(ranks, [{"ok": [0]}, {"ok": []}])
    assert alone["queries"] == 1
    assert alone["mAP"] == pytest.approx(25.0)  # 0 at position 1: (0 + 1/2)/2


def test_copydays_scores_per_query_split_by_hand():
    database = [Path(n) for n in ("200000.jpg", "200100.jpg", "distractor_200000.jpg")]
    queries = [Path(n) for n in ("original_200000.jpg", "strong_200001.jpg",
                                 "strong_200105.jpg")]
    ranks = np.array([[0, 1, 2], [2, 0, 1], [2, 0, 1]])
    scores = copydays_scores(ranks, queries, database, ks=(1,))
    assert scores["original"]["mAP"] == 100.0
    # strong_200001: 200000 at 1 once the distractor (no match) is before it: AP 1/4;
    # strong_200105: 200100 at 2: (0 + 1/3)/2
    assert scores["strong"]["mAP"] == pytest.approx(100 * (0.25 + 1 / 6) / 2, abs=1e-3)


def test_rmac_regions_and_gem_by_hand():
    # a 3 x 3 map: level 1 the whole map, level 2 four 2 x 2 squares, level 3 nine pixels
    assert rmac_regions(3, 3, 3) == [(0, 0, 3), (0, 0, 2), (1, 0, 2), (0, 1, 2), (1, 1, 2)] + \
        [(x, y, 1) for y in range(3) for x in range(3)]
    fmap = torch.arange(9.0).reshape(1, 3, 3)
    maxima = region_vectors(fmap, "rmac", 3)[:, 0].tolist()
    assert maxima == [8, 4, 5, 7, 8] + list(range(9))
    # a 2 x 5 map: 3 extra regions along the longer side (overlap closest to 40%)
    assert rmac_regions(2, 5, 1) == [(0, 0, 2), (1, 0, 2), (2, 0, 2), (3, 0, 2)]
    values = torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(1, 2, 2)
    assert region_vectors(values, "gem", gem_power=2.0).item() == pytest.approx(7.5 ** 0.5)
    assert region_vectors(values, "gem", gem_power=1.0).item() == pytest.approx(2.5)
    with pytest.raises(ValueError, match="FEATS_PROCESSING_TYPE"):
        region_vectors(values, "mac")


def test_descriptor_is_whitened_regions_summed():
    rng = np.random.default_rng(0)
    train = rng.normal(size=(40, 6))
    whitening = Whitening(3).fit(train / np.linalg.norm(train, axis=1, keepdims=True))
    scale1, scale2 = rng.normal(size=(5, 6)), rng.normal(size=(2, 6))

    def plain(regions):
        regions = regions / np.linalg.norm(regions, axis=1, keepdims=True)
        projected = (regions - whitening.pca.mean_) @ whitening.pca.components_.T
        projected /= np.sqrt(whitening.pca.explained_variance_)
        projected /= np.linalg.norm(projected, axis=1, keepdims=True)
        total = projected.sum(0)
        return total / np.linalg.norm(total)

    expected = plain(scale1) + plain(scale2)
    expected /= np.linalg.norm(expected)
    np.testing.assert_allclose(describe([scale1, scale2], whitening), expected, atol=1e-5)
    with pytest.raises(ValueError, match="N_PCA=7"):
        Whitening(7).fit(train)


class _Shell:
    def __reduce__(self):
        return (os.system, ("true",))


def test_ground_truth_is_read_without_running_code(tmp_path):
    good = {"imlist": ["a", "b"], "qimlist": ["q"],
            "gnd": [{"easy": np.array([0]), "hard": [1], "junk": [], "bbx": [0.0, 0, 4, 4]}]}
    (tmp_path / "good.pkl").write_bytes(pickle.dumps(good))
    loaded = load_ground_truth(tmp_path / "good.pkl")
    assert loaded["gnd"][0]["easy"].tolist() == [0] and loaded["imlist"] == ["a", "b"]
    (tmp_path / "bad.pkl").write_bytes(pickle.dumps({"imlist": _Shell()}))
    with pytest.raises(ValueError, match="posix.system|os.system"):
        load_ground_truth(tmp_path / "bad.pkl")


def _image(path: Path, rng, size=(28, 20)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)


@pytest.fixture
def one_thread(monkeypatch):
    """Images one at a time through a tiny trunk: one compute thread is fastest (on a loaded
    machine two threads wait for each other at every layer)."""
    import ssl_engine.engines.instance_retrieval as engine

    threads = torch.get_num_threads()
    monkeypatch.setattr(engine, "configure_threads", lambda cfg: torch.set_num_threads(1))
    yield
    torch.set_num_threads(threads)


def _tool():
    spec = importlib.util.spec_from_file_location("instance_retrieval_test", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _record(out: Path):
    lines = (out / "metrics.json").read_text().splitlines()
    (record,) = [json.loads(line)["instance_retrieval"] for line in lines
                 if "instance_retrieval" in json.loads(line)]
    return record


MODEL = ["config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.125",
         "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res4,[Identity,[]]]]",
         "config.MODEL.FEATURE_EVAL_SETTINGS.SHOULD_FLATTEN_FEATS=false",
         "config.DATA.TRAIN.DATA_SOURCES=[]", "config.DATA.TEST.DATA_SOURCES=[]",
         "config.IMG_RETRIEVAL.RESIZE_IMG=32"]


def test_tool_on_a_tiny_revisited_dataset(tmp_path, one_thread):
    rng = np.random.default_rng(0)
    for name in ("rtiny", "rwhite"):
        folder = tmp_path / "data" / name
        for i in range(8):
            _image(folder / "jpg" / f"db{i}.jpg", rng)
    folder = tmp_path / "data/rtiny"
    for q, source in ((0, 3), (1, 6)):  # each query is a copy of a database image
        shutil.copy(folder / f"jpg/db{source}.jpg", folder / f"jpg/q{q}.jpg")
    gnd = {"imlist": [f"db{i}" for i in range(8)], "qimlist": ["q0", "q1"],
           "gnd": [{"easy": [3], "hard": [5], "junk": [1], "bbx": [0, 0, 20, 28]},
                   {"easy": [6], "hard": [0, 2], "junk": [], "bbx": [0, 0, 20, 28]}]}
    (folder / "gnd_rtiny.pkl").write_bytes(pickle.dumps(gnd))
    (tmp_path / "data/rwhite/gnd_rwhite.pkl").write_bytes(pickle.dumps(
        {"imlist": [f"db{i}" for i in range(8)], "qimlist": [], "gnd": []}))
    out = tmp_path / "out"
    argv = [CONFIG, *MODEL, f"config.CHECKPOINT.DIR={out}",
            f"config.IMG_RETRIEVAL.DATASET_PATH={tmp_path / 'data'}",
            "config.IMG_RETRIEVAL.TRAIN_DATASET_NAME=rwhite",
            "config.IMG_RETRIEVAL.EVAL_DATASET_NAME=rtiny",
            "config.IMG_RETRIEVAL.FEATS_PROCESSING_TYPE=rmac",
            "config.IMG_RETRIEVAL.SPATIAL_LEVELS=2", "config.IMG_RETRIEVAL.N_PCA=8",
            "config.IMG_RETRIEVAL.SAVE_FEATURES=true"]
    assert _tool().main(argv) == 0
    ranks = np.load(out / "retrieval_rankings.npy")
    assert ranks.shape == (2, 8) and ranks[:, 0].tolist() == [3, 6]  # the copies come first
    record = _record(out)
    assert record["layer"] == "res4" and record["whitening"] and record["database"] == 8
    assert record["results"]["easy"]["mAP"] == 100.0
    database = np.load(out / "retrieval_database_features.npy")
    queries = np.load(out / "retrieval_query_features.npy")
    assert database.shape == (8, 8)  # N_PCA dimensions
    np.testing.assert_allclose(np.linalg.norm(database, axis=1), 1, atol=1e-5)
    expected = revisited_scores(np.argsort(-(queries @ database.T), axis=1, kind="stable"),
                                [{k: g[k] for k in ("easy", "hard", "junk")} for g in gnd["gnd"]])
    assert record["results"] == expected


def test_tool_on_a_tiny_copydays_dataset(tmp_path, capsys, one_thread):
    rng = np.random.default_rng(1)
    folder = tmp_path / "data/cdays"
    (folder / "queries").mkdir(parents=True)
    for group in range(4):  # each original is its own query
        _image(folder / "database" / f"20{group:02d}00.jpg", rng)
        shutil.copy(folder / "database" / f"20{group:02d}00.jpg",
                    folder / "queries" / f"original_20{group:02d}00.jpg")
    out = tmp_path / "out"
    argv = [CONFIG, *MODEL, f"config.CHECKPOINT.DIR={out}",
            f"config.IMG_RETRIEVAL.DATASET_PATH={tmp_path / 'data'}",
            "config.IMG_RETRIEVAL.EVAL_DATASET_NAME=cdays",
            "config.IMG_RETRIEVAL.TRAIN_PCA_WHITENING=false",
            "config.IMG_RETRIEVAL.FEATS_PROCESSING_TYPE=gem",
            "config.IMG_RETRIEVAL.SIMILARITY_MEASURE=l2",
            "config.IMG_RETRIEVAL.IMG_SCALINGS=[1,0.75]",
            "config.IMG_RETRIEVAL.NUM_QUERY_SAMPLES=3"]
    assert _tool().main(argv) == 0
    record = _record(out)
    assert record["queries"] == 3 and record["database"] == 4
    assert record["results"] == {"original": {"mAP": 100.0, "mP@k": {"1": 100.0, "5": 100.0,
                                                                      "10": 100.0},
                                              "queries": 3}}
    assert "cdays original: mAP 100.00" in capsys.readouterr().out


def test_tool_refusals_are_one_line(tmp_path, capsys):
    (tmp_path / "data/Paris").mkdir(parents=True)  # images only: no queries to score
    base = [CONFIG, *MODEL, f"config.CHECKPOINT.DIR={tmp_path / 'out'}",
            "config.IMG_RETRIEVAL.FEATS_PROCESSING_TYPE=gem"]
    tool = _tool()
    assert tool.main([*base, f"config.IMG_RETRIEVAL.DATASET_PATH={tmp_path / 'none'}"]) == 2
    assert "no folder" in capsys.readouterr().err
    assert tool.main([*base, f"config.IMG_RETRIEVAL.DATASET_PATH={tmp_path / 'data'}"]) == 2
    assert "original Oxford/Paris protocol" in capsys.readouterr().err
    assert tool.main([*base, "config.IMG_RETRIEVAL.EVAL_BINARY_PATH=/bin/compute_ap"]) == 2
    assert "compute_ap program" in capsys.readouterr().err
    assert tool.main([*base, f"config.IMG_RETRIEVAL.DATASET_PATH={tmp_path}",
                      "config.IMG_RETRIEVAL.FEATS_PROCESSING_TYPE=mac"]) == 2
    assert "use rmac, gem or ''" in capsys.readouterr().err
