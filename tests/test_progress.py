"""Progress lines of long work outside training: at most one every 10 s, with an ETA, from
the extraction of a split and from the evaluation tools (k-NN, k-means, logistic regression)."""
import logging

import numpy as np

from ssl_engine.evaluation.clustering import kmeans
from ssl_engine.extraction import rank_files
from ssl_engine.evaluation.low_shot import logistic_regression_eval
from ssl_engine.utils import progress as progress_module
from ssl_engine.utils.progress import Progress, eta_text
from test_eval_tools import load_tool
from test_extract_features import CONFIG, TINY, extract


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_lines_come_at_most_once_per_interval_with_rate_and_eta():
    clock, lines = Clock(), []
    progress = Progress("extracting train", 100, clock=clock,
                        log=lambda fmt, text: lines.append(text))
    assert progress.interval == 10.0  # the default the issue asks for
    for _ in range(4):  # 4 batches of 5 in 8 s: below the interval, nothing said
        clock.now += 2.0
        progress.update(5)
    assert lines == []
    clock.now += 2.0
    progress.update(5)  # 25 samples after 10 s: 2.5/s, 75 left -> 30 s
    assert lines == ["extracting train: 25/100 samples (25.0%), 2.5 samples/s, eta 0:00:30"]
    clock.now += 9.0
    progress.update(5)  # 9 s after the last line: silent
    assert len(lines) == 1
    clock.now += 1.0
    progress.update(10)  # 40 in 20 s: 2/s, 60 left -> 30 s
    assert lines[-1] == "extracting train: 40/100 samples (40.0%), 2.0 samples/s, eta 0:00:30"


def test_eta_is_written_as_the_training_log_writes_it():
    assert eta_text(3725.9) == "1:02:05"
    assert eta_text(None) == "-" and eta_text(float("nan")) == "-"


def test_extraction_says_how_far_it_is(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(progress_module, "DEFAULT_INTERVAL_SECONDS", 0.0)  # a line per batch
    caplog.set_level(logging.INFO, logger="ssl_engine.utils.progress")
    extract(tmp_path, ["config.EXTRACT_FEATURES.SPLITS=[TRAIN]"])
    lines = [r.getMessage() for r in caplog.records if r.name == "ssl_engine.utils.progress"]
    # 37 train images in batches of 8: 8, 16, 24, 32, 37 done, each line with an ETA
    assert [line.split(":")[1].split()[0] for line in lines] == [
        "8/37", "16/37", "24/37", "32/37", "37/37"], lines
    assert all(line.startswith("extracting train: ") and " eta " in line for line in lines)
    assert lines[-1].endswith("eta 0:00:00")


def test_knn_tool_says_how_far_the_queries_are(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(progress_module, "DEFAULT_INTERVAL_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="ssl_engine.utils.progress")
    argv = [CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}",
            "config.NEAREST_NEIGHBOR.CHUNK_SIZE=10"]
    assert load_tool("nearest_neighbor_test").main(argv) == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "ssl_engine.utils.progress"]
    assert any(line.startswith("extracting test: 21/21 samples") for line in lines), lines
    knn = [line for line in lines if line.startswith("k-NN: ")]
    assert [line.split()[1] for line in knn] == ["10/21", "20/21", "21/21"], knn


def test_kmeans_and_logistic_regression_say_how_far_they_are(monkeypatch, caplog):
    monkeypatch.setattr(progress_module, "DEFAULT_INTERVAL_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="ssl_engine.utils.progress")
    rng = np.random.default_rng(0)
    features, labels = rng.normal(size=(40, 4)).astype(np.float32), np.arange(40) % 2
    kmeans(features, num_clusters=3, num_iter=3)
    logistic_regression_eval(features, labels, features, labels, lambdas=[1.0, 10.0])
    lines = [r.getMessage().split(" (")[0] for r in caplog.records
             if r.name == "ssl_engine.utils.progress"]
    assert lines == ["k-means: 1/3 iterations", "k-means: 2/3 iterations",
                     "k-means: 3/3 iterations", "logistic regression: 1/2 lambdas",
                     "logistic regression: 2/2 lambdas"]


def test_merging_the_files_of_several_processes_says_how_far_it_is(tmp_path, monkeypatch,
                                                                   caplog):
    monkeypatch.setattr(progress_module, "DEFAULT_INTERVAL_SECONDS", 0.0)
    monkeypatch.setattr(rank_files, "MERGE_CHUNK_BYTES", 4 * 2 * 4)  # 4 rows a chunk
    caplog.set_level(logging.INFO, logger="ssl_engine.utils.progress")
    values = np.arange(20, dtype=np.float32).reshape(10, 2)
    sources, inds_files = [], []
    for rank, share in enumerate([np.arange(0, 10, 2), np.arange(1, 10, 2)]):
        for rows, name, paths in ((values[share], "rows", sources), (share, "inds", inds_files)):
            appender = rank_files.NpyAppender(tmp_path / f"{name}{rank}.npy", len(share))
            appender.append(rows)
            appender.close()
            paths.append(appender.path)
    rank_files.merge_rank_files(tmp_path / "merged.npy", sources, inds_files, 10)
    lines = [r.getMessage().split(" (")[0] for r in caplog.records
             if r.name == "ssl_engine.utils.progress"]
    assert lines == [f"merging merged.npy: {n}/10 rows" for n in (4, 5, 9, 10)]
