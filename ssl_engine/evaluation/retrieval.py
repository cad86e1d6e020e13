"""Instance retrieval (VISSL's IMG_RETRIEVAL benchmark) on arrays: pooling of a convolutional
feature map into region descriptors (R-MAC or GeM), PCA whitening, the aggregation into one
descriptor per image, the similarity ranking, and the scores of the Revisited Oxford / Paris
protocol and of Copydays. The datasets' files are read by ``retrieval_data.py``; the model is
run by ``tools/instance_retrieval_test.py`` (``ssl_engine/engines/instance_retrieval.py``).

Descriptor of one image (``describe``), for each scale of IMG_RETRIEVAL.IMG_SCALINGS:

1. the feature map ``[C, H, W]`` of the layer gives region vectors ``[R, C]``: R-MAC's regions
   (Tolias et al., ICLR 2016) at SPATIAL_LEVELS levels, each max-pooled; or one GeM vector
   ``(mean x^p)^(1/p)`` (GEM_POOL_POWER); or, with FEATS_PROCESSING_TYPE "", the features as
   extracted, flattened;
2. with NORMALIZE_FEATURES each region vector is l2-normalised; with whitening (fitted on the
   region vectors of the train images, TRAIN_PCA_WHITENING, N_PCA) each is whitened and
   l2-normalised again;
3. the region vectors are summed, and the sum l2-normalised (NORMALIZE_FEATURES).

The descriptors of the scales are averaged and l2-normalised again (NORMALIZE_FEATURES).
"""
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

EPS = 1e-6
OVERLAP = 0.4  # R-MAC: the overlap of neighbouring regions sought along the longer side


def l2_normalize(rows: np.ndarray) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.maximum(np.linalg.norm(rows, axis=-1, keepdims=True), EPS)


def rmac_regions(height: int, width: int, levels: int) -> List[tuple]:
    """(x, y, side) of the square R-MAC regions of an ``height`` x ``width`` map: at level l,
    regions of side floor(2 min(H, W) / (l + 1)) spread evenly along both sides, l of them
    along the shorter side and l plus a few along the longer one (the number whose overlap is
    closest to 40%), clipped to the map."""
    short, long_side = min(height, width), max(height, width)
    steps = np.arange(2, 8, dtype=np.float64)
    spacing = (long_side - short) / (steps - 1)
    extra = int(np.argmin(np.abs((short ** 2 - short * spacing) / short ** 2 - OVERLAP))) + 1
    extra_w = extra if height < width else 0
    extra_h = extra if height > width else 0
    regions = []
    for level in range(1, levels + 1):
        side = int(np.floor(2 * short / (level + 1)))
        if side == 0:
            continue
        half = np.floor(side / 2 - 1)

        def starts(length: int, count: int) -> List[int]:
            step = (length - side) / (count - 1) if count > 1 else 0.0
            return [min(int(round(np.floor(half + step * k) - half)), length - side)
                    for k in range(count)]

        for y in starts(height, level + extra_h):
            for x in starts(width, level + extra_w):
                regions.append((max(x, 0), max(y, 0), side))
    return regions


def region_vectors(feature_map: torch.Tensor, kind: str, levels: int = 3,
                   gem_power: float = 4.0) -> torch.Tensor:
    """``[R, C]`` vectors of one ``[C, H, W]`` map: "rmac" (max over each R-MAC region), "gem"
    (one generalised mean), "" (the map flattened: one vector)."""
    if kind == "rmac":
        if feature_map.dim() != 3:
            raise ValueError("FEATS_PROCESSING_TYPE=rmac needs a spatial feature map [C, H, W]: "
                             "use an Identity pool op and SHOULD_FLATTEN_FEATS=false")
        _, height, width = feature_map.shape
        return torch.stack([feature_map[:, y:y + s, x:x + s].amax(dim=(1, 2))
                            for x, y, s in rmac_regions(height, width, levels)])
    if kind == "gem":
        if feature_map.dim() != 3:
            raise ValueError("FEATS_PROCESSING_TYPE=gem needs a spatial feature map [C, H, W]")
        pooled = feature_map.clamp(min=EPS).pow(gem_power).mean(dim=(1, 2))
        return pooled.pow(1.0 / gem_power)[None]
    if kind == "":
        return feature_map.reshape(1, -1)
    raise ValueError(f"config.IMG_RETRIEVAL.FEATS_PROCESSING_TYPE={kind!r}: use rmac, gem or "
                     "'' (the features as extracted)")


class Whitening:
    """PCA whitening (scikit-learn's PCA with ``whiten=True``) fitted on region vectors."""

    def __init__(self, n_components: int, seed: int = 0):
        self.n_components = int(n_components)
        self.seed = seed
        self.pca = None

    def fit(self, rows: np.ndarray) -> "Whitening":
        from sklearn.decomposition import PCA

        rows = np.asarray(rows, dtype=np.float64)
        most = min(rows.shape)
        if self.n_components > most:
            raise ValueError(
                f"config.IMG_RETRIEVAL.N_PCA={self.n_components} is more than the "
                f"{rows.shape[0]} train region vectors of dimension {rows.shape[1]} allow "
                f"(at most {most}): lower N_PCA or give more train images")
        self.pca = PCA(n_components=self.n_components, whiten=True,
                       random_state=self.seed).fit(rows)
        return self

    def apply(self, rows: np.ndarray) -> np.ndarray:
        return self.pca.transform(np.asarray(rows, dtype=np.float64)).astype(np.float32)


def describe(per_scale: Sequence[np.ndarray], whitening: Optional[Whitening] = None,
             normalize: bool = True) -> np.ndarray:
    """One image's descriptor from its region vectors at each scale (``[R_s, C]`` each); the
    steps are those of the module's docstring."""
    descriptors = []
    for regions in per_scale:
        regions = np.asarray(regions, dtype=np.float32)
        if normalize:
            regions = l2_normalize(regions)
        if whitening is not None:
            regions = whitening.apply(regions)
            if normalize:
                regions = l2_normalize(regions)
        summed = regions.sum(axis=0)
        descriptors.append(l2_normalize(summed) if normalize else summed)
    mean = np.mean(descriptors, axis=0)
    return l2_normalize(mean) if normalize else mean


def similarity(queries: np.ndarray, database: np.ndarray,
               measure: str = "cosine_similarity") -> np.ndarray:
    """[Q, N] scores, higher is closer: the dot product of the (l2-normalised, with
    cosine_similarity) descriptors, or minus the Euclidean distance (l2). Exact search."""
    q = torch.as_tensor(np.asarray(queries, dtype=np.float32))
    d = torch.as_tensor(np.asarray(database, dtype=np.float32))
    if measure == "cosine_similarity":
        return (torch.nn.functional.normalize(q, dim=1, eps=EPS)
                @ torch.nn.functional.normalize(d, dim=1, eps=EPS).T).numpy()
    if measure == "l2":
        return (-torch.cdist(q, d)).numpy()
    raise ValueError(f"config.IMG_RETRIEVAL.SIMILARITY_MEASURE={measure!r}: use "
                     "cosine_similarity or l2")


def rankings(scores: np.ndarray) -> np.ndarray:
    """[Q, N] database indices of each query, best first (ties: lower index first)."""
    return np.argsort(-np.asarray(scores), axis=1, kind="stable")


def average_precision(positions: np.ndarray, num_positives: int) -> float:
    """The Oxford protocol's AP: ``positions`` (0-based, increasing) of the positives in the
    ranking with the ignored images taken out; the precision-recall curve integrated by
    trapezoids, one step of recall 1/num_positives per positive."""
    ap = 0.0
    for j, rank in enumerate(positions):
        before = 1.0 if rank == 0 else j / rank
        after = (j + 1) / (rank + 1)
        ap += (before + after) / 2.0 / num_positives
    return ap


def _positions(ranking: np.ndarray, positives, ignored) -> np.ndarray:
    """Positions of ``positives`` in ``ranking`` once the ``ignored`` images are taken out."""
    where = np.empty(len(ranking), dtype=np.int64)
    where[ranking] = np.arange(len(ranking))
    kept = np.ones(len(ranking), dtype=bool)
    kept[where[np.asarray(list(ignored), dtype=np.int64)]] = False
    shift = np.cumsum(~kept)  # ignored images at or before each position
    pos = np.sort(where[np.asarray(list(positives), dtype=np.int64)])
    return pos - shift[pos]


def mean_average_precision(ranks: np.ndarray, ground_truth: Sequence[Dict[str, Sequence[int]]],
                           ks: Sequence[int] = (1, 5, 10)) -> Dict[str, object]:
    """mAP and mP@k over the queries of ``ground_truth`` (per query ``ok``: the positives,
    ``junk``: ignored). A query without positives is left out of the means. P@k follows the
    Revisited protocol: with the last positive at position m (1-based), P@k is the share of
    positives among the first min(k, m) images."""
    aps, precisions = [], []
    for ranking, truth in zip(ranks, ground_truth):
        positives = list(truth["ok"])
        if not positives:
            continue
        pos = _positions(ranking, positives, truth.get("junk", ()))
        aps.append(average_precision(pos, len(positives)))
        one_based = pos + 1
        precisions.append([np.sum(one_based <= min(one_based.max(), k)) /
                           min(one_based.max(), k) for k in ks])
    if not aps:
        return {"mAP": float("nan"), "mP@k": {str(k): float("nan") for k in ks}, "queries": 0}
    mp = np.mean(precisions, axis=0)
    return {"mAP": round(100 * float(np.mean(aps)), 4),
            "mP@k": {str(k): round(100 * float(p), 4) for k, p in zip(ks, mp)},
            "queries": len(aps)}


def revisited_scores(ranks: np.ndarray, gnd: Sequence[dict],
                     ks: Sequence[int] = (1, 5, 10)) -> Dict[str, dict]:
    """The Revisited Oxford / Paris protocol (Radenovic et al., CVPR 2018): per query, ``easy``
    positives with the hard ones ignored, ``medium`` the easy and hard positives, ``hard``
    the hard positives with the easy ones ignored; ``junk`` is always ignored."""
    def split(ok_keys, ignored_keys):
        return [{"ok": [i for k in ok_keys for i in g.get(k, [])],
                 "junk": [i for k in ignored_keys for i in g.get(k, [])]} for g in gnd]

    return {"easy": mean_average_precision(ranks, split(["easy"], ["junk", "hard"]), ks),
            "medium": mean_average_precision(ranks, split(["easy", "hard"], ["junk"]), ks),
            "hard": mean_average_precision(ranks, split(["hard"], ["junk", "easy"]), ks)}
