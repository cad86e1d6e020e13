import numpy as np
import pytest
import torch

from ssl_engine.evaluation.knn import knn_classify, knn_predict


def brute_force_ranking(train, train_labels, test, k, sigma, num_classes):
    """Float64 loop: every test sample's classes ranked by summed exp(cos / sigma) of its k
    nearest train samples (ties: smaller class first)."""
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    test = test / np.linalg.norm(test, axis=1, keepdims=True)
    k = min(k, len(train))
    rankings = []
    for row in test:
        sims = train @ row
        nearest = np.argsort(-sims, kind="stable")[:k]
        scores = np.zeros(num_classes)
        for j in nearest:
            scores[train_labels[j]] += 1.0 if sigma is None else np.exp(sims[j] / sigma)
        rankings.append(np.argsort(-scores, kind="stable"))
    return np.array(rankings)


def brute_force_accuracy(ranking, labels, top):
    return 100.0 * np.mean([label in row[:top] for row, label in zip(ranking, labels)])


def random_data(num_train=120, num_test=37, dim=12, num_classes=7, seed=0):
    rs = np.random.RandomState(seed)
    centers = rs.randn(num_classes, dim)
    train_labels = rs.randint(0, num_classes, num_train)
    test_labels = rs.randint(0, num_classes, num_test)
    train = centers[train_labels] + 3.0 * rs.randn(num_train, dim)
    test = centers[test_labels] + 3.0 * rs.randn(num_test, dim)
    return train, train_labels, test, test_labels


@pytest.mark.parametrize("k, sigma, chunk", [(1, 0.07, 1024), (5, 0.07, 10), (20, 0.5, 7),
                                             (20, 0.07, 37), (13, 1.0, 1), (4, None, 16)])
def test_predictions_match_brute_force(k, sigma, chunk):
    train, train_labels, test, test_labels = random_data()
    expected = brute_force_ranking(train, train_labels, test, k, sigma, 7)
    ranked = knn_predict(train, train_labels, test, topk=k, sigma=sigma, num_classes=7,
                         chunk_size=chunk)
    assert ranked.shape == (37, 5)
    np.testing.assert_array_equal(ranked.numpy(), expected[:, :5])
    result = knn_classify(torch.from_numpy(train), torch.from_numpy(train_labels),
                          torch.from_numpy(test), torch.from_numpy(test_labels), topk=k,
                          sigma=sigma, chunk_size=chunk)
    assert result["top1"] == pytest.approx(brute_force_accuracy(expected, test_labels, 1))
    assert result["top5"] == pytest.approx(brute_force_accuracy(expected, test_labels, 5))
    assert 0 < result["top1"] < result["top5"] < 100


def test_k_larger_than_train_set_is_clipped():
    train, train_labels, test, test_labels = random_data(num_train=9)
    expected = brute_force_ranking(train, train_labels, test, 9, 0.1, 7)
    ranked = knn_predict(train, train_labels, test, topk=50, sigma=0.1, num_classes=7)
    np.testing.assert_array_equal(ranked.numpy(), expected[:, :5])


def test_fewer_than_five_classes_top5_uses_all_classes():
    train, train_labels, test, test_labels = random_data(num_classes=3)
    result = knn_classify(train, train_labels, test, test_labels, topk=5)
    expected = brute_force_ranking(train, train_labels, test, 5, 0.07, 3)
    assert result["top1"] == pytest.approx(brute_force_accuracy(expected, test_labels, 1))
    assert result["top5"] == 100.0
    assert knn_predict(train, train_labels, test, topk=5).shape == (37, 3)


def test_small_sigma_does_not_overflow():
    train, train_labels, test, _ = random_data()
    expected = brute_force_ranking(train, train_labels, test, 1, 0.07, 7)  # sigma -> 0: 1-NN
    ranked = knn_predict(train, train_labels, test, topk=10, sigma=1e-4, num_classes=7)
    np.testing.assert_array_equal(ranked[:, 0].numpy(), expected[:, 0])


def test_features_are_l2_normalised():
    train, train_labels, test, test_labels = random_data()
    scales = np.random.RandomState(1).uniform(0.1, 10, (len(train), 1))
    assert knn_classify(train * scales, train_labels, test * 3, test_labels) == \
        knn_classify(train, train_labels, test, test_labels)


def test_bad_inputs_are_named():
    train, train_labels, test, test_labels = random_data()
    with pytest.raises(ValueError, match="train labels must be \\[120\\]"):
        knn_classify(train, train_labels[:5], test, test_labels)
    with pytest.raises(ValueError, match="dimension 12 but test features have 3"):
        knn_classify(train, train_labels, test[:, :3], test_labels)
    with pytest.raises(ValueError, match="non-negative class indices, found -1"):
        knn_classify(train, train_labels - 1, test, test_labels)
    with pytest.raises(ValueError, match="sigma must be positive"):
        knn_classify(train, train_labels, test, test_labels, sigma=0)
