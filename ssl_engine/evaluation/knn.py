"""Weighted k-nearest-neighbour classification of features by cosine similarity.

Each test feature's ``topk`` most similar train features vote for their labels with weight
``exp(similarity / sigma)`` (or 1 each with ``sigma=None``: a majority vote); classes are ranked
by their summed weight, ties going to the smaller class index. Similarities are computed for
``chunk_size`` test features at a time, so memory stays within ``chunk_size x N`` besides the
train features.
"""
from typing import Dict, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F

from ssl_engine.utils.progress import Progress

ArrayLike = Union[np.ndarray, torch.Tensor]


def as_tensor(values: ArrayLike, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``dtype`` from a numpy array or a tensor."""
    tensor = values if isinstance(values, torch.Tensor) else torch.from_numpy(np.asarray(values))
    return tensor.detach().to("cpu", dtype)


def _check_inputs(features: torch.Tensor, labels: Optional[torch.Tensor], name: str) -> None:
    if features.dim() != 2:
        raise ValueError(f"{name} features must be [num_samples, dim], got shape "
                         f"{tuple(features.shape)}")
    if labels is not None:
        if labels.shape != (features.shape[0],):
            raise ValueError(f"{name} labels must be [{features.shape[0]}] to match the "
                             f"features, got shape {tuple(labels.shape)}")
        if labels.numel() and int(labels.min()) < 0:
            raise ValueError(f"{name} labels must be non-negative class indices, "
                             f"found {int(labels.min())}")


def knn_predict(
    train_features: ArrayLike,
    train_labels: ArrayLike,
    test_features: ArrayLike,
    topk: int = 20,
    sigma: Optional[float] = 0.07,
    num_classes: Optional[int] = None,
    chunk_size: int = 1024,
    device: Union[str, torch.device] = "cpu",
    num_ranked: int = 5,
) -> torch.Tensor:
    """The ``min(num_ranked, num_classes)`` best-voted classes of every test feature, best
    first: a [M, R] long tensor on the CPU. ``topk`` larger than the train set is clipped."""
    train = as_tensor(train_features, torch.float32)
    labels = as_tensor(train_labels, torch.long)
    test = as_tensor(test_features, torch.float32)
    _check_inputs(train, labels, "train")
    _check_inputs(test, None, "test")
    if train.shape[0] == 0:
        raise ValueError("k-NN needs at least one train feature")
    if train.shape[1] != test.shape[1]:
        raise ValueError(f"train features have dimension {train.shape[1]} but test features "
                         f"have {test.shape[1]}")
    if topk < 1 or chunk_size < 1:
        raise ValueError(f"topk and chunk_size must be positive, got {topk} and {chunk_size}")
    if sigma is not None and sigma <= 0:
        raise ValueError(f"sigma must be positive (or None for a majority vote), got {sigma}")
    num_classes = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if int(labels.max()) >= num_classes:
        raise ValueError(f"train label {int(labels.max())} is not below num_classes={num_classes}")
    k = min(int(topk), train.shape[0])
    ranked = min(int(num_ranked), num_classes)

    device = torch.device(device)
    train = F.normalize(train.to(device), dim=1)
    labels = labels.to(device)
    predictions = []
    progress = Progress("k-NN", test.shape[0], unit="queries")  # a line every 10 s at most
    for start in range(0, test.shape[0], chunk_size):
        chunk = F.normalize(test[start:start + chunk_size].to(device), dim=1)
        similarity = chunk @ train.T  # [chunk, N]
        top_sim, top_idx = similarity.topk(k, dim=1)
        del similarity
        if sigma is None:
            weights = torch.ones_like(top_sim)
        else:  # shifted by each row's best similarity: same ranking, no overflow for small sigma
            weights = ((top_sim - top_sim[:, :1]) / sigma).exp()
        scores = torch.zeros(chunk.shape[0], num_classes, device=device)
        scores.scatter_add_(1, labels[top_idx], weights)
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices
        predictions.append(order[:, :ranked].cpu())
        progress.update(chunk.shape[0])
    if not predictions:
        return torch.empty(0, ranked, dtype=torch.long)
    return torch.cat(predictions)


def topk_accuracies(ranked_predictions: torch.Tensor, labels: ArrayLike) -> Dict[str, float]:
    """Top-1 and top-5 accuracy in percent of [M, R] ranked predictions (top-5 uses all R
    columns when R < 5)."""
    labels = as_tensor(labels, torch.long)
    if labels.shape != (ranked_predictions.shape[0],):
        raise ValueError(f"test labels must be [{ranked_predictions.shape[0]}], got shape "
                         f"{tuple(labels.shape)}")
    if labels.numel() == 0:
        raise ValueError("accuracy needs at least one test sample")
    hits = ranked_predictions == labels[:, None]
    return {"top1": 100.0 * hits[:, :1].any(1).double().mean().item(),
            "top5": 100.0 * hits[:, :5].any(1).double().mean().item()}


def knn_classify(
    train_features: ArrayLike,
    train_labels: ArrayLike,
    test_features: ArrayLike,
    test_labels: ArrayLike,
    topk: int = 20,
    sigma: Optional[float] = 0.07,
    num_classes: Optional[int] = None,
    chunk_size: int = 1024,
    device: Union[str, torch.device] = "cpu",
) -> Dict[str, float]:
    """``{"top1": %, "top5": %}`` of the weighted k-NN classifier (see the module docstring).
    ``num_classes`` defaults to the largest train or test label plus one."""
    test_labels = as_tensor(test_labels, torch.long)
    if num_classes is None:
        train_max = int(as_tensor(train_labels, torch.long).max())
        num_classes = max(train_max, int(test_labels.max()) if test_labels.numel() else 0) + 1
    ranked = knn_predict(train_features, train_labels, test_features, topk=topk, sigma=sigma,
                         num_classes=num_classes, chunk_size=chunk_size, device=device)
    return topk_accuracies(ranked, test_labels)
