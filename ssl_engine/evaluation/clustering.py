"""k-means of extracted features for ClusterFit (tools/cluster_features_and_label.py).

``kmeans`` is Lloyd's algorithm in torch, exact (every distance computed, in chunks): seeded
initial centroids drawn among the points, then ``num_iter`` rounds of assignment to the nearest
centroid and centroid update; a cluster left empty takes the point farthest from its centroid.
faiss's k-means (``faiss.Kmeans``), when faiss is installed, is the faster choice for millions
of points; both return centroids, and ``assign`` gives every point its nearest one.
"""
import logging
from typing import Tuple

import numpy as np
import torch

from ssl_engine.utils.progress import Progress

logger = logging.getLogger(__name__)

CHUNK = 4096  # points whose distances to every centroid are computed at once


def l2_normalize(features: np.ndarray) -> np.ndarray:
    """Rows divided by their norm + 1e-5 (as ClusterFit normalised them)."""
    features = np.asarray(features, dtype=np.float32)
    return features / (np.linalg.norm(features, axis=1, keepdims=True) + 1e-5)


def assign(features: np.ndarray, centroids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(index of the nearest centroid [N] int64, its squared distance [N] float32)."""
    points = torch.as_tensor(np.asarray(features, dtype=np.float32))
    centres = torch.as_tensor(np.asarray(centroids, dtype=np.float32))
    labels, distances = [], []
    for chunk in points.split(CHUNK):
        d = torch.cdist(chunk.double(), centres.double()).pow(2)
        best, index = d.min(dim=1)
        labels.append(index)
        distances.append(best.float())
    return torch.cat(labels).numpy().astype(np.int64), torch.cat(distances).numpy()


def kmeans(features: np.ndarray, num_clusters: int, num_iter: int, seed: int = 0) -> np.ndarray:
    """Centroids [num_clusters, D] of Lloyd's k-means (see the module's docstring)."""
    points = np.asarray(features, dtype=np.float32)
    if not 0 < num_clusters <= len(points):
        raise ValueError(f"CLUSTERFIT.NUM_CLUSTERS={num_clusters} needs between 1 and the "
                         f"number of features ({len(points)})")
    rng = np.random.RandomState(seed)
    centroids = points[rng.choice(len(points), num_clusters, replace=False)].astype(np.float64)
    progress = Progress("k-means", num_iter, unit="iterations")  # a line every 10 s at most
    for _ in range(num_iter):
        labels, distances = assign(points, centroids)
        sums = np.zeros_like(centroids)
        np.add.at(sums, labels, points.astype(np.float64))
        counts = np.bincount(labels, minlength=num_clusters)
        empty = np.flatnonzero(counts == 0)
        far = np.argsort(-distances)[:len(empty)]
        centroids = np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None],
                             centroids)
        centroids[empty] = points[far]
        progress.update()
    return centroids.astype(np.float32)


def faiss_kmeans(features: np.ndarray, num_clusters: int, num_iter: int,
                 seed: int = 0) -> np.ndarray:
    """Centroids from faiss.Kmeans (ImportError where faiss is not installed)."""
    import faiss

    points = np.ascontiguousarray(features, dtype=np.float32)
    model = faiss.Kmeans(points.shape[1], num_clusters, niter=num_iter, seed=seed)
    model.train(points)
    return np.asarray(model.centroids, dtype=np.float32)
