"""The files of a split while it is extracted: every rank appends its rows to its own temporary
.npy files (``RankWriter``: a background thread writes while the next batch is computed), then
rank 0 places each row at its dataset index (``merge_split``) and gives the final names, by
rename, to complete files only. Temporary names are dot-prefixed (``temporary``); memory stays
bounded by a few batches (ranks) and a chunk (the merge), whatever the dataset size. Used by
``features.extract_split``.
"""
import os
import queue
import shutil
import threading
from pathlib import Path
from typing import Callable, Dict, Optional, Sequence

import numpy as np
import torch

from ssl_engine.extraction.errors import ExtractionError
from ssl_engine.extraction.files import extracted_paths
from ssl_engine.utils.io import fsync_dir
from ssl_engine.utils.progress import Progress

PathsFn = Callable[[Path, str, str], Dict[str, Path]]  # (folder, split, layer) -> {kind: path}

MERGE_CHUNK_BYTES = 8 * 2**20  # rows read and placed at a time by the merge
WRITE_QUEUE_BATCHES = 4  # batches waiting for the writer thread at most


def temporary(path: Path, rank: Optional[int] = None) -> Path:
    """The temporary name of ``path`` while it is written (by ``rank``, or by the merge)."""
    tag = "" if rank is None else f".rank{rank}"
    return path.with_name(f".{path.name}{tag}.tmp")


# ---------------------------------------------------------------------- writing
class NpyAppender:
    """Writes a .npy file of ``num_rows`` rows appended in order; the row shape and dtype are
    those of the first rows."""

    def __init__(self, path: Path, num_rows: int):
        self.path, self.num_rows = Path(path), int(num_rows)
        self.handle = open(self.path, "wb")
        self.rows = 0
        self.row_shape = self.dtype = None

    def append(self, rows: np.ndarray) -> None:
        if self.row_shape is None:
            self.row_shape, self.dtype = rows.shape[1:], rows.dtype
            np.lib.format.write_array_header_1_0(self.handle, {
                "descr": np.lib.format.dtype_to_descr(rows.dtype), "fortran_order": False,
                "shape": (self.num_rows, *self.row_shape)})
        if rows.shape[1:] != self.row_shape or rows.dtype != self.dtype:
            raise ExtractionError(f"rows of {rows.shape[1:]} {rows.dtype} for a file of "
                                  f"{self.row_shape} {self.dtype}: {self.path}")
        if self.rows + len(rows) > self.num_rows:
            raise ExtractionError(f"more than the {self.num_rows} expected rows for {self.path}")
        self.handle.write(np.ascontiguousarray(rows).data)
        self.rows += len(rows)

    def discard(self) -> None:
        """Close without flushing what a failing disk could not take (the file is deleted
        next)."""
        try:
            self.handle.close()
        except OSError:
            pass

    def close(self, check: bool = True) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        if check and self.rows != self.num_rows:
            raise ExtractionError(f"{self.rows} rows written of the {self.num_rows} expected "
                                  f"for {self.path}")


class RankWriter:
    """This rank's temporary files of one split: inds, targets and one file per layer. A
    background thread writes the batches queued by ``append`` (at most WRITE_QUEUE_BATCHES)."""

    def __init__(self, folder: Path, split: str, layers: Sequence[str], rank: int,
                 num_rows: int, paths: PathsFn = extracted_paths):
        self.layers = list(layers)
        first = paths(folder, split, layers[0])
        self.files = {
            "inds": NpyAppender(temporary(first["inds"], rank), num_rows),
            "targets": NpyAppender(temporary(first["targets"], rank), num_rows),
            **{layer: NpyAppender(temporary(paths(folder, split, layer)["features"], rank),
                                  num_rows) for layer in self.layers},
        }
        self._queue: "queue.Queue" = queue.Queue(maxsize=WRITE_QUEUE_BATCHES)
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._write_loop, daemon=True,
                                        name=f"extract-writer-{split.lower()}")
        self._thread.start()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is None:
                try:
                    for name, rows in item.items():
                        self.files[name].append(rows)
                except BaseException as err:  # reported to the caller by append / close
                    self._error = err

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def append(self, features: Dict[str, torch.Tensor], targets: torch.Tensor,
               inds: torch.Tensor) -> None:
        self._raise_error()
        rows = len(inds)
        for layer in self.layers:
            if len(features[layer]) != rows:
                raise ExtractionError(
                    f"layer {layer} gives {len(features[layer])} rows for a batch of {rows} "
                    "samples: extraction takes one view per sample (default collator)"
                )
        item = {layer: _stored(features[layer].numpy()) for layer in self.layers}
        item["targets"] = _stored(targets.numpy())  # [B] classes or [B, C] label rows
        item["inds"] = inds.numpy().astype(np.int64, copy=False)
        self._queue.put(item)

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def close(self) -> Dict[str, object]:
        """Finish writing and close the files; return what the merge needs."""
        self._stop()
        self._raise_error()
        for appender in self.files.values():
            appender.close()
        return {"rows": self.files["inds"].rows}

    def abort(self) -> None:
        self._stop()
        for appender in self.files.values():
            appender.discard()


def _stored(rows: np.ndarray) -> np.ndarray:
    """Floating rows as float32, integer ones (class indices, label rows) as int64."""
    if np.issubdtype(rows.dtype, np.integer):
        return rows.astype(np.int64, copy=False)
    return rows.astype(np.float32, copy=False)


# ---------------------------------------------------------------------- merging
def read_rows(path: Path, start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of a .npy file, read through a mapping dropped right after (the
    pages read do not stay in this process's resident memory)."""
    mapped = np.load(path, mmap_mode="r")
    rows = np.array(mapped[start:stop])
    del mapped
    return rows


def _npy_layout(path: Path):
    """(dtype, row shape, number of rows) of a .npy file."""
    mapped = np.load(path, mmap_mode="r")
    layout = (mapped.dtype, mapped.shape[1:], mapped.shape[0])
    del mapped
    return layout


def _contiguous_runs(positions: np.ndarray):
    """(start, stop) in ``positions`` of its runs of consecutive values."""
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate([[0], breaks]).astype(int)
    stops = np.concatenate([breaks, [len(positions)]]).astype(int)
    return zip(starts.tolist(), stops.tolist())


def merge_rank_files(final: Path, sources: Sequence[Path], source_inds: Sequence[Path],
                     num_samples: int) -> None:
    """Write ``final``'s temporary name: a .npy whose row i is the row for dataset index i in
    ``sources`` (one .npy per rank, row j of which is for index ``source_inds[rank][j]``).
    Indices repeated across or within ranks (the sampler's padding) are written once per
    occurrence, to the same place; an index found nowhere is an error."""
    dtype, row_shape, _ = _npy_layout(sources[0])
    row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    chunk = max(1, MERGE_CHUNK_BYTES // max(row_bytes, 1))
    tmp = temporary(final)
    created = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype,
                                        shape=(num_samples, *row_shape))
    offset = created.offset
    del created  # the file exists at full size; nothing of it was touched
    seen = np.zeros(num_samples, dtype=bool)
    progress = Progress(f"merging {final.name}", sum(_npy_layout(p)[2] for p in source_inds),
                        unit="rows")  # every 10 s at most: a merge of a large split takes long
    fd = os.open(tmp, os.O_WRONLY)
    try:
        for source, inds_path in zip(sources, source_inds):
            total = _npy_layout(inds_path)[2]
            for start in range(0, total, chunk):
                stop = min(start + chunk, total)
                inds = read_rows(inds_path, start, stop)
                if inds.size and (inds.min() < 0 or inds.max() >= num_samples):
                    raise ExtractionError(f"dataset index out of range [0, {num_samples}) "
                                          f"in {inds_path}")
                values = read_rows(source, start, stop)
                if np.any(np.diff(inds) < 0):
                    order = np.argsort(inds, kind="stable")
                    inds, values = inds[order], values[order]
                seen[inds] = True
                for a, b in _contiguous_runs(inds):
                    os.pwrite(fd, values[a:b].data, offset + int(inds[a]) * row_bytes)
                progress.update(stop - start)
        os.fsync(fd)
    finally:
        os.close(fd)
    if not seen.all():
        raise ExtractionError(f"{final.name}: {int((~seen).sum())} of {num_samples} dataset "
                              "indices were never extracted")


def _in_dataset_order(inds_path: Path, num_samples: int) -> bool:
    """Whether row i of ``inds_path`` is index i for every one of ``num_samples`` rows."""
    if _npy_layout(inds_path)[2] != num_samples:
        return False
    chunk = MERGE_CHUNK_BYTES // 8
    return all(np.array_equal(read_rows(inds_path, start, min(start + chunk, num_samples)),
                              np.arange(start, min(start + chunk, num_samples)))
               for start in range(0, num_samples, chunk))


def merge_split(folder: Path, split: str, layers: Sequence[str], world: int,
                 num_samples: int, paths: PathsFn = extracted_paths) -> None:
    """Build the merged temporaries of every layer, then rename them all to their final
    names. A single rank's files already in dataset order are renamed, not copied."""
    first = paths(folder, split, layers[0])
    rank_inds = [temporary(first["inds"], rank) for rank in range(world)]
    in_order = world == 1 and _in_dataset_order(rank_inds[0], num_samples)
    finals = {}  # every final file once: path -> kind
    for layer in layers:
        layer_paths = paths(folder, split, layer)
        for kind in ("targets", "inds", "features"):
            if layer_paths[kind] in finals:  # targets / inds shared with an earlier layer
                continue
            source = first if kind != "features" else layer_paths
            rank_files = [temporary(source[kind], rank) for rank in range(world)]
            if layer != layers[0] and kind != "features":
                shutil.copyfile(temporary(first[kind]), temporary(layer_paths[kind]))
            elif in_order:
                os.replace(rank_files[0], temporary(layer_paths[kind]))
            else:
                merge_rank_files(layer_paths[kind], rank_files, rank_inds, num_samples)
            finals[layer_paths[kind]] = kind
    for kind in ("inds", "targets", "features"):  # features last: a split/layer is complete
        for final in [path for path, of in finals.items() if of == kind]:  # once its features
            os.replace(temporary(final), final)  # file exists
    fsync_dir(folder)


def remove_temporaries(folder: Path, split: str, layers: Sequence[str], tags,
                        paths: PathsFn = extracted_paths) -> None:
    """Delete the temporary files of ``split`` with the given tags (ranks, None: merged)."""
    for layer in layers:
        for path in paths(folder, split, layer).values():
            for tag in tags:
                temporary(path, tag).unlink(missing_ok=True)
