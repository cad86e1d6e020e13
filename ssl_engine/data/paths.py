"""Checks of a split's data settings that run before any process starts."""
import os

from ssl_engine.data.datasources.disk_filelist import label_path
from ssl_engine.data.datasources.torchvision_dataset import dataset_name
from ssl_engine.data.registry import DATASOURCE_REGISTRY
from ssl_engine.utils.registry import UnknownNameError

SPLITS = ("TRAIN", "TEST")


def source_classes(cfg, split: str):
    """The registered class of each of ``cfg.DATA.<split>.DATA_SOURCES`` (ValueError if unknown)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got '{split}'")
    sources = cfg.DATA[split].DATA_SOURCES
    if len(sources) == 0:
        raise ValueError(f"config.DATA.{split}.DATA_SOURCES is empty: name a data source")
    if len(sources) > 1:
        raise NotImplementedError(
            f"config.DATA.{split}.DATA_SOURCES has {len(sources)} entries; one source per split "
            "is supported"
        )
    classes = []
    for index, name in enumerate(sources):
        try:
            classes.append(DATASOURCE_REGISTRY.get(name))
        except UnknownNameError as err:
            raise ValueError(f"config.DATA.{split}.DATA_SOURCES[{index}]: {err}") from None
    return classes


def source_paths(cfg, split: str, classes) -> list:
    """DATA_PATHS, or "" per source when DATA_PATHS is empty and no source reads a path."""
    paths = list(cfg.DATA[split].DATA_PATHS)
    if not paths and not any(cls.needs_path for cls in classes):
        return [""] * len(classes)
    if len(paths) != len(classes):
        raise ValueError(
            f"config.DATA.{split}.DATA_PATHS has {len(paths)} entries but "
            f"config.DATA.{split}.DATA_SOURCES has {len(classes)}: give one path per source"
        )
    return paths


def _require_exists(path: str, key: str) -> None:
    if not path or not os.path.exists(path):
        raise FileNotFoundError(f"{key}: {path or '(empty)'} does not exist")


def check_split_settings(cfg, split: str) -> None:
    """Refuse impossible DATA_LIMIT, DATA_LIMIT_SAMPLING and MAX_INVALID_IMAGES values."""
    data = cfg.DATA[split]
    key = f"config.DATA.{split}"
    if data.DATA_LIMIT == 0 or data.DATA_LIMIT < -1:
        raise ValueError(f"{key}.DATA_LIMIT must be -1 (all samples) or at least 1, got "
                         f"{data.DATA_LIMIT}")
    if data.DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES < 0:
        raise ValueError(f"{key}.DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES must be >= 0, got "
                         f"{data.DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES}")
    if data.MAX_INVALID_IMAGES < -1:
        raise ValueError(f"{key}.MAX_INVALID_IMAGES must be -1 (no limit) or >= 0, got "
                         f"{data.MAX_INVALID_IMAGES}")
    if (data.DATA_LIMIT > 0 and data.DATA_LIMIT_SAMPLING.IS_BALANCED
            and list(data.DATA_SOURCES) == ["disk_filelist"] and not label_path(cfg, split, 0)):
        raise ValueError(f"{key}.DATA_LIMIT_SAMPLING.IS_BALANCED=true needs the labels of the "
                         f"disk_filelist source: set {key}.LABEL_PATHS")


def check_data_paths(cfg, split: str) -> None:
    """Refuse unknown source names, mismatched list lengths, missing files, paths a source
    refuses (its ``check_path``, e.g. a folder without images) and impossible settings of
    ``split``."""
    classes = source_classes(cfg, split)
    check_split_settings(cfg, split)
    label_sources = list(cfg.DATA[split].LABEL_SOURCES)
    if label_sources and label_sources != list(cfg.DATA[split].DATA_SOURCES):
        raise ValueError(
            f"config.DATA.{split}.LABEL_SOURCES={label_sources}: labels come from the data "
            f"source itself (leave it empty or equal to DATA_SOURCES); for disk_filelist give "
            f"the labels in config.DATA.{split}.LABEL_PATHS"
        )
    paths = source_paths(cfg, split, classes)
    for index, (cls, path) in enumerate(zip(classes, paths)):
        if cls.needs_path:
            _require_exists(path, f"config.DATA.{split}.DATA_PATHS[{index}]")
        if cfg.DATA[split].DATA_SOURCES[index] == "torchvision_dataset":
            dataset_name(cfg, split, index)
        check_path = getattr(cls, "check_path", None)  # a source's own refusals of its path
        if check_path is not None:
            check_path(cfg, split, path, index)
        labels = label_path(cfg, split, index)
        if labels:
            _require_exists(labels, f"config.DATA.{split}.LABEL_PATHS[{index}]")


def split_size(cfg, split: str) -> int:
    """How many samples ``split`` has once DATA_LIMIT and SKIP_NUM_SAMPLES are applied (its
    source is listed: a disk_folder tree is walked)."""
    classes = source_classes(cfg, split)
    path = source_paths(cfg, split, classes)[0]
    total = len(classes[0](cfg, split, path, 0))
    data = cfg.DATA[split]
    if data.DATA_LIMIT < 0:
        return total
    skip = int(data.DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES)
    return min(int(data.DATA_LIMIT), max(total - skip, 0))


def check_full_batch(cfg, split: str) -> None:
    """With DROP_LAST, refuse a split smaller than one batch of every process: each process
    would drop its only, incomplete batch and the phase would run no iteration."""
    data = cfg.DATA[split]
    if not data.DROP_LAST:
        return
    processes = int(cfg.DISTRIBUTED.NUM_NODES) * int(cfg.DISTRIBUTED.NUM_PROC_PER_NODE)
    needed = int(data.BATCHSIZE_PER_REPLICA) * processes
    size = split_size(cfg, split)
    if size < needed:
        fit = (f"a BATCHSIZE_PER_REPLICA of at most {size // processes}" if size >= processes
               else f"at most {size} process(es)")
        raise ValueError(
            f"config.DATA.{split}.DROP_LAST=true with {size} sample(s) and "
            f"config.DATA.{split}.BATCHSIZE_PER_REPLICA={data.BATCHSIZE_PER_REPLICA} x {processes} "
            f"process(es) = {needed} per batch: every batch is incomplete and dropped, so the "
            f"phase would run no iteration. Set config.DATA.{split}.DROP_LAST=false or {fit}")
