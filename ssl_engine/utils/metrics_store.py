"""The scalars a run reports, in one place: components put them, writers read them averaged.

The task owns one ``MetricsStore`` (``task.metrics``), emptied when a phase starts (and filled
again from the checkpoint when a run resumes inside a phase). Components put named values as
they are computed: the train step the loss of every forward pass (``"loss"``) and its named
terms (``"loss_terms"``), the collapse monitor its statistics (``"monitor"``), a user hook what
it likes. The writers (the progress log and metrics.json, TensorBoard) ask for the mean of the
last entries, or of the whole phase, reduced over ranks (``reduce``).

A *series* is one name; each ``put`` adds one entry to it: a scalar, or a dict of scalars (a
group, e.g. a loss's terms). The mean of a group is taken per key, over the entries of the
window that have that key.
"""
from typing import Dict, List, Mapping, Optional, Union

import torch

from ssl_engine.utils.distributed import all_reduce_mean

Entry = Union[torch.Tensor, Dict[str, torch.Tensor]]
Reduced = Dict[str, Union[float, Dict[str, float]]]


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
        slots, means = [], []  # (series, key or None), in sorted order
        for name in self.names():
            window = self._series[name] if last is None else self._series[name][-last:]
            if window and not isinstance(window[0], dict):
                slots.append((name, None))
                means.append(torch.stack([value.float() for value in window]).mean())
                continue
            for key in sorted({key for entry in window for key in entry}):
                slots.append((name, key))
                means.append(torch.stack([entry[key].float() for entry in window
                                          if key in entry]).mean())
        result: Reduced = {name: {} for name in self.names()  # groups: {} when no keys
                           if self._series[name] and isinstance(self._series[name][0], dict)}
        if means:
            for (name, key), value in zip(slots, all_reduce_mean(torch.stack(means)).tolist()):
                if key is None:
                    result[name] = value
                else:
                    result[name][key] = value
        return result
