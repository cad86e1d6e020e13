"""(path, label) samples of a listed folder, held in three arrays in shared memory.

A Python list of 1.28M ``(str, int)`` tuples costs about 200 MB in every process that holds it.
A data-loading worker forked from the process that built it copies it page by page as it reads
(reading a tuple writes its reference count, and the page holding it is copied on that write);
a worker started by a forkserver or spawned, as the engine's ranks start theirs, unpickles a
copy of its own. Here the paths are one byte buffer with offsets and the labels one int64
array (a third of the list's size), in shared memory: a forked worker reads the parent's pages
without writing them, and one started otherwise receives the memory's handle, not a copy
(torch's multiprocessing pickles a shared tensor as a handle).
"""
import os
from typing import Iterable, Iterator, Tuple

import numpy as np
import torch


class SampleTable:
    """Read-only ``(path, label)`` pairs: ``table[i]``, ``len(table)``, iteration, equality."""

    def __init__(self, samples: Iterable[Tuple[str, int]]):
        paths, labels = [], []
        for path, label in samples:
            paths.append(os.fsencode(path))
            labels.append(label)
        offsets = np.zeros(len(paths) + 1, dtype=np.int64)
        np.cumsum([len(path) for path in paths], out=offsets[1:])
        self._offsets = _shared(offsets)
        self._paths = _shared(np.frombuffer(bytearray(b"".join(paths)), dtype=np.uint8))
        self._labels = _shared(np.asarray(labels, dtype=np.int64))

    # numpy views of the shared tensors (made on use: a worker unpickles the tensors only)
    @property
    def offsets(self) -> np.ndarray:
        return self._offsets.numpy()

    @property
    def paths(self) -> np.ndarray:
        return self._paths.numpy()

    @property
    def labels(self) -> np.ndarray:
        return self._labels.numpy()

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> str:
        offsets = self.offsets
        return os.fsdecode(self.paths[offsets[index]:offsets[index + 1]].tobytes())

    def __getitem__(self, index: int) -> Tuple[str, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"sample {index} of {len(self)}")
        index %= len(self)
        return self.path(index), int(self.labels[index])

    def __iter__(self) -> Iterator[Tuple[str, int]]:
        return (self[index] for index in range(len(self)))

    def __eq__(self, other) -> bool:
        if not isinstance(other, SampleTable):
            return NotImplemented
        return (np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.paths, other.paths)
                and np.array_equal(self.labels, other.labels))

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.paths.nbytes + self.labels.nbytes


def _shared(array: np.ndarray) -> torch.Tensor:
    """``array``'s values in a tensor in shared memory (at least one element: an empty storage
    cannot be shared)."""
    tensor = torch.from_numpy(np.ascontiguousarray(array)) if array.size else \
        torch.zeros(1, dtype=torch.from_numpy(array[:0]).dtype)
    tensor = tensor.share_memory_()
    return tensor if array.size else tensor[:0]
