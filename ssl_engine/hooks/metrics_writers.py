"""The run's own writers of the metrics store (``MetricsWriter``, utils/metrics_store.py): the
progress log line and metrics.json. TensorBoard (hooks/tensorboard_hook.py) and the trackers
(hooks/trackers.py) are the others; each is given the records with their iteration."""
import datetime
import json
import logging
from pathlib import Path
from typing import Any, Dict

from ssl_engine.checkpoint.io import folder_gone_error
from ssl_engine.hooks.throughput import throughput_text
from ssl_engine.utils.metrics_store import MetricsStore, MetricsWriter, Record

logger = logging.getLogger("ssl_engine.hooks.log_hooks")


def append_metrics(folder: str, record: Dict[str, Any]) -> None:
    """Append ``record`` to ``folder/metrics.json``; CheckpointWriteError (one message) when the
    folder has vanished during the run."""
    try:
        with open(Path(folder) / "metrics.json", "a") as handle:
            handle.write(json.dumps(record) + "\n")
    except FileNotFoundError:
        if Path(folder).is_dir():
            raise
        raise folder_gone_error(Path(folder), "metrics.json") from None


def flat_text(values: Dict[str, Any], prefix: str = "") -> str:
    """" name value" for every scalar of ``values``, groups as name/key."""
    return "".join(flat_text(value, f"{prefix}{name}/") if isinstance(value, dict)
                   else f" {prefix}{name} {value:.4g}" for name, value in values.items())


def write_row(task, row: Dict[str, Any], folder: str) -> None:
    """Write ``row`` (rank 0's values, not reduced) of the task's iteration to the task's
    metrics store; a hook driven outside a run (a task without a store) writes it to
    ``folder``/metrics.json through a store of its own."""
    store = getattr(task, "metrics", None)
    if store is None:
        store = MetricsStore()
        store.add_writer(JsonWriter(folder))
    store.write(row, getattr(task, "iteration", 0))


class JsonWriter(MetricsWriter):
    """Every record's row, one JSON object per line, appended to ``folder``/metrics.json."""

    def __init__(self, folder: str):
        self.folder = folder

    def write(self, record: Record) -> None:
        append_metrics(self.folder, record.row)


class LogLineWriter(MetricsWriter):
    """The progress line of every step row and the line of every phase-end row."""

    def write(self, record: Record) -> None:
        if record.kind == "step":
            self._step_line(record.row, record.context.get("num_iters_in_phase"))
        elif record.kind == "phase_end":
            row = record.row
            logger.info("end of %s phase %d: loss %.4f, meters %s, %.1fs", row["phase_end"],
                        row["phase_idx"], row["loss_avg"], row["meters"],
                        row["phase_time_seconds"])

    @staticmethod
    def _step_line(row: Dict[str, Any], num_iters_in_phase) -> None:
        eta = row["eta_seconds"]
        eta_text = (str(datetime.timedelta(seconds=int(eta)))
                    if eta is not None and eta == eta else "-")
        lr_text = f"{row['lr']:.5g}" if row["lr"] is not None else "-"
        terms_text = "".join(f" ({name} {value:.4f})"
                             for name, value in row.get("loss_terms", {}).items())
        views_text = (f" ({row['views_per_sec']:.1f} views/s)"
                      if row["views_per_sec"] != row["images_per_sec"] else "")
        monitor = row.get("monitor", {})
        monitor_text = "".join(f" {name} {value:.3f}" for name, value in monitor.items())
        others = row.get("metrics", {})
        logger.info(
            "%s phase %d | iter %d (%d/%d in phase) | loss %.4f%s |%s%s lr %s | %.1f img/s%s | "
            "data %.3fs%s | eta %s | peak mem %.0f MiB",
            row["phase"], row["phase_idx"], row["iteration"], row["iteration_in_phase"],
            num_iters_in_phase, row["loss"], terms_text,
            f" collapse monitor:{monitor_text} |" if monitor else "",
            f"{flat_text(others)} |" if others else "", lr_text,
            row["images_per_sec"], views_text, row["data_time"], throughput_text(row), eta_text,
            row["peak_mem_mb"],
        )
