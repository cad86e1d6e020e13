"""Progress lines for long loops outside training (feature extraction, the evaluation tools).

Training logs its own progress with an ETA every ``LOG_FREQUENCY`` iterations; a loop over a
large folder of images or a large feature bank would otherwise say nothing until it ends.
``Progress`` logs "what: done/total unit (percent), rate, eta H:MM:SS" at most once every
``interval`` seconds (10 by default), so a fast loop adds no noise and a slow one is never
silent for long. The ETA is written as the training log writes it.
"""
import datetime
import logging
import time
from typing import Callable, Optional

logger = logging.getLogger(__name__)

DEFAULT_INTERVAL_SECONDS = 10.0


def eta_text(seconds: Optional[float]) -> str:
    """``H:MM:SS`` (the training log's format), ``-`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "-"
    return str(datetime.timedelta(seconds=int(seconds)))


class Progress:
    """Counts work done toward ``total`` and logs a progress line when ``interval`` seconds
    have passed since the start or the last line.

    Args:
        what: names the loop in the line ("extracting train").
        total: the amount of work, in ``unit`` (samples, queries, classes).
        unit: the word after the counts.
        interval: the least number of seconds between two lines (``DEFAULT_INTERVAL_SECONDS``
            when None, read when the object is made, so a test can shorten it).
        clock: a monotonic clock in seconds (a test passes its own).
        log: where lines go (``logger.info`` of this module by default).
    """

    def __init__(self, what: str, total: int, unit: str = "samples",
                 interval: Optional[float] = None,
                 clock: Callable[[], float] = time.monotonic,
                 log: Optional[Callable[..., None]] = None):
        self.what, self.total, self.unit = what, max(int(total), 0), unit
        self.interval = float(DEFAULT_INTERVAL_SECONDS if interval is None else interval)
        self.clock = clock
        self.log = log or logger.info
        self.done = 0
        self.start = self.last_line = clock()

    def update(self, count: int = 1) -> None:
        """Add ``count`` to the work done; log a line if the interval has passed."""
        self.done += int(count)
        now = self.clock()
        if now - self.last_line >= self.interval:
            self.last_line = now
            self.log("%s", self.line(now))

    def line(self, now: Optional[float] = None) -> str:
        """The progress line at time ``now`` (the clock's time by default)."""
        elapsed = (self.clock() if now is None else now) - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        left = (self.total - self.done) / rate if rate > 0 and self.total else None
        percent = f" ({100.0 * self.done / self.total:.1f}%)" if self.total else ""
        return (f"{self.what}: {self.done}/{self.total} {self.unit}{percent}, "
                f"{rate:.1f} {self.unit}/s, eta {eta_text(left)}")
