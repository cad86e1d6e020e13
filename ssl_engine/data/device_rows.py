"""What the device ops share (data/device_ops.py, data/device_geometry.py): kornia on first use,
torchvision's applied-or-not draw, and changing a batch's chosen rows only."""
import functools

import torch


@functools.lru_cache(maxsize=None)
def kornia():
    """kornia, with its color, enhance and filters modules: imported when a device op first
    runs (about a second of start-up that runs without DEVICE_AUGMENTATION do not pay)."""
    import kornia.color  # noqa: F401
    import kornia.enhance  # noqa: F401
    import kornia.filters  # noqa: F401
    return kornia


def rand_below(p: float) -> float:
    """1.0 with probability ``p`` (torchvision's RandomApply draw: applied when rand < p)."""
    return float(torch.rand(1).item() < p)


def applied_rows(params: torch.Tensor) -> torch.Tensor:
    """The rows whose first parameter (applied or not) is set."""
    return torch.nonzero(params[:, 0] > 0).flatten()


def on_rows(images: torch.Tensor, positions: torch.Tensor, fn) -> torch.Tensor:
    """``images`` with the rows at the CPU indices ``positions`` replaced by ``fn(those rows,
    positions)``; untouched when there are none."""
    if positions.numel() == 0:
        return images
    rows = positions.to(images.device, non_blocking=True)
    return images.index_copy(0, rows, fn(images.index_select(0, rows), positions))


def per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A CPU vector of per-image values on ``like``'s device and dtype."""
    return values.to(like.device, like.dtype, non_blocking=True)


class AppliedOp:
    """An op that changes the rows whose first parameter (applied or not) is set."""

    def plan(self, params: torch.Tensor) -> list:
        return [applied_rows(params)]


class ChanceOp(AppliedOp):
    """An op whose only parameter is whether it applies, with probability ``p`` (torchvision's
    RandomApply draw). Params: applied."""

    size = 1

    def __init__(self, p: float):
        self.p = float(p)

    def draw(self, view) -> list:
        return [rand_below(self.p)]

    def draw_batch(self, draws, shape) -> torch.Tensor:
        return draws.below(self.p)[:, None]
