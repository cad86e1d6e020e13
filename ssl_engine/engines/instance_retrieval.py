"""VISSL's instance-retrieval benchmark (IMG_RETRIEVAL), run by
``tools/instance_retrieval_test.py``: the frozen trunk's feature map of every image, pooled
into one descriptor (``ssl_engine/evaluation/retrieval.py``), the database ranked for every
query, and the dataset's scores (``ssl_engine/evaluation/retrieval_data.py``).

One process (as VISSL's tool: one device), images one at a time at their own size. The
whitening's train region vectors are held in memory (at most NUM_TRAINING_SAMPLES images); the
database and query descriptors are computed after it is fitted.
"""
import logging
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from ssl_engine.checkpoint import load_weights_init
from ssl_engine.config import AttrDict, ConfigError
from ssl_engine.config.derive import derive_settings
from ssl_engine.engines.prelaunch import check_config_before_launch
from ssl_engine.evaluation.retrieval import (Whitening, describe, rankings, region_vectors,
                                             similarity)
from ssl_engine.evaluation.retrieval_data import load_image, open_dataset
from ssl_engine.models import build_model
from ssl_engine.trainer.process import select_device
from ssl_engine.utils.cpu_budget import configure_threads
from ssl_engine.utils.progress import Progress

logger = logging.getLogger(__name__)

PROCESSING = ("rmac", "gem", "")
MEASURES = ("cosine_similarity", "l2")
DEBUG_LIMITS = {"NUM_TRAINING_SAMPLES": 10, "NUM_QUERY_SAMPLES": 10, "NUM_DATABASE_SAMPLES": 50}


def check_retrieval_config(cfg: AttrDict) -> AttrDict:
    """Derived settings (DATA may name no source: the images come from
    IMG_RETRIEVAL.DATASET_PATH) and what the tool refuses from the config alone; returns
    ``cfg``. ConfigError or ValueError naming the key."""
    derive_settings(cfg, reads_data=False)
    check_config_before_launch("extract_features", cfg)
    r = cfg.IMG_RETRIEVAL
    if not r.DATASET_PATH:
        raise ConfigError("config.IMG_RETRIEVAL.DATASET_PATH is empty: the folder holding "
                          "the datasets TRAIN_DATASET_NAME and EVAL_DATASET_NAME")
    if r.FEATS_PROCESSING_TYPE not in PROCESSING:
        raise ConfigError(f"config.IMG_RETRIEVAL.FEATS_PROCESSING_TYPE="
                          f"{r.FEATS_PROCESSING_TYPE!r}: use rmac, gem or '' (as extracted)")
    if r.SIMILARITY_MEASURE not in MEASURES:
        raise ConfigError(f"config.IMG_RETRIEVAL.SIMILARITY_MEASURE={r.SIMILARITY_MEASURE!r}: "
                          f"use {' or '.join(MEASURES)}")
    if not r.IMG_SCALINGS or any(float(s) <= 0 for s in r.IMG_SCALINGS):
        raise ConfigError(f"config.IMG_RETRIEVAL.IMG_SCALINGS={list(r.IMG_SCALINGS)}: give "
                          "positive scales (1: the image at RESIZE_IMG)")
    if r.RESIZE_IMG < 1 or (r.TRAIN_PCA_WHITENING and r.N_PCA < 1) or r.SPATIAL_LEVELS < 1:
        raise ConfigError("config.IMG_RETRIEVAL.RESIZE_IMG, N_PCA (with TRAIN_PCA_WHITENING) "
                          "and SPATIAL_LEVELS must be >= 1")
    if not cfg.MODEL.FEATURE_EVAL_SETTINGS.get("EXTRACT_TRUNK_FEATURES_ONLY", False):
        raise ConfigError("instance retrieval pools the trunk's feature map: set "
                          "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true")
    if r.USE_FEATURE_EXTRACTION_ENGINE:
        logger.warning("config.IMG_RETRIEVAL.USE_FEATURE_EXTRACTION_ENGINE=true: the features "
                       "are computed by the retrieval tool itself, image by image, as with "
                       "false (the same features)")
    return cfg


def _limits(cfg) -> Dict[str, int]:
    r = cfg.IMG_RETRIEVAL
    limits = {key: int(r[key]) for key in DEBUG_LIMITS}
    if r.DEBUG_MODE:
        limits = {k: (DEBUG_LIMITS[k] if v == -1 else v) for k, v in limits.items()}
    return limits


class _Describer:
    """The frozen model and the settings that turn an image into region vectors."""

    def __init__(self, cfg):
        self.r = cfg.IMG_RETRIEVAL
        configure_threads(cfg)
        self.device = select_device(cfg, 0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.SEED_VALUE)
            model = build_model(cfg.MODEL)
        if cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE:
            load_weights_init(model, cfg.MODEL.WEIGHTS_INIT)
        else:
            logger.warning("config.MODEL.WEIGHTS_INIT.PARAMS_FILE is empty: the features of a "
                           "randomly initialised model")
        self.layer = model.extract_layer_names()[0]
        self.model = model.to(self.device).eval().requires_grad_(False)

    @torch.no_grad()
    def regions(self, path: Path, box: Optional[tuple] = None) -> List[np.ndarray]:
        """[R, C] region vectors of the image at each scale of IMG_SCALINGS."""
        out = []
        for scale in self.r.IMG_SCALINGS:
            image = load_image(path, self.r.RESIZE_IMG, float(scale), self.r.CENTER_CROP, box)
            feature_map = self.model.extract_layers(image.to(self.device))[self.layer][0]
            out.append(region_vectors(feature_map.float().cpu(), self.r.FEATS_PROCESSING_TYPE,
                                      self.r.SPATIAL_LEVELS, self.r.GEM_POOL_POWER).numpy())
        return out


def _descriptors(describer, paths, boxes, whitening, what: str) -> np.ndarray:
    rows = []
    progress = Progress(what, len(paths), unit="images")  # a line every 10 s at most
    for i, path in enumerate(paths):
        rows.append(describe(describer.regions(path, boxes[i] if boxes else None), whitening,
                             describer.r.NORMALIZE_FEATURES))
        progress.update()
    return np.stack(rows).astype(np.float32)


def run_retrieval(cfg) -> Tuple[Path, Dict[str, object]]:
    """Whitening, descriptors, ranking and scores; files into CHECKPOINT.DIR; returns
    (the folder, the record for metrics.json)."""
    r = cfg.IMG_RETRIEVAL
    limits = _limits(cfg)
    data = open_dataset(r.DATASET_PATH, r.EVAL_DATASET_NAME, r.USE_DISTRACTORS,
                        limits["NUM_QUERY_SAMPLES"], limits["NUM_DATABASE_SAMPLES"])
    if data.kind == "folder":
        raise ValueError(
            f"config.IMG_RETRIEVAL.EVAL_DATASET_NAME={r.EVAL_DATASET_NAME}: {r.DATASET_PATH}/"
            f"{r.EVAL_DATASET_NAME} has neither gnd_{Path(r.EVAL_DATASET_NAME).name}.pkl "
            "(Revisited Oxford/Paris) nor queries/ (Copydays), so nothing can be scored; the "
            "original Oxford/Paris protocol (lab/ files and the compute_ap program) is not "
            "implemented: evaluate on roxford5k / rparis6k")
    describer = _Describer(cfg)
    whitening = None
    if r.TRAIN_PCA_WHITENING:
        train = open_dataset(r.DATASET_PATH, r.TRAIN_DATASET_NAME,
                             num_database=limits["NUM_TRAINING_SAMPLES"])
        logger.info("whitening: region vectors of %d images of %s", len(train.database),
                    train.name)
        vectors = []
        progress = Progress("whitening", len(train.database), unit="images")
        for path in train.database:
            for regions in describer.regions(path):
                vectors.append(regions)
            progress.update()
        vectors = np.concatenate(vectors)
        if r.NORMALIZE_FEATURES:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-6)
        whitening = Whitening(r.N_PCA, cfg.SEED_VALUE).fit(vectors)
    database = _descriptors(describer, data.database, None, whitening, "database")
    boxes = data.query_boxes if r.CROP_QUERY_ROI else None
    queries = _descriptors(describer, data.queries, boxes, whitening, "queries")
    scores = similarity(queries, database, r.SIMILARITY_MEASURE)
    ranks = rankings(scores)
    results = data.score(ranks)
    folder = Path(cfg.CHECKPOINT.DIR)
    folder.mkdir(parents=True, exist_ok=True)
    if r.SAVE_FEATURES:
        np.save(folder / "retrieval_database_features.npy", database)
        np.save(folder / "retrieval_query_features.npy", queries)
    if r.SAVE_RETRIEVAL_RANKINGS_SCORES:
        np.save(folder / "retrieval_rankings.npy", ranks)
        np.save(folder / "retrieval_similarity_scores.npy", scores.astype(np.float32))
    for split, result in results.items():
        print(f"{data.name} {split}: mAP {result['mAP']:.2f}, mP@k " + ", ".join(
            f"{k}: {v:.2f}" for k, v in result["mP@k"].items()))
    return folder, {"instance_retrieval": {
        "dataset": data.name, "layer": describer.layer, "database": len(data.database),
        "queries": len(data.queries), "processing": r.FEATS_PROCESSING_TYPE,
        "whitening": bool(whitening), "results": results}}
