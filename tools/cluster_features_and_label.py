#!/usr/bin/env python
"""ClusterFit's first step (VISSL's CLUSTERFIT section): cluster the extracted features of a
split with k-means and write every image's cluster as its pseudo-label.

    python tools/cluster_features_and_label.py \
        config=pretrain/clusterfit/cluster_features_resnet_8gpu_imagenet \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint>

1. The features of CLUSTERFIT.FEATURES.LAYER_NAME (default: the first extracted layer) of the
   DATA_PARTITION split (and of TEST_PARTITION, when it has data) come from the extraction
   folder (EXTRACT_FEATURES.OUTPUT_DIR or CHECKPOINT.DIR; CLUSTERFIT.FEATURES.PATH names another
   one), extracted first by the extract_features engine where missing or stale, or always with
   CLUSTERFIT.FEATURES.EXTRACT=true.
2. Rows l2-normalised (norm + 1e-5); with DIMENSIONALITY_REDUCTION=d > 0, projected first on the
   d principal components of the clustered features (scikit-learn's PCA).
3. k-means with NUM_CLUSTERS clusters and NUM_ITER iterations, fitted on CLUSTERFIT.DATA_LIMIT
   seeded rows (-1: all; DATA_LIMIT_SAMPLING.SEED); CLUSTER_BACKEND=faiss uses faiss where it is
   installed, else the engine's exact k-means (ssl_engine/evaluation/clustering.py), with a
   warning.
4. Every row of each split assigned to its nearest centroid; into CLUSTERFIT.OUTPUT_DIR:
   ``<DATASET_NAME>_<split>_N<NUM_CLUSTERS>_<CLUSTER_BACKEND>_lbls.npy`` (int64 [N] in dataset
   order: the label file a ClusterFit training config reads, e.g. with LABEL_SOURCES
   [disk_filelist]) and ``..._N<k>_<backend>.pkl`` (hard_labels, centroids, distances).
"""
import logging
import pickle
import sys
from pathlib import Path

import numpy as np

from ssl_engine.engines.evaluate_extracted import evaluation_layer, get_or_extract, run_tool
from ssl_engine.evaluation.clustering import assign, faiss_kmeans, kmeans, l2_normalize
from ssl_engine.extraction.files import load_extracted

logger = logging.getLogger("cluster_features_and_label")


def _features(cfg, layer, splits):
    settings = cfg.CLUSTERFIT.FEATURES
    if settings.PATH not in ("", ".") and not settings.EXTRACT:
        return {split: load_extracted(settings.PATH, split, layer) for split in splits}
    if settings.EXTRACT:
        cfg.EXTRACT_FEATURES.OUTPUT_DIR = "" if settings.PATH in ("", ".") else settings.PATH
    return get_or_extract(cfg, layer, splits)


def _centroids(cfg, points: np.ndarray) -> np.ndarray:
    fit = cfg.CLUSTERFIT
    if fit.DATA_LIMIT > 0 and fit.DATA_LIMIT < len(points):
        rows = np.random.RandomState(fit.DATA_LIMIT_SAMPLING.SEED).choice(
            len(points), fit.DATA_LIMIT, replace=False)
        points = points[rows]
    if fit.CLUSTER_BACKEND == "faiss":
        try:
            return faiss_kmeans(points, fit.NUM_CLUSTERS, fit.NUM_ITER, cfg.SEED_VALUE)
        except ImportError:
            logger.warning("CLUSTERFIT.CLUSTER_BACKEND=faiss: faiss is not installed; the "
                           "exact k-means of the engine runs instead")
    return kmeans(points, fit.NUM_CLUSTERS, fit.NUM_ITER, cfg.SEED_VALUE)


def run(cfg):
    fit = cfg.CLUSTERFIT
    split, test = fit.FEATURES.DATA_PARTITION.upper(), fit.FEATURES.TEST_PARTITION.upper()
    splits = [split] + ([test] if test and test != split and cfg.DATA[test].DATA_SOURCES else [])
    layer = evaluation_layer(cfg, fit.FEATURES.LAYER_NAME)
    data = _features(cfg, layer, splits)
    rows = {s: l2_normalize(data[s].features.reshape(len(data[s].features), -1)) for s in splits}
    if fit.FEATURES.DIMENSIONALITY_REDUCTION > 0:
        from sklearn.decomposition import PCA

        pca = PCA(n_components=fit.FEATURES.DIMENSIONALITY_REDUCTION,
                  random_state=cfg.SEED_VALUE).fit(rows[split])
        rows = {s: pca.transform(r).astype(np.float32) for s, r in rows.items()}
    centroids = _centroids(cfg, rows[split])
    out = Path(fit.OUTPUT_DIR or cfg.CHECKPOINT.DIR).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    record = {"layer": layer, "num_clusters": fit.NUM_CLUSTERS, "files": {}}
    for s in splits:
        labels, distances = assign(rows[s], centroids)
        stem = out / f"{fit.FEATURES.DATASET_NAME}_{s.lower()}_N{fit.NUM_CLUSTERS}_" \
                     f"{fit.CLUSTER_BACKEND}"
        np.save(f"{stem}_lbls.npy", labels)
        with open(f"{stem}.pkl", "wb") as f:
            pickle.dump({"hard_labels": labels[:, None], "centroids": centroids,
                         "distances": distances[:, None]}, f)
        sizes = np.bincount(labels, minlength=fit.NUM_CLUSTERS)
        print(f"clusters of {s}: {len(labels)} images in {fit.NUM_CLUSTERS} clusters "
              f"(sizes {sizes.min()} to {sizes.max()}) -> {stem}_lbls.npy")
        record["files"][s] = f"{stem}_lbls.npy"
    return out, {"clusterfit": record}


def main(argv) -> int:
    return run_tool(argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
