"""Stopping on a NaN or infinite loss without reading the loss back at every step.

Reading a loss's value makes the host wait for the device to finish the step, which stops it
from queueing the next one. ``LossWatch`` keeps, on the loss's device, the index of the first
observed step whose loss was not finite (``torch.where``: no read), and the host keeps the
positions (iteration, phase, iteration in the phase) of the steps observed since the last
check. The check reads the flag back once: where the values are read anyway, when the log
line is written (the window's mean loss is then not finite, hooks/log_hooks.py) and before a
checkpoint is saved (hooks/checkpoint_hook.py), so a checkpoint never holds weights a
non-finite loss has updated.
"""
from typing import List, Optional, Tuple

import torch

Position = Tuple[int, int, int]  # iteration, phase index, iteration within the phase


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN or infinite; training stops with what was saved intact."""


def non_finite_message(value, position: Position) -> str:
    iteration, phase_idx, in_phase = position
    return (f"loss is {value} at iteration {iteration} (phase {phase_idx}, iteration "
            f"{in_phase} of the phase); lower the learning rate or check the data. "
            "Checkpoints already written are intact.")


class LossWatch:
    """The first non-finite loss among the steps observed since the last ``check``."""

    def __init__(self):
        self._first: Optional[torch.Tensor] = None  # on the loss's device; -1: none
        self._value: Optional[torch.Tensor] = None  # that loss
        self._positions: List[Position] = []

    def observe(self, loss: torch.Tensor, position: Position) -> None:
        """Remember ``loss`` of the step at ``position``, on the device (no read-back)."""
        loss = loss.detach().float()
        if self._first is None or self._first.device != loss.device:
            self._first = torch.full((), -1, dtype=torch.long, device=loss.device)
            self._value = torch.zeros((), device=loss.device)
        first_bad = ~torch.isfinite(loss) & (self._first < 0)
        self._first = torch.where(first_bad, len(self._positions), self._first)
        self._value = torch.where(first_bad, loss, self._value)
        self._positions.append(tuple(int(x) for x in position))

    def check(self) -> None:
        """NonFiniteLossError naming the first non-finite loss observed since the last check
        (one read-back; nothing when no step was observed)."""
        if not self._positions:
            return
        first = int(self._first)
        if first >= 0:
            raise NonFiniteLossError(non_finite_message(float(self._value),
                                                        self._positions[first]))
        self._positions = []

    def all_finite(self) -> None:
        """The observed losses are known to be finite (their mean, read back by the log, is):
        forget them without reading anything."""
        self._positions = []
