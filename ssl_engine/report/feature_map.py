"""The 2-D map of the report: features of (at most MAX_SAMPLES images of) the TEST split, of the
learned trunk and of the raw pixels, laid out by t-SNE (scikit-learn) or UMAP where
``umap-learn`` is installed. Computed by the run report hook at the end of training, or by
tools/report.py from a checkpoint; on one process, no collective."""
import importlib.util
from typing import Dict, NamedTuple, Optional

import numpy as np
import torch

from ssl_engine.data import build_dataset
from ssl_engine.data.seeding import seeded_rngs
from ssl_engine.evaluation.labelled_features import (FirstView, eval_data_config,
                                                     evaluation_mode)

BATCH = 256
PCA_DIMS = 50
EXACT_TSNE_MAX = 800


class MapPoints(NamedTuple):
    """Per kind of features ("learned", "raw_pixels"), [N, 2] coordinates; labels [N] or None."""

    points: Dict[str, np.ndarray]
    labels: Optional[np.ndarray]
    method: str  # "t-SNE" or "UMAP"
    layer: str


def has_test_split(cfg) -> bool:
    return bool(cfg.DATA.TEST.DATA_SOURCES)


def sample_indices(size: int, max_samples: int) -> np.ndarray:
    """At most ``max_samples`` indices spread evenly over 0..size-1 (every part of the split)."""
    if size <= max_samples:
        return np.arange(size)
    return np.unique(np.linspace(0, size - 1, max_samples).round().astype(int))


@torch.no_grad()
def test_split_features(cfg, model, layer: str, device: torch.device, max_samples: int):
    """({"learned": [N, D], "raw_pixels": [N, P]}, labels [N]) of evenly spread TEST samples
    read with the TEST transforms (first view). The model's modes and the random generators
    are given back as they were."""
    dataset = FirstView(build_dataset(eval_data_config(cfg), "TEST"))
    indices = sample_indices(len(dataset), max_samples)
    learned, pixels, labels = [], [], []
    with evaluation_mode(model), seeded_rngs(int(cfg.SEED_VALUE)):
        for start in range(0, len(indices), BATCH):
            samples = [dataset[int(i)] for i in indices[start:start + BATCH]]
            images = torch.stack([sample["data"][0] for sample in samples]).to(device)
            learned.append(model.trunk(images, out_feat_keys=[layer])[0].flatten(1).float().cpu())
            pixels.append(images.flatten(1).float().cpu())
            labels.extend(int(np.asarray(sample["label"][0]).reshape(-1)[0]) for sample in samples)
    return ({"learned": torch.cat(learned).numpy(), "raw_pixels": torch.cat(pixels).numpy()},
            np.asarray(labels))


def umap_available() -> bool:
    return importlib.util.find_spec("umap") is not None


def embed_2d(features: np.ndarray, seed: int = 0) -> np.ndarray:
    """[N, 2] coordinates of ``features`` [N, D]: UMAP when installed, else t-SNE."""
    features = np.asarray(features, dtype=np.float32)
    if len(features) < 4:  # too few points for a neighbourhood: the first two PCA axes
        centred = features - features.mean(0)
        coords = centred @ np.linalg.svd(centred, full_matrices=False)[2][:2].T
        return np.pad(coords, ((0, 0), (0, 2 - coords.shape[1])))
    if umap_available():
        import umap  # inside: optional, found only where umap-learn is installed
        return umap.UMAP(n_components=2, random_state=seed).fit_transform(features)
    # inside: scikit-learn's manifold module takes seconds to load, only a map needs it
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE
    if min(features.shape) > PCA_DIMS:  # the usual first step: t-SNE's neighbours on 50 axes
        features = PCA(PCA_DIMS, random_state=seed).fit_transform(features)
    perplexity = float(min(30.0, (len(features) - 1) / 3))
    small = len(features) <= EXACT_TSNE_MAX  # exact gradients: faster than Barnes-Hut there
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed,
                method="exact" if small else "barnes_hut",
                max_iter=250 if len(features) < 100 else 500).fit_transform(features)


def feature_map(cfg, model, layer: str, device: torch.device, max_samples: int) -> MapPoints:
    """The map of the TEST split's learned features beside its raw pixels'."""
    features, labels = test_split_features(cfg, model, layer, device, max_samples)
    points = {name: embed_2d(values, seed=int(cfg.SEED_VALUE)) for name, values in features.items()}
    has_labels = len(labels) and len(np.unique(labels)) > 1
    return MapPoints(points, labels if has_labels else None,
                     "UMAP" if umap_available() else "t-SNE", layer)
