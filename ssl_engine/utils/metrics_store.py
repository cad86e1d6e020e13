"""The scalars a run reports, in one place: components put them, writers are given them.

The task owns one ``MetricsStore`` (``task.metrics``), whose series are emptied when a phase
starts (and filled again from the checkpoint when a run resumes inside a phase). Components put
named values as they are computed: the train step the loss of every forward pass (``"loss"``)
and its named terms (``"loss_terms"``), the collapse monitor its statistics (``"monitor"``), a
user hook what it likes. The progress log reduces them by window (``reduce_window``: the mean of
every entry put since the last window, over ranks, in one all-reduce) and at the phase end
(``reduce_phase``: from the windows' means, no collective), and writes the rows it makes of
them (``write``).

A *series* is one name; each ``put`` adds one entry to it: a scalar, or a dict of scalars (a
group, e.g. a loss's terms). The mean of a group is taken per key, over the entries of the
window that have that key.

A *record* is one row of final values with the iteration it belongs to: a window's row, or
values computed on rank 0 alone (or already the same on every rank: the k-NN, the online
probe's evaluation, the step times), marked ``reduced=False`` and never reduced. Every record
goes to every writer (``MetricsWriter``: the log line, metrics.json, TensorBoard, the
trackers), registered on rank 0; a writer added at the run's start is given the records
written before it (those before the first window: the run's start keeps them, not the run).
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch

from ssl_engine.utils.distributed import all_reduce_mean

Entry = Union[torch.Tensor, Dict[str, torch.Tensor]]
Reduced = Dict[str, Union[float, Dict[str, float]]]
Slot = Tuple[str, Optional[str]]  # (series, key of a group or None)


@dataclass
class Record:
    """One row of final values: ``row`` as metrics.json keeps it, ``iteration`` the one it
    belongs to, ``kind`` "step", "phase_end" or the row's own name ("knn", ...), ``reduced``
    whether its values were averaged over ranks, ``context`` what a writer may show beside
    the values (e.g. the phase's length for the log line)."""
    row: Dict[str, Any]
    iteration: int
    kind: str
    reduced: bool = False
    context: Dict[str, Any] = field(default_factory=dict)


class MetricsWriter:
    """A back end of the store: given every record as it is written, on rank 0."""

    def write(self, record: Record) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """The run is over (called once, by ``MetricsStore.close``)."""


class MetricsStore:
    """Named series of scalars of the current phase, and their means over ranks.

    Args:
        device: where the values are kept (the task's device, that of the collective);
            None keeps them where they are given.
    """

    def __init__(self, device: Optional[torch.device] = None):
        self.device = device
        self._series: Dict[str, List[Entry]] = {}
        self._reduced: Dict[Optional[int], Reduced] = {}  # by window, until the next put
        self._windowed: Dict[str, int] = {}  # entries of each series in a reduced window
        self._phase: Dict[Slot, List[float]] = {}  # [sum, count] of the windows' means
        self._writers: List[MetricsWriter] = []
        self._records: Optional[List[Record]] = []  # None after the first window

    def _tensor(self, value) -> torch.Tensor:
        value = torch.as_tensor(value).detach()
        return value if self.device is None else value.to(self.device)

    def put(self, name: str, value: Union[float, torch.Tensor, Mapping[str, object]]) -> None:
        """Add one entry to series ``name``: a scalar (tensor or number) or a dict of them.
        Called on every rank alike: every rank must hold the same names when ``reduce`` runs."""
        if isinstance(value, Mapping):
            entry: Entry = {key: self._tensor(item) for key, item in value.items()}
        else:
            entry = self._tensor(value)
        self._series.setdefault(name, []).append(entry)
        self._reduced.clear()

    def reset(self) -> None:
        """Forget every series (a new phase)."""
        self._series.clear()
        self._reduced.clear()
        self._windowed.clear()
        self._phase.clear()

    def names(self) -> List[str]:
        return sorted(self._series)

    def history(self, name: str) -> List[Entry]:
        """The entries of series ``name`` in the order they were put ([] if none)."""
        return list(self._series.get(name, []))

    def floats(self, name: str) -> list:
        """The entries of ``name`` as Python numbers (dicts of numbers for a group): what a
        checkpoint keeps."""
        return [{key: float(v) for key, v in entry.items()} if isinstance(entry, dict)
                else float(entry) for entry in self._series.get(name, [])]

    def set_history(self, name: str, entries: list) -> None:
        """Replace series ``name`` with ``entries`` (e.g. the ``floats`` a checkpoint kept)."""
        self._series[name] = []
        for entry in entries:
            self.put(name, entry)
        slots, means, counts = self._window_means({name: self._series[name]})
        for slot, mean, count in zip(slots, means, counts):  # the same on every rank
            self._add_to_phase(slot, float(mean), count)
        self._windowed[name] = len(self._series[name])

    def reduce(self, last: Optional[int] = None) -> Reduced:
        """The mean of each series over its ``last`` entries (all of the phase's when None),
        then over ranks: {name: mean} for a scalar series, {name: {key: mean}} for a group.

        A collective when any series has a value: every rank calls it at the same point with
        the same ``last``. All means travel in one all-reduce, in the order of the sorted
        names. Asked twice with nothing put in between, it answers from the first reduction.
        """
        if last not in self._reduced:
            self._reduced[last] = self._reduce(last)
        return {name: dict(value) if isinstance(value, dict) else value
                for name, value in self._reduced[last].items()}

    def _reduce(self, last: Optional[int]) -> Reduced:
        windows = {name: series if last is None else series[-last:]
                   for name, series in self._series.items()}
        slots, means, _ = self._window_means(windows)
        values = all_reduce_mean(torch.stack(means)).tolist() if means else []
        return self._result(windows, zip(slots, values))

    @staticmethod
    def _window_means(windows: Dict[str, List[Entry]]) -> Tuple[List[Slot], list, List[int]]:
        """The slots of the non-empty ``windows`` in sorted order (one per scalar series and
        per key of a group), the mean of each and how many entries it covers."""
        slots, means, counts = [], [], []
        for name in sorted(windows):
            window = windows[name]
            if window and not isinstance(window[0], dict):
                slots.append((name, None))
                means.append(torch.stack([value.float() for value in window]).mean())
                counts.append(len(window))
                continue
            for key in sorted({key for entry in window for key in entry}):
                values = [entry[key].float() for entry in window if key in entry]
                slots.append((name, key))
                means.append(torch.stack(values).mean())
                counts.append(len(values))
        return slots, means, counts

    @staticmethod
    def _result(windows: Dict[str, list], means) -> Reduced:
        result: Reduced = {name: {} for name in sorted(windows)  # groups: {} when no keys
                           if windows[name] and isinstance(windows[name][0], dict)}
        for (name, key), value in means:
            if key is None:
                result[name] = value
            else:
                result[name][key] = value
        return result

    def _add_to_phase(self, slot: Slot, mean: float, count: int) -> None:
        total = self._phase.setdefault(slot, [0.0, 0])
        total[0] += mean * count
        total[1] += count

    def reduce_window(self) -> Reduced:
        """The mean of every entry put since the last window (of the phase: since it started),
        over ranks, as ``reduce`` gives it: one all-reduce, a collective whenever any entry
        was put. Every micro-batch's entry counts, however many a step puts."""
        windows = {name: series[self._windowed.get(name, 0):]
                   for name, series in self._series.items()}
        slots, means, counts = self._window_means(windows)
        values = all_reduce_mean(torch.stack(means)).tolist() if means else []
        for slot, value, count in zip(slots, values, counts):
            self._add_to_phase(slot, value, count)
        self._windowed = {name: len(series) for name, series in self._series.items()}
        self._records = None
        return self._result(windows, zip(slots, values))

    def reduce_phase(self) -> Reduced:
        """The mean of each series over the whole phase, from its windows' means (entries put
        since the last window are reduced first, as one more window); a collective only then."""
        if any(len(series) > self._windowed.get(name, 0) for name, series in self._series.items()):
            self.reduce_window()
        slots = sorted(self._phase, key=lambda slot: (slot[0], slot[1] or ""))
        return self._result(self._series, ((slot, self._phase[slot][0] / self._phase[slot][1])
                                           for slot in slots))

    # ------------------------------------------------------------------ records and writers
    def add_writer(self, writer: MetricsWriter) -> None:
        """Give ``writer`` every record from now on, after those written before the first
        window."""
        for record in self._records or []:
            writer.write(record)
        self._writers.append(writer)

    def remove_writer(self, writer: MetricsWriter) -> None:
        if writer in self._writers:
            self._writers.remove(writer)

    def write(self, row: Dict[str, Any], iteration: int, kind: Optional[str] = None,
              reduced: bool = False, **context) -> Record:
        """Hand ``row`` (final values: a window's, or computed on rank 0 alone when not
        ``reduced``) of ``iteration`` to every writer; ``kind`` defaults to its first key."""
        record = Record(row, int(iteration), kind or next(iter(row)), reduced, context)
        if self._records is not None:
            self._records.append(record)
        for writer in list(self._writers):
            writer.write(record)
        return record

    def close(self) -> None:
        """Close every writer (the run is over)."""
        writers, self._writers = self._writers, []
        for writer in writers:
            writer.close()
