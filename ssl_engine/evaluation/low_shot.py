"""Low-shot evaluation: classify the test set with a few labelled train images per class."""
from typing import Dict, Sequence

import numpy as np
import torch

from ssl_engine.evaluation.knn import ArrayLike, as_tensor, knn_predict, topk_accuracies


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
    for shot in shots:
        per_seed = []
        for seed in seeds:
            picked = torch.from_numpy(sample_low_shot(labels, int(shot), int(seed)))
            ranked = knn_predict(train[picked], labels[picked], test_features, topk=k,
                                 sigma=None, num_classes=num_classes, num_ranked=1)
            per_seed.append(topk_accuracies(ranked, test_labels)["top1"])
        results[int(shot)] = {"mean": float(np.mean(per_seed)), "std": float(np.std(per_seed)),
                              "per_seed": per_seed}
    return results
