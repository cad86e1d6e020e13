"""Cluster assignments of a SwAV model (VISSL's ``engine_name=extract_cluster``): every image
of every split of EXTRACT_FEATURES.SPLITS is assigned to the prototype its embedding scores
highest, for each set of prototypes of the model's swav_head; streamed to disk as the features
are (``write_splits.py``: any number of processes, rows in dataset order). Called by
``extractor.FeatureExtractor.extract_cluster_assignments``; its config check by the
``extract_cluster`` engine before launch.

Into EXTRACT_FEATURES.OUTPUT_DIR (or CHECKPOINT.DIR), per split and prototype set
(``prototypes``, or ``prototypes0``, ``prototypes1``, ... with several ``num_clusters``):

- ``<split>_<set>_assignments.npy``: int64 [N, 1], the index of the highest-scoring prototype;
- ``<split>_<set>_targets.npy``, ``<split>_<set>_inds.npy``: the labels and dataset indices.
"""
import logging
from pathlib import Path
from typing import Dict, List

import numpy as np
import torch

from ssl_engine.extraction.write_splits import extract_features
from ssl_engine.utils.distributed import get_rank

logger = logging.getLogger(__name__)

KIND = "assignments"
HEAD_NEEDED = ("engine_name=extract_cluster assigns images to the prototypes of a swav_head: "
               "the last head of config.MODEL.HEAD.PARAMS must be one")


def assignment_paths(folder, split: str, name: str) -> Dict[str, Path]:
    stem = f"{split.lower()}_{name}"
    return {"features": Path(folder) / f"{stem}_{KIND}.npy",
            "targets": Path(folder) / f"{stem}_targets.npy",
            "inds": Path(folder) / f"{stem}_inds.npy"}


def check_cluster_config(cfg) -> None:
    """A swav_head last, and the heads evaluated (not the trunk's features)."""
    heads = cfg.MODEL.HEAD.PARAMS
    if not heads or heads[-1][0] not in ("swav_head", "swav_head_fsdp"):
        raise ValueError(HEAD_NEEDED)
    if cfg.MODEL.FEATURE_EVAL_SETTINGS.get("EXTRACT_TRUNK_FEATURES_ONLY", False):
        raise ValueError("engine_name=extract_cluster runs the heads: set config.MODEL."
                         "FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=false")


def prototype_sets(model) -> List[str]:
    """The names of the model's prototype sets, in the order of its head's scores."""
    head = model.heads[-1] if len(model.heads) else None
    if head is None or not hasattr(head, "prototype_layers"):
        raise ValueError(HEAD_NEEDED)
    count = len(head.prototype_layers())
    if count == 0:
        raise ValueError("the swav_head has no prototypes (num_clusters is empty)")
    return ["prototypes"] if count == 1 else [f"prototypes{i}" for i in range(count)]


def extract_cluster_assignments(model: torch.nn.Module, datasets: Dict[str, object], cfg,
                                device: torch.device, folder: Path) -> Dict[str, Dict]:
    """Write the files above for every dataset (split -> dataset); return
    {split: {set: {"features" | "targets" | "inds": path}}}."""
    names = prototype_sets(model)

    def assign(inputs) -> Dict[str, torch.Tensor]:
        scores = model(inputs)[-len(names):]  # after the embedding, when the head returns it
        return {name: score.float().argmax(dim=1, keepdim=True)
                for name, score in zip(names, scores)}

    written = extract_features(model, datasets, cfg, device, folder, layers=names,
                               features_fn=assign, paths=assignment_paths, index=False)
    if get_rank() == 0:
        for split, per_set in written.items():
            for name, files in per_set.items():
                assignments = np.load(files["features"])[:, 0]
                sizes = np.bincount(assignments)
                logger.info("%s %s: %d images in %d clusters (largest %d)", split, name,
                            len(assignments), int((sizes > 0).sum()), int(sizes.max()))
    return written
