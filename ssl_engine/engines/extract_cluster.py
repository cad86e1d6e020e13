"""The ``extract_cluster`` engine (VISSL's): every image's cluster among the prototypes of a
SwAV model's head, as numpy per split (ssl_engine/extraction/cluster_assignments.py)."""
from typing import Callable, List, Optional

from ssl_engine.engines.extract_features import check_extract_config
from ssl_engine.engines.registry import register_engine
from ssl_engine.extraction.cluster_assignments import check_cluster_config
from ssl_engine.extraction.extractor import FeatureExtractor
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.trainer.process import machine_ranks
from ssl_engine.utils.logger import setup_logging


def check_extract_cluster_config(cfg) -> None:
    """A swav_head to assign with (cluster_assignments.check_cluster_config), then what
    extract_features checks: splits, data, output folder, weights file."""
    check_cluster_config(cfg)
    check_extract_config(cfg)


@register_engine("extract_cluster", check_before_launch=check_extract_cluster_config)
def extract_cluster_main(cfg, dist_run_id: str, checkpoint_path: Optional[str] = None,
                         checkpoint_folder: Optional[str] = None,
                         hook_generator: Callable[..., List] = default_hook_generator) -> None:
    """Write ``<split>_<set>_{assignments,targets,inds}.npy`` into EXTRACT_FEATURES.OUTPUT_DIR
    (or CHECKPOINT.DIR). The weights come from MODEL.WEIGHTS_INIT; hooks are not run."""
    _, rank, _ = machine_ranks()
    setup_logging(checkpoint_folder or cfg.CHECKPOINT.DIR, rank)
    FeatureExtractor(cfg, dist_run_id, checkpoint_folder).extract_cluster_assignments()
