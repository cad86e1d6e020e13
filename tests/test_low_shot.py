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
