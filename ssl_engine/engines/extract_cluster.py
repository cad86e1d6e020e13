"""The ``extract_cluster`` engine (VISSL's): every image's cluster among the prototypes of a
SwAV model's head, as numpy per split (ssl_engine/extraction/cluster_assignments.py)."""
from ssl_engine.engines.extract_features import check_extract_config, extraction_engine
from ssl_engine.engines.registry import register_engine
from ssl_engine.extraction.cluster_assignments import check_cluster_config


def check_extract_cluster_config(cfg) -> None:
    """A swav_head to assign with (cluster_assignments.check_cluster_config), then what
    extract_features checks: splits, data, output folder, weights file."""
    check_cluster_config(cfg)
    check_extract_config(cfg)


extract_cluster_main = register_engine(
    "extract_cluster", check_before_launch=check_extract_cluster_config)(extraction_engine(
        "extract_cluster_assignments", "``<split>_<set>_{assignments,targets,inds}.npy``"))
