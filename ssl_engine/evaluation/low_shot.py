"""Low-shot evaluation: classify the test set with a few labelled train images per class."""
from typing import Dict, Sequence

import numpy as np
import torch

from ssl_engine.evaluation.knn import ArrayLike, as_tensor, knn_predict, topk_accuracies
from ssl_engine.utils.progress import Progress


def sample_low_shot(train_labels: ArrayLike, shot: int, seed: int) -> np.ndarray:
    """Indices of ``shot`` train samples of every class: one ``np.random.RandomState(seed)``
    draws without replacement from each class in sorted class order."""
    labels = as_tensor(train_labels, torch.long).numpy()
    if shot < 1:
        raise ValueError(f"shots must be positive, got {shot}")
    state = np.random.RandomState(seed)
    chosen = []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        if len(members) < shot:
            raise ValueError(f"{shot}-shot evaluation needs {shot} train samples of every "
                             f"class, but class {label} has {len(members)}")
        chosen.append(state.choice(members, shot, replace=False))
    return np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)


def low_shot_eval(
    train_features: ArrayLike,
    train_labels: ArrayLike,
    test_features: ArrayLike,
    test_labels: ArrayLike,
    shots: Sequence[int] = (1, 5),
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    k: int = 1,
) -> Dict[int, Dict[str, object]]:
    """``{shot: {"mean": %, "std": %, "per_seed": [% per seed]}}``: for each seed, the top-1
    accuracy on every test sample of a k-NN (cosine similarity, majority vote among the ``k``
    nearest, ties to the smaller class) over ``shot`` sampled train samples per class.
    ``std`` is the population standard deviation over seeds."""
    train = as_tensor(train_features, torch.float32)
    labels = as_tensor(train_labels, torch.long)
    test_labels = as_tensor(test_labels, torch.long)
    num_classes = int(torch.cat([labels, test_labels]).max()) + 1
    results = {}
    progress = Progress("low-shot k-NN", len(shots) * len(seeds), unit="trials")
    for shot in shots:
        per_seed = []
        for seed in seeds:
            picked = torch.from_numpy(sample_low_shot(labels, int(shot), int(seed)))
            ranked = knn_predict(train[picked], labels[picked], test_features, topk=k,
                                 sigma=None, num_classes=num_classes, num_ranked=1)
            per_seed.append(topk_accuracies(ranked, test_labels)["top1"])
            progress.update()
        results[int(shot)] = {"mean": float(np.mean(per_seed)), "std": float(np.std(per_seed)),
                              "per_seed": per_seed}
    return results


def logistic_regression_eval(
    train_features: ArrayLike,
    train_labels: ArrayLike,
    test_features: ArrayLike,
    test_labels: ArrayLike,
    lambdas: Sequence[float],
) -> Dict[str, object]:
    """VISSL's low-shot logistic regression (LOW_SHOT_BENCHMARK): the features standardised
    with the train set's mean and standard deviation, then, for each ``lambda``, a multinomial
    logistic regression fitted by scikit-learn (lbfgs, its default iteration limit) with
    ``C = n_train / lambda`` as VISSL set it: the sum of the n train losses plus
    ``lambda / (2 n) * |w|^2`` (the bias not penalised). ``{"per_lambda": [{"lambda", "train_top1", "top1"} ...], "top1": best test top-1}``
    (percentages; the best over lambdas is VISSL's report)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    train = as_tensor(train_features, torch.float32).flatten(1).numpy()
    test = as_tensor(test_features, torch.float32).flatten(1).numpy()
    train_y = as_tensor(train_labels, torch.long).numpy()
    test_y = as_tensor(test_labels, torch.long).numpy()
    scaler = StandardScaler().fit(train)
    train, test = scaler.transform(train), scaler.transform(test)
    per_lambda = []
    progress = Progress("logistic regression", len(lambdas), unit="lambdas")
    for lam in lambdas:
        if lam <= 0:
            raise ValueError(f"LOW_SHOT_BENCHMARK.LOGISTIC_REGRESSION.LAMBDA must be positive, "
                             f"got {lam}")
        classifier = LogisticRegression(C=len(train_y) / float(lam)).fit(train, train_y)
        per_lambda.append({"lambda": float(lam),
                           "train_top1": 100.0 * classifier.score(train, train_y),
                           "top1": 100.0 * classifier.score(test, test_y)})
        progress.update()
    return {"per_lambda": per_lambda, "top1": max(r["top1"] for r in per_lambda)}
