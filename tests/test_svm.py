"""The SVM evaluation (ssl_engine/evaluation/svm.py) against scikit-learn computed here, and
tools/train_svm.py end to end on features written to a temporary folder."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import average_precision_score
from sklearn.model_selection import cross_val_score
from sklearn.svm import LinearSVC

from ssl_engine.evaluation import svm
from ssl_engine.evaluation.svm import NO_POSITIVE_AP, SVMSettings, svm_costs, svm_eval
from ssl_engine.utils.average_precision import average_precision

TOOLS = Path(__file__).resolve().parents[1] / "tools"
COSTS = (0.001, 0.05, 1.0, 20.0)


def multi_label_data(seed, num_train=72, num_test=48, dim=10, num_classes=3, noise=0.9):
    """VOC-like features: each sample holds a random set of classes, its features the sum of
    their directions plus Gaussian noise; targets 1 (present) / 0 (absent)."""
    rng = np.random.RandomState(seed)
    directions = rng.randn(num_classes, dim) * 2

    def split(n):
        targets = (rng.rand(n, num_classes) < 0.35).astype(np.int64)
        features = targets @ directions + noise * rng.randn(n, dim) + 1.0
        return features.astype(np.float32), targets

    return split(num_train) + split(num_test)


def sklearn_svm(cost, max_iter=2000):
    return LinearSVC(C=cost, class_weight={1: 2.0, -1: 1.0}, tol=1e-4, max_iter=max_iter,
                     random_state=0)


def l2_rows(x):
    x = np.asarray(x, dtype=np.float64)
    return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-5)


def test_costs_list_and_powers_of_the_base():
    assert svm_costs([0.1, 1]) == [0.1, 1.0]
    assert svm_costs([0.5], base=2.0, power_range=[-2, 1]) == [0.5, 0.25, 0.5, 1.0]
    with pytest.raises(ValueError, match="positive"):
        svm_costs([0.1, 0.0])


def test_average_precision_matches_sklearn_with_ties_and_the_interpolated_variant():
    rng = np.random.RandomState(3)
    scores = np.round(rng.randn(50), 1)  # rounded: many ties
    labels = (rng.rand(50) < 0.4).astype(int)
    assert average_precision(scores, labels, no_positives=NO_POSITIVE_AP) == pytest.approx(
        average_precision_score(labels, scores), abs=1e-12)
    # interpolated: at each positive's rank, the best precision at that rank or below
    no_ties = rng.permutation(50).astype(float)
    order = np.argsort(-no_ties)
    hits = labels[order]
    precision = np.cumsum(hits) / np.arange(1, 51)
    expected = sum(precision[i:].max() for i in np.flatnonzero(hits)) / hits.sum()
    interpolated = average_precision(no_ties, labels, no_positives=NO_POSITIVE_AP,
                                     interpolated=True)
    assert interpolated == pytest.approx(expected)
    assert interpolated > average_precision(no_ties, labels, no_positives=NO_POSITIVE_AP)
    assert np.isnan(average_precision(scores, np.zeros(50), no_positives=NO_POSITIVE_AP))


def test_chosen_cost_and_mean_ap_match_a_direct_sklearn_loop():
    train_x, train_y, test_x, test_y = multi_label_data(seed=0)
    settings = SVMSettings(costs=COSTS, cross_val_folds=3)
    result = svm_eval(train_x, train_y, test_x, test_y, settings)

    train_n, test_n = l2_rows(train_x), l2_rows(test_x)
    aps, chosen, test_aps = [], [], []
    for cls in range(3):
        labels = np.where(train_y[:, cls] == 1, 1, -1)
        cv = [cross_val_score(sklearn_svm(c), train_n, labels, cv=3,
                              scoring="average_precision").mean() for c in COSTS]
        aps.append(cv)
        chosen.append(COSTS[int(np.argmax(cv))])
        model = sklearn_svm(chosen[-1]).fit(train_n, labels)
        test_aps.append(average_precision_score(test_y[:, cls], model.decision_function(test_n)))
    # the data make the choice matter: the costs' cross-validated APs differ
    assert any(max(cv) - min(cv) > 0.01 for cv in aps)
    assert any(c != COSTS[0] for c in chosen)
    assert result["chosen_cost"] == chosen
    np.testing.assert_allclose(result["crossval_ap"], aps, atol=1e-9)
    np.testing.assert_allclose(result["test_ap"], test_aps, atol=1e-9)
    assert result["mAP"] == pytest.approx(100 * np.mean(test_aps), abs=1e-7)
    assert result["classes"] == [0, 1, 2] and "top1" not in result


def test_ignored_test_samples_leave_the_ap_as_if_they_were_not_there():
    train_x, train_y, test_x, test_y = multi_label_data(seed=1, noise=2.0)
    settings = SVMSettings(costs=(1.0,))
    # rows 0-9 become confident false positives of class 0, then are marked ignored (-1)
    test_x, test_y = test_x.copy(), test_y.copy()
    fake = np.arange(10)
    test_x[fake] = train_x[train_y[:, 0] == 1][:10]
    ignored = test_y.copy()
    ignored[fake, 0] = -1
    absent = test_y.copy()
    absent[fake, 0] = 0
    keep = np.ones(len(test_y), bool)
    keep[fake] = False
    with_ignored = svm_eval(train_x, train_y, test_x, ignored, settings)
    without = svm_eval(train_x, train_y, test_x[keep], test_y[keep], settings)
    as_absent = svm_eval(train_x, train_y, test_x, absent, settings)
    assert with_ignored["test_ap"][0] == pytest.approx(without["test_ap"][0], abs=1e-12)
    assert as_absent["test_ap"][0] < with_ignored["test_ap"][0] - 0.05
    assert with_ignored["test_ap"][0] < 0.99  # noisy enough for the order to matter


def test_single_label_top1_from_the_saved_models_and_reuse(tmp_path, monkeypatch):
    rng = np.random.RandomState(2)
    centres = rng.randn(3, 6) * 3

    def split(n):
        targets = np.arange(n) % 3
        return (centres[targets] + rng.randn(n, 6)).astype(np.float32), targets

    (train_x, train_y), (test_x, test_y) = split(60), split(30)
    test_y[0] = (test_y[0] + 1) % 3  # a test row labelled with another cluster's class
    settings = SVMSettings(costs=(0.01, 1.0))
    result = svm_eval(train_x, train_y, test_x, test_y, settings, model_dir=tmp_path)

    scores = []
    for cls, cost in enumerate(result["chosen_cost"]):
        with np.load(tmp_path / f"cls{cls}_cost{cost}.npz", allow_pickle=False) as saved:
            scores.append(l2_rows(test_x) @ saved["weight"] + float(saved["bias"]))
    top1 = 100 * np.mean(np.argmax(np.stack(scores, 1), 1) == test_y)
    assert result["top1"] == pytest.approx(top1)
    assert 80 < result["top1"] < 100  # well separated clusters, one relabelled row
    assert len(list(tmp_path.glob("cls*_cost*.npz"))) == 6

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    monkeypatch.setattr(svm, "crossval_ap", no_training)
    assert svm_eval(train_x, train_y, test_x, test_y, settings, model_dir=tmp_path) == result
    with pytest.raises(AssertionError, match="trained again"):  # other train features
        svm_eval(train_x * 2 + 1, train_y, test_x, test_y, settings, model_dir=tmp_path)
    with pytest.raises(AssertionError, match="trained again"):
        svm_eval(train_x, train_y, test_x, test_y, settings, model_dir=tmp_path,
                 force_retrain=True)


def test_class_list_and_settings_sklearn_refuses():
    train_x, train_y, test_x, test_y = multi_label_data(seed=4)
    result = svm_eval(train_x, train_y, test_x, test_y, SVMSettings(costs=(1.0,)), classes=[2])
    full = svm_eval(train_x, train_y, test_x, test_y, SVMSettings(costs=(1.0,)))
    assert result["classes"] == [2] and result["test_ap"] == [full["test_ap"][2]]
    with pytest.raises(ValueError, match="classes \\[5\\]"):
        svm_eval(train_x, train_y, test_x, test_y, SVMSettings(), classes=[5])
    with pytest.raises(ValueError, match="refused by LinearSVC"):
        svm_eval(train_x, train_y, test_x, test_y,
                 SVMSettings(penalty="l1", loss="hinge", dual=True))


def write_features(folder, layer, split, features, targets):
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{split}_{layer}"
    np.save(f"{stem}_features.npy", features)
    np.save(f"{stem}_targets.npy", targets)
    np.save(f"{stem}_inds.npy", np.arange(len(targets), dtype=np.int64))


def test_tool_end_to_end_on_features_in_a_folder(tmp_path, capsys):
    train_x, train_y, test_x, test_y = multi_label_data(seed=5)
    test_y[:4, 1] = -1
    features = tmp_path / "features"
    write_features(features, "res5avg", "train", train_x, train_y)
    write_features(features, "res5avg", "test", test_x, test_y)
    out = tmp_path / "out"
    spec = importlib.util.spec_from_file_location("train_svm", TOOLS / "train_svm.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    argv = ["config=feature_extraction/extract_resnet_digits",
            f"config.SVM_FEATURES_PATH={features}", f"config.CHECKPOINT.DIR={out}",
            "config.SVM.costs.costs_list=[0.01,1.0]", "config.SVM.cls_list=[0,1]"]
    assert tool.main(argv) == 0

    expected = svm_eval(train_x, train_y, test_x, test_y, SVMSettings(costs=(0.01, 1.0)),
                        classes=[0, 1])
    saved = json.loads((out / "svm" / "results.json").read_text())["svm"]
    layer = saved["layers"]["res5avg"]
    assert layer["mAP"] == pytest.approx(expected["mAP"])
    assert layer["chosen_cost"] == expected["chosen_cost"]
    metrics = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    assert metrics[-1]["svm"] == saved
    assert sorted(p.name for p in (out / "svm" / "res5avg").iterdir()) == [
        f"cls{c}_cost{cost}.npz" for c in (0, 1) for cost in (0.01, 1.0)]
    assert f"SVM res5avg: mAP {expected['mAP']:.2f} (2 classes)" in capsys.readouterr().out

    assert tool.main(argv[:1] + [f"config.SVM_FEATURES_PATH={tmp_path / 'none'}",
                                 f"config.CHECKPOINT.DIR={out}"]) == 2
    assert "is not a folder" in capsys.readouterr().err
