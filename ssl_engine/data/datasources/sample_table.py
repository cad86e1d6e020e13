"""(path, label) samples of a listed folder, held in three numpy arrays.

A Python list of 1.28M ``(str, int)`` tuples costs about 200 MB, and a data-loading worker
forked from the process that built it copies it page by page as it reads: reading a tuple
writes its reference count, and the page holding it is copied on that write. Over an epoch each
worker ends up with its own copy. Here the paths are one byte buffer with offsets and the labels
one int64 array: reading a sample writes nothing in them, so forked workers keep sharing the
parent's pages (and the table is 1/3 to 1/4 of the list's size).
"""
import os
from typing import Iterable, Iterator, Tuple

import numpy as np


class SampleTable:
    """Read-only ``(path, label)`` pairs: ``table[i]``, ``len(table)``, iteration, equality."""

    def __init__(self, samples: Iterable[Tuple[str, int]]):
        paths, labels = [], []
        for path, label in samples:
            paths.append(os.fsencode(path))
            labels.append(label)
        self.offsets = np.zeros(len(paths) + 1, dtype=np.int64)
        np.cumsum([len(path) for path in paths], out=self.offsets[1:])
        self.paths = np.frombuffer(b"".join(paths), dtype=np.uint8)
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> str:
        start, end = self.offsets[index], self.offsets[index + 1]
        return os.fsdecode(self.paths[start:end].tobytes())

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
