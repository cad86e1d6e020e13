"""DATA_LIMIT with DATA_LIMIT_SAMPLING: which samples of a source a limited split keeps.

The subset is a pure function of (source size or labels, DATA_LIMIT, SKIP_NUM_SAMPLES, SEED), so
every rank and every loader worker computes the same one. The draws are those of numpy's legacy
``RandomState(SEED)``, which makes the kept indices equal to VISSL's for the same settings.
"""
import logging
from typing import Sequence

import numpy as np

logger = logging.getLogger(__name__)


def random_subset(total: int, count: int, skip: int, seed: int) -> np.ndarray:
    """``count`` distinct indices of ``range(total)``: a seeded permutation's entries after
    its first ``skip`` (so two settings that differ only in ``skip`` give disjoint subsets)."""
    drawn = np.random.RandomState(seed).choice(total, size=skip + count, replace=False)
    return drawn[skip:]


def balanced_subset(labels: Sequence[int], count: int, skip: int, seed: int) -> np.ndarray:
    """``count`` indices whose classes are as equal in number as possible (the first
    ``count % C`` classes in sorted order get one more); within each class a seeded draw
    without replacement whose first entries (``skip`` spread over the classes the same way)
    are left out. Indices come grouped by class, classes in sorted order."""
    by_class = {}
    for index, label in enumerate(np.asarray(labels).tolist()):
        by_class.setdefault(label, []).append(index)
    classes = sorted(by_class)
    per_class, extra = divmod(count, len(classes))
    skip_per_class, skip_extra = divmod(skip, len(classes))
    rng = np.random.RandomState(seed)
    chosen = []
    for position, label in enumerate(classes):
        keep = per_class + (1 if position < extra else 0)
        drop = skip_per_class + (1 if position < skip_extra else 0)
        members = by_class[label]
        if keep + drop > len(members):
            raise ValueError(
                f"class {label} has {len(members)} samples, fewer than the {keep} to keep after "
                f"the {drop} to skip"
            )
        chosen.append(rng.choice(members, size=drop + keep, replace=False)[drop:])
    return np.concatenate(chosen).astype(np.int64)


def check_split_size(total: int, split_cfg, split: str, what: str) -> None:
    """Before launch: ValueError when a split of a source of ``total`` samples (``what`` names
    where that number comes from) would hold none, alone or after DATA_LIMIT_SAMPLING's
    SKIP_NUM_SAMPLES."""
    key = f"config.DATA.{split}"
    if total <= 0:
        raise ValueError(f"{key} is empty: {what} gives 0 samples; a split needs at least one")
    skip = int(split_cfg.DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES)
    if int(split_cfg.DATA_LIMIT) > 0 and skip >= total:
        raise ValueError(f"{key} is empty: {key}.DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES={skip} "
                         f"skips all {total} samples that {what} gives; set it below "
                         f"{total}")


def limited_indices(source, split_cfg, split: str):
    """The source indices a split keeps (None: all of them, DATA_LIMIT=-1)."""
    limit = int(split_cfg.DATA_LIMIT)
    if limit < 0:
        return None
    sampling = split_cfg.DATA_LIMIT_SAMPLING
    key = f"config.DATA.{split}"
    skip, seed = int(sampling.SKIP_NUM_SAMPLES), int(sampling.SEED)
    total = len(source)
    if skip + limit > total:
        kept = max(total - skip, 0)
        logger.warning("%s.DATA_LIMIT=%d with SKIP_NUM_SAMPLES=%d: the source has only %d "
                       "samples, keeping %d", key, limit, skip, total, kept)
        limit = kept
    if not sampling.IS_BALANCED:
        return random_subset(total, limit, skip, seed)
    labels_of = getattr(source, "labels", None)
    labels = labels_of() if labels_of is not None else None
    if labels is None:
        raise ValueError(f"{key}.DATA_LIMIT_SAMPLING.IS_BALANCED=true needs labels, and the "
                         f"{split_cfg.DATA_SOURCES[0]} source of this split has none")
    if np.asarray(labels).ndim != 1:
        raise ValueError(f"{key}.DATA_LIMIT_SAMPLING.IS_BALANCED=true balances one class per "
                         f"image, and the labels of this split are vectors (shape "
                         f"{np.asarray(labels).shape}, {key}.LABEL_PATHS): set IS_BALANCED=false")
    if len(set(np.asarray(labels).tolist())) > limit:
        raise ValueError(f"{key}.DATA_LIMIT={limit} is below the number of classes: a balanced "
                         "subset needs at least one sample per class")
    try:
        return balanced_subset(labels, limit, skip, seed)
    except ValueError as err:
        raise ValueError(f"{key}.DATA_LIMIT_SAMPLING.IS_BALANCED=true: {err}") from None
