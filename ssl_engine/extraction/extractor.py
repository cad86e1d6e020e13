"""FeatureExtractor: the entry point of the extraction workflow in every rank, called by the
``extract_features``, ``extract_label_predictions`` and ``extract_cluster`` engines. It sets
the process up as the trainer does (``trainer/process.py``: device, threads, host allocator,
torch.distributed, seeds) and builds only what extraction needs: the frozen model with the weights of
MODEL.WEIGHTS_INIT and the datasets of EXTRACT_FEATURES.SPLITS; no training task."""
import logging
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import torch

from ssl_engine.data import build_dataset
from ssl_engine.extraction import label_predictions as lp
from ssl_engine.extraction.cluster_assignments import (extract_cluster_assignments,
                                                       prototype_sets)
from ssl_engine.extraction.write_splits import check_splits, ensure_writable, extract_features
from ssl_engine.extraction.files import extraction_dir
from ssl_engine.extraction.one_view import check_extraction_splits, extraction_config
from ssl_engine.models import build_model
from ssl_engine.checkpoint import load_weights_init
from ssl_engine.trainer.process import setup_process

logger = logging.getLogger(__name__)


class FeatureExtractor:
    """Extracts from the frozen model of ``cfg`` (``extract()``: the layers of
    MODEL.FEATURE_EVAL_SETTINGS; ``extract_label_predictions()``: the heads' predictions).

    Args:
        cfg: the checked config (the AttrDict under ``config``).
        dist_run_id: the init method of torch.distributed ("tcp://host:port", "file://path"
            or "env://").
        checkpoint_folder: sets ``CHECKPOINT.DIR`` (the output folder when
            EXTRACT_FEATURES.OUTPUT_DIR is empty).
    """

    def __init__(self, cfg, dist_run_id: str, checkpoint_folder: Optional[str] = None):
        self.cfg = cfg
        self.device = setup_process(cfg, dist_run_id).device
        if checkpoint_folder:
            cfg.CHECKPOINT.DIR = checkpoint_folder

    def extract(self):
        """Write the features of every split in EXTRACT_FEATURES.SPLITS and every layer the
        model extracts (MODEL.FEATURE_EVAL_SETTINGS), from the frozen model with the weights
        of MODEL.WEIGHTS_INIT; return {split: {layer: {kind: path}}}."""
        cfg, model, datasets, folder = self._setup(
            lambda model: model.extract_layer_names(), "layers")
        return extract_features(model.to(self.device), datasets, cfg, self.device, folder)

    def extract_label_predictions(self):
        """Write the label predictions of the heads (top-k classes, softmax scores) with the
        targets and dataset indices of every split in EXTRACT_FEATURES.SPLITS; return
        {split: {output: {kind: path}}} (see ``label_predictions.py``)."""
        cfg, model, datasets, folder = self._setup(lp.prediction_names, "outputs")
        return lp.extract_label_predictions(model.to(self.device), datasets, cfg, self.device,
                                            folder)

    def extract_cluster_assignments(self):
        """Write every image's highest-scoring prototype of each prototype set of the swav
        head, with the targets and dataset indices, for every split in
        EXTRACT_FEATURES.SPLITS; return {split: {set: {kind: path}}}
        (see ``cluster_assignments.py``)."""
        cfg, model, datasets, folder = self._setup(prototype_sets, "prototype sets")
        return extract_cluster_assignments(model.to(self.device), datasets, cfg, self.device,
                                           folder)

    def _setup(self, names_fn: Callable[[torch.nn.Module], List[str]], what: str
               ) -> Tuple[object, torch.nn.Module, Dict[str, object], Path]:
        """(the extraction config, the frozen model with the weights of MODEL.WEIGHTS_INIT,
        {split: dataset}, the output folder); ``names_fn(model)`` names the outputs logged."""
        cfg = self.cfg
        folder = ensure_writable(extraction_dir(cfg))
        splits = check_splits(cfg.EXTRACT_FEATURES.SPLITS)
        with torch.random.fork_rng(devices=[]):  # the same initial weights on every rank
            torch.manual_seed(cfg.SEED_VALUE)
            model = build_model(cfg.MODEL)
        layers = names_fn(model)
        if cfg.MODEL.WEIGHTS_INIT.PARAMS_FILE:
            report = load_weights_init(model, cfg.MODEL.WEIGHTS_INIT)  # logs its summary
            logger.info("extracting with %d tensors of %s (%d model tensors not in the file)",
                        len(report.loaded), report.params_file, len(report.missing))
        else:
            logger.warning("config.MODEL.WEIGHTS_INIT.PARAMS_FILE is empty: extracting the "
                           "features of a randomly initialised model")
        logger.info("extracting %s %s of splits %s", what, ", ".join(layers), ", ".join(splits))
        cfg, changes = extraction_config(cfg, splits)
        for split, changed in changes.items():
            if changed:
                logger.info("%s: one deterministic view per image "
                            "(config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=true): %s",
                            split.lower(), "; ".join(changed))
        for split, names in check_extraction_splits(cfg, splits).items():
            logger.warning("%s: random augmentations %s are left in the extraction pipeline "
                           "(config.EXTRACT_FEATURES.ONE_DETERMINISTIC_VIEW=false): each "
                           "extraction gives other features", split.lower(), ", ".join(names))
        datasets = {split: build_dataset(cfg, split) for split in splits}
        return cfg, model, datasets, folder
