"""ClusterFit's k-means (ssl_engine/evaluation/clustering.py) against scikit-learn's, and
tools/cluster_features_and_label.py end to end on a tiny synthetic extraction."""
import importlib.util
import pickle
from pathlib import Path

import numpy as np
import pytest
from sklearn.cluster import KMeans

from ssl_engine.evaluation.clustering import assign, kmeans, l2_normalize
from ssl_engine.extraction.files import load_extracted
from test_extract_features import CONFIG, TINY

TOOL = Path(__file__).resolve().parents[1] / "tools/cluster_features_and_label.py"


def test_kmeans_matches_scikit_learn_from_the_same_start():
    rng = np.random.RandomState(0)
    points = np.concatenate([rng.randn(40, 5) + 4 * rng.randn(1, 5) for _ in range(4)])
    points = points.astype(np.float32)
    start = points[np.random.RandomState(3).choice(len(points), 4, replace=False)]
    for num_iter in (1, 2, 10):
        ours = kmeans(points, 4, num_iter, seed=3)
        oracle = KMeans(4, init=start, n_init=1, max_iter=num_iter, tol=0,
                        algorithm="lloyd").fit(points)
        np.testing.assert_allclose(ours, oracle.cluster_centers_, rtol=1e-5, atol=1e-5)
    labels, distances = assign(points, ours)
    np.testing.assert_array_equal(labels, oracle.predict(points))
    np.testing.assert_allclose(distances, ((points - ours[labels]) ** 2).sum(1), rtol=1e-5)
    with pytest.raises(ValueError, match="NUM_CLUSTERS=200"):
        kmeans(points, 200, 1)


def test_an_emptied_cluster_takes_the_farthest_point():
    points = np.array([[0, 0], [0, 0], [0, 0], [5, 5]], dtype=np.float32)
    # seed 4 starts from rows 0 and 1, the same point: every row joins the first centroid and
    # the second, empty, takes the row farthest from its centroid
    np.testing.assert_array_equal(np.random.RandomState(4).choice(4, 2, replace=False), [0, 1])
    np.testing.assert_allclose(kmeans(points, 2, 1, seed=4), [[1.25, 1.25], [5, 5]])
    np.testing.assert_allclose(kmeans(points, 2, 3, seed=4), [[0, 0], [5, 5]])


def test_tool_writes_cluster_labels_of_both_splits(tmp_path, capsys):
    out = tmp_path / "clusters"
    argv = [CONFIG, *TINY, f"config.CHECKPOINT.DIR={tmp_path}",
            "config.CLUSTERFIT.NUM_CLUSTERS=3", "config.CLUSTERFIT.NUM_ITER=5",
            f"config.CLUSTERFIT.OUTPUT_DIR={out}", "config.CLUSTERFIT.FEATURES.DATASET_NAME=tiny",
            "config.CLUSTERFIT.FEATURES.LAYER_NAME=res5avg"]
    spec = importlib.util.spec_from_file_location("cluster_features_and_label", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(argv) == 0
    with open(out / "tiny_train_N3_faiss.pkl", "rb") as f:
        saved = pickle.load(f)
    train = load_extracted(tmp_path, "train", "res5avg")
    expected = kmeans(l2_normalize(train.features), 3, 5, seed=0)
    np.testing.assert_allclose(saved["centroids"], expected, rtol=1e-6)
    for split, count in (("train", 37), ("test", 21)):
        labels = np.load(out / f"tiny_{split}_N3_faiss_lbls.npy")
        assert labels.dtype == np.int64 and labels.shape == (count,)
        features = load_extracted(tmp_path, split, "res5avg").features
        np.testing.assert_array_equal(labels, assign(l2_normalize(features), expected)[0])
    assert "clusters of TRAIN: 37 images in 3 clusters" in capsys.readouterr().out
