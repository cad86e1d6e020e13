"""Feature extraction streamed to disk (``extract_features``): the frozen model's rows of every
split, each rank writing its share (``rank_files.py``), rank 0 placing each row at its dataset
index in the final files. Called by ``extractor.FeatureExtractor`` (and, for the label
predictions, ``label_predictions.py``).

Final names are only given, by rename, to complete files: an extraction killed mid-way leaves
temporary files (dot-prefixed, overwritten by the next run) and no final-named file. A write
that fails (a full disk), or a feature that is not finite (NaN or infinite weights), removes
the temporary files and ends with one ExtractionError naming the splits already complete
(``errors.py``); the files of earlier runs are only replaced by complete ones. Once a split is
complete, the files an earlier extraction left of other layers of it are removed and the
split's index lists the files there are (``files.py``).

The files of a split are named by a ``paths(folder, split, layer) -> {"features", "targets",
"inds": path}`` function: ``extracted_paths`` (``<split>_<layer>_<kind>.npy``) by default.
Several layers may share their targets and inds files (the label predictions engine writes a
predictions and a scores "layer" per model output); they are written once.
"""
import logging
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ssl_engine.config import AttrDict
from ssl_engine.data import build_dataloader
from ssl_engine.data.loader import stop_workers, stopped_on_worker_death
from ssl_engine.data.paths import SPLITS
from ssl_engine.evaluation.feature_batches import feature_batches
from ssl_engine.extraction.errors import (WRITE_ERRNOS, ExtractionError, NonFiniteFeatures,
                                          non_finite_failure, write_failure)
from ssl_engine.extraction.files import extracted_paths, signature_path, stale_files, write_index
from ssl_engine.extraction.rank_files import (PathsFn, RankWriter, merge_split,
                                              remove_temporaries)
from ssl_engine.models.feature_eval import PoolTooLarge
from ssl_engine.utils.cpu_budget import loader_workers
from ssl_engine.utils.distributed import (broadcast_object, get_rank, get_world_size,
                                          is_distributed)
from ssl_engine.utils.io import writable_folder_error
from ssl_engine.utils.progress import Progress

logger = logging.getLogger(__name__)


def ensure_writable(folder: Path) -> Path:
    """Create ``folder`` and check a file can be written there."""
    folder = Path(folder)
    err = writable_folder_error(folder)
    if err is not None:
        raise ExtractionError(
            f"cannot write extracted features to {folder} (EXTRACT_FEATURES.OUTPUT_DIR, or "
            f"CHECKPOINT.DIR when it is empty): {err.strerror or err}"
        ) from None
    return folder


def check_splits(splits: Sequence[str]) -> List[str]:
    """EXTRACT_FEATURES.SPLITS upper-cased; ExtractionError when empty or naming no split."""
    splits = [str(split).upper() for split in splits]
    unknown = [split for split in splits if split not in SPLITS]
    if unknown or not splits:
        raise ExtractionError(f"EXTRACT_FEATURES.SPLITS must name splits among {SPLITS}, "
                              f"got {splits}")
    return splits


def check_finite(features: Dict[str, torch.Tensor], inds: torch.Tensor, split: str) -> None:
    """NonFiniteFeatures when a layer of this batch holds a NaN or infinite value, naming the
    layer and the dataset index of its first such sample (one test per layer and batch)."""
    for layer, rows in features.items():
        if not rows.is_floating_point() or torch.isfinite(rows).all():
            continue
        first = int(torch.isfinite(rows).flatten(1).all(dim=1).logical_not().nonzero()[0, 0])
        raise NonFiniteFeatures(f"the {split.lower()} features of layer {layer} are not finite "
                                f"(NaN or inf) at dataset index {int(inds[first])}")


def extract_split(features_fn: Callable, batches, layers: Sequence[str], folder: Path,
                  split: str, num_samples: int, num_rows: int, device: torch.device,
                  paths: PathsFn = extracted_paths) -> None:
    """Extract ``layers`` of one split into ``folder``. Called on every rank: this rank writes
    its ``num_rows`` rows (the batches of its sampler), then rank 0 merges. A failure leaves
    no final-named file of this split."""
    rank, world = get_rank(), get_world_size()
    writer = RankWriter(folder, split, layers, rank, num_rows, paths)
    start = time.perf_counter()
    # a large folder takes hours: a line with the ETA at most every 10 s, as training logs
    progress = Progress(f"extracting {split.lower()}" + (f" on rank {rank}" if world > 1 else ""),
                        num_rows)
    try:
        for features, targets, inds in feature_batches(features_fn, batches, device):
            check_finite(features, inds, split)
            writer.append(features, targets, inds)
            progress.update(len(inds))
        writer.close()
    except BaseException:
        # a dead loader worker is reported by torch's SIGCHLD handler, which can raise again
        # at any point: stop the workers first, and finish the clean-up if it is interrupted
        stop_workers(batches)
        for _ in range(3):
            try:
                writer.abort()
                remove_temporaries(folder, split, layers, [rank], paths)
                break
            except Exception:  # noqa: BLE001  (the first error is the one raised below)
                continue
        raise
    logger.info("%s: %d rows extracted on rank %d in %.1f s", split.lower(), num_rows, rank,
                time.perf_counter() - start)
    if is_distributed():
        torch.distributed.barrier()  # every rank's files are complete
    if rank != 0:
        failure = broadcast_object(None)
        if failure:
            raise ExtractionError(f"rank 0 failed to merge the {split.lower()} features: {failure}")
        return
    failure = None
    try:
        merge_split(folder, split, layers, world, num_samples, paths)
    except Exception as err:
        failure = f"{type(err).__name__}: {err}"
        raise
    finally:
        broadcast_object(failure)
        tags = list(range(world)) + ([None] if failure else [])
        remove_temporaries(folder, split, layers, tags, paths)


def remove_stale_files(folder: Path, split: str, layers: Sequence[str]) -> None:
    """Remove the files an earlier extraction of ``split`` left of layers other than
    ``layers`` (those of extracted_paths' naming only), saying which."""
    stale = stale_files(folder, split, layers)
    for path in stale:
        path.unlink()
    if stale:
        logger.info("removed from %s the %s files of an earlier extraction that this one did "
                    "not write: %s", folder, split.lower(), ", ".join(p.name for p in stale))


def extract_features(model: torch.nn.Module, datasets: Dict[str, object], cfg,
                     device: torch.device, folder: Path, layers: Optional[Sequence[str]] = None,
                     features_fn: Optional[Callable] = None, paths: PathsFn = extracted_paths,
                     index: bool = True) -> Dict[str, Dict[str, Dict[str, Path]]]:
    """Write ``<split>_<layer>_{features,targets,inds}.npy`` into ``folder`` for every dataset
    (split -> dataset) and every layer of ``model.extract_layer_names()``; return their paths.

    ``model`` is put in eval mode with gradients off; each rank reads its share of every split
    (no shuffling, no dropped samples). Other outputs: ``features_fn(inputs) -> {layer: rows}``
    for ``layers``, into the files named by ``paths``. ``index`` (for the files of
    extracted_paths' naming): each split owns its files of that naming in ``folder``; once it
    is complete the files of other layers are removed and ``<split>_extraction.json`` records
    what the files depend on and lists them (read by the evaluation tools)."""
    model.eval()
    model.requires_grad_(False)
    layers = list(model.extract_layer_names() if layers is None else layers)
    features_fn = model.extract_layers if features_fn is None else features_fn
    written = {}
    for split, dataset in datasets.items():
        split_cfg = AttrDict(dict(cfg.DATA[split], DROP_LAST=False))
        loader = build_dataloader(dataset, split_cfg, num_workers=loader_workers(cfg),
                                  pin_memory=cfg.DATA.PIN_MEMORY and device.type == "cuda",
                                  epoch=0, seed=cfg.SEED_VALUE, shuffle=False)
        if get_rank() == 0 and index:  # files being replaced no longer match the index
            signature_path(folder, split).unlink(missing_ok=True)
        logger.info("extracting %s (%d samples) layers %s into %s", split.lower(), len(dataset),
                    ", ".join(layers), folder)
        batches = iter(loader)
        try:
            extract_split(features_fn, batches, layers, folder, split, len(dataset),
                          len(loader.sampler), device, paths)
            if get_rank() == 0 and index:
                remove_stale_files(folder, split, layers)
                write_index(folder, cfg, split, layers, len(dataset))
        except Exception as err:
            if isinstance(err, NonFiniteFeatures):
                raise non_finite_failure(err, folder, split, list(written)) from None
            if isinstance(err, PoolTooLarge):  # a setting the model could not check alone
                raise ExtractionError(str(err)) from None
            if isinstance(err, OSError) and err.errno in WRITE_ERRNOS:
                raise write_failure(err, folder, split, list(written)) from None
            # anything else, a ConnectionResetError (an OSError) from a dying worker included
            died = stopped_on_worker_death(err, cfg, split, batches)
            if died is None:
                raise
            raise died from None
        written[split.lower()] = {layer: paths(folder, split, layer) for layer in layers}
    return written
