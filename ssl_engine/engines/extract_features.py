"""The ``extract_features`` engine: a frozen model's features as numpy, per split and layer."""
from typing import Callable, List, Optional

from ssl_engine.data import check_data_paths
from ssl_engine.engines.registry import register_engine
from ssl_engine.extraction.extractor import FeatureExtractor
from ssl_engine.extraction.write_splits import check_splits, ensure_writable
from ssl_engine.extraction.files import extraction_dir
from ssl_engine.extraction.one_view import check_extraction_splits
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.models.base_ssl_model import check_model_config
from ssl_engine.checkpoint import check_weights_file
from ssl_engine.checkpoint.weights_init import check_heads_in_file
from ssl_engine.trainer.process import machine_ranks
from ssl_engine.utils.logger import setup_logging


def check_extract_config(cfg) -> None:
    """The model has layers to extract (trunk stages, or heads), the splits are known, their
    data exists, extraction can read one view per image of them, the output folder is
    writable, and the weights file (MODEL.WEIGHTS_INIT.PARAMS_FILE) loads, holds a state
    dict and, when the heads are extracted, every head tensor (or SKIP_LAYERS names it)."""
    model = check_model_config(cfg.MODEL)
    if model is not None:
        model.extract_layer_names()  # e.g. heads asked for where the model has none
    splits = check_splits(cfg.EXTRACT_FEATURES.SPLITS)
    for split in splits:
        check_data_paths(cfg, split)
    check_extraction_splits(cfg, splits)
    ensure_writable(extraction_dir(cfg))
    check_weights_file(cfg.MODEL.WEIGHTS_INIT)
    if model is not None:
        check_heads_in_file(model, cfg.MODEL.WEIGHTS_INIT)


def extraction_engine(method: str, writes: str) -> Callable:
    """The engine function of an extraction workflow: the rank's logging, then
    ``FeatureExtractor.<method>()``; ``writes`` completes its docstring."""
    def engine(cfg, dist_run_id: str, checkpoint_path: Optional[str] = None,
               checkpoint_folder: Optional[str] = None,
               hook_generator: Callable[..., List] = default_hook_generator) -> None:
        _, rank, _ = machine_ranks()
        setup_logging(checkpoint_folder or cfg.CHECKPOINT.DIR, rank)
        getattr(FeatureExtractor(cfg, dist_run_id, checkpoint_folder), method)()

    engine.__doc__ = (f"Write {writes} into EXTRACT_FEATURES.OUTPUT_DIR (or CHECKPOINT.DIR). The "
                      "weights come from MODEL.WEIGHTS_INIT; hooks are not run.")
    return engine


extract_main = register_engine("extract_features", check_before_launch=check_extract_config)(
    extraction_engine("extract", "``<split>_<layer>_{features,targets,inds}.npy``"))
