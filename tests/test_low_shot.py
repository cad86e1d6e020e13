import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neighbors import KNeighborsClassifier

from ssl_engine.evaluation.low_shot import low_shot_eval, sample_low_shot


def small_data(seed=0):
    rs = np.random.RandomState(seed)
    centers = rs.randn(5, 10)
    train_labels = np.repeat(np.arange(5), 12)
    test_labels = rs.randint(0, 5, 80)
    train = centers[train_labels] + 1.2 * rs.randn(len(train_labels), 10)
    test = centers[test_labels] + 1.2 * rs.randn(len(test_labels), 10)
    return train, train_labels, test, test_labels


def test_sampled_sets_have_shot_per_class_and_follow_the_seed():
    labels = np.random.RandomState(3).permutation(np.repeat(np.arange(4), 9))
    draws = [sample_low_shot(labels, 5, seed) for seed in range(3)]
    for picked in draws:
        assert len(set(picked)) == 20
        np.testing.assert_array_equal(np.bincount(labels[picked]), [5, 5, 5, 5])
    assert len({tuple(sorted(d)) for d in draws}) == 3
    # the documented draw: one RandomState, classes in sorted order, without replacement
    state = np.random.RandomState(1)
    expected = np.concatenate([state.choice(np.flatnonzero(labels == c), 5, replace=False)
                               for c in range(4)])
    np.testing.assert_array_equal(draws[1], expected)


@pytest.mark.parametrize("k", [1, 3])
def test_accuracy_matches_sklearn_cosine_knn(k):
    train, train_labels, test, test_labels = small_data()
    result = low_shot_eval(train, train_labels, test, test_labels, shots=(3, 5), seeds=(0, 1, 2),
                           k=k)
    assert sorted(result) == [3, 5]
    for shot, entry in result.items():
        expected = []
        for seed in (0, 1, 2):
            picked = sample_low_shot(train_labels, shot, seed)
            clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute")
            clf.fit(train[picked], train_labels[picked])
            expected.append(100.0 * np.mean(clf.predict(test) == test_labels))
        np.testing.assert_allclose(entry["per_seed"], expected)
        assert entry["mean"] == pytest.approx(np.mean(expected))
        assert entry["std"] == pytest.approx(np.std(expected))


def test_too_few_samples_of_a_class_is_named():
    train, train_labels, test, test_labels = small_data()
    with pytest.raises(ValueError, match="13-shot evaluation needs 13 train samples of every "
                                         "class, but class 0 has 12"):
        low_shot_eval(train, train_labels, test, test_labels, shots=(13,))


def test_raw_pixel_one_shot_on_digits():
    """1-shot nearest neighbour on raw digit pixels: a known property, about 61-64%."""
    images, labels = load_digits(return_X_y=True)
    train, test = train_test_split(np.arange(len(labels)), test_size=0.3, stratify=labels,
                                   random_state=0)
    result = low_shot_eval(images[train], labels[train], images[test], labels[test],
                           shots=(1, 5))
    assert 55 <= result[1]["mean"] <= 70
    assert result[1]["mean"] < result[5]["mean"]
    assert len(result[1]["per_seed"]) == 5 and result[1]["std"] > 0


def _fit_plainly(train, train_y, test, lam, steps=200):
    """The objective written out: standardised features, the mean cross-entropy of the n
    train samples plus lam / (2 n^2) * |W|^2 (bias not penalised), minimised with LBFGS."""
    import torch

    mean, std = train.mean(0), train.std(0)
    std[std == 0] = 1
    x = torch.tensor((train - mean) / std, dtype=torch.float64)
    t = torch.tensor((test - mean) / std, dtype=torch.float64)
    y = torch.tensor(train_y)
    w = torch.zeros(x.shape[1], int(y.max()) + 1, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(int(y.max()) + 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=steps, tolerance_grad=1e-10,
                            tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, y) + lam / (2 * len(y) ** 2) * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return (x @ w + b).argmax(1).numpy(), (t @ w + b).argmax(1).numpy()


def test_logistic_regression_matches_the_objective_fitted_plainly():
    from ssl_engine.evaluation.low_shot import logistic_regression_eval

    train, train_y, test, test_y = small_data(seed=4)
    train = train * np.linspace(0.5, 20, train.shape[1])  # scales the standardisation undoes
    test = test * np.linspace(0.5, 20, test.shape[1])
    lambdas = [30.0, 300.0, 3000.0]  # (weaker penalties leave this data nearly separable)
    result = logistic_regression_eval(train, train_y, test, test_y, lambdas)
    for lam, row in zip(lambdas, result["per_lambda"]):
        train_pred, test_pred = _fit_plainly(train, train_y, test, lam)
        assert row["lambda"] == lam
        assert row["train_top1"] == pytest.approx(100 * np.mean(train_pred == train_y))
        assert row["top1"] == pytest.approx(100 * np.mean(test_pred == test_y))
    tops = [row["top1"] for row in result["per_lambda"]]
    assert len(set(tops)) > 1  # the penalty matters on this data
    assert result["top1"] == max(tops)
    with pytest.raises(ValueError, match="LAMBDA must be positive"):
        logistic_regression_eval(train, train_y, test, test_y, [0.0])
