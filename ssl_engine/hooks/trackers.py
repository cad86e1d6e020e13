"""What the experiment-tracker hooks (HOOKS.MLFLOW, HOOKS.WANDB) share.

A tracker is a writer of the task's metrics store (``MetricsWriter``, utils/metrics_store.py),
as metrics.json is: it is given every record (the log's step and phase-end rows, the k-NN's,
the online probe's, the feature report's, the step times...) with its iteration, so it shows
the very numbers of the file and reduces nothing itself. ``TrackerHook`` is the lifecycle both
share (open on rank 0, log, save the report files, finish). Each row becomes a dict
of scalars (``tracker_scalars``): a step row's under its phase type (``train/loss``,
``train/loss_terms/<term>``, ``train/lr``, ``test/loss``...), a phase-end row's under
``<phase type>_phase/`` (``train_phase/loss_avg``, ``test_phase/meters/...``), any other row's
under its own keys (``knn/top1``, ``feature_report/learned/knn_top1``...).

The trackers' packages are optional (``pip install -e ".[mlflow]"``, ``".[wandb]"``);
``check_trackers`` refuses a config that switches on one whose package is missing, before
launch (engines/prelaunch.py).
"""
import importlib.util
import json
import logging
from pathlib import Path
from typing import Dict, List, Optional

from ssl_engine.hooks.base import SSLHook
from ssl_engine.utils.distributed import is_primary
from ssl_engine.utils.errors import ConfigError
from ssl_engine.utils.metrics_store import MetricsWriter, Record

logger = logging.getLogger(__name__)

# Row keys that place a row (its step, its phase), not values to plot.
POSITION_KEYS = ("phase", "phase_end", "phase_type", "scope", "phase_idx", "train_phase_idx",
                 "iteration", "iteration_in_phase")
WANDB_MODES = ("offline", "online", "disabled")


def install_command(package: str) -> str:
    """How to install a tracker's package: the extra of the same name, or the package."""
    return (f'pip install -e ".[{package}]" (in a source checkout of ssl_engine) or '
            f"pip install {package}")


def check_trackers(cfg) -> None:
    """Refuse, before launch, an empty MLflow experiment name, a W&B mode not in WANDB_MODES
    and a tracker switched on whose package is not installed. Called by engines/prelaunch.py."""
    hooks = cfg.HOOKS
    if hooks.MLFLOW.ENABLED and not hooks.MLFLOW.EXPERIMENT_NAME:
        raise ConfigError("config.HOOKS.MLFLOW.EXPERIMENT_NAME is empty: name the MLflow "
                          "experiment the run goes into")
    mode = hooks.WANDB.MODE
    if mode not in WANDB_MODES:
        raise ConfigError(f"config.HOOKS.WANDB.MODE={mode!r} is not one of "
                          f"{', '.join(WANDB_MODES)}")
    for key, package in (("MLFLOW", "mlflow"), ("WANDB", "wandb")):
        if hooks[key].ENABLED and importlib.util.find_spec(package) is None:
            raise ConfigError(f"config.HOOKS.{key}.ENABLED=true needs the {package} package, "
                              f"which is not installed: {install_command(package)}")


def _flatten(prefix: str, value, out: Dict[str, float]) -> None:
    if isinstance(value, dict):
        for key, sub in value.items():
            if key not in POSITION_KEYS:
                _flatten(f"{prefix}/{key}" if prefix else str(key), sub, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and prefix:
        out[prefix] = float(value)


def tracker_scalars(row: dict) -> Dict[str, float]:
    """The scalars of one metrics.json row under the names the trackers give them (see the
    module's docstring); strings, lists, None and the row's position keys are left out."""
    if "phase" in row:
        prefix = str(row["phase"])
    elif "phase_end" in row:
        prefix = f"{row['phase_end']}_phase"
    elif "scope" in row and "phase_type" in row:  # the step timings of a phase or the run
        prefix = f"{row['phase_type']}_{row['scope']}"
    else:
        prefix = ""
    out: Dict[str, float] = {}
    _flatten(prefix, row, out)
    return out


def report_files(folder: str) -> List[Path]:
    """The files of the run folder a tracker keeps at the end: the run report (report.png,
    report.html) where written, and metrics.json."""
    names = ("report.png", "report.html", "metrics.json")
    return [Path(folder) / name for name in names if (Path(folder) / name).is_file()]


def flat_config(node, prefix: str = "") -> Dict[str, str]:
    """{dotted key: value as text} of every leaf of a config (lists are leaves)."""
    if isinstance(node, dict) and node:
        out: Dict[str, str] = {}
        for key, value in node.items():
            out.update(flat_config(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: json.dumps(node) if not isinstance(node, str) else node}


def read_run_id(folder: str, tracker: str) -> Optional[str]:
    """The tracker's run id a run in ``folder`` was logged to (``<tracker>_run_id.txt``)."""
    path = Path(folder) / f"{tracker}_run_id.txt"
    if not path.is_file():
        return None
    return path.read_text().strip() or None


def write_run_id(folder: str, tracker: str, run_id: str) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{tracker}_run_id.txt").write_text(run_id + "\n")


def resumes(task) -> bool:
    """Whether the run continues from a checkpoint (then its tracker run is continued)."""
    return tuple(task.resume_position) != (0, 0)


def run_name(name: str, folder: str) -> str:
    """The run's name in a tracker: ``name``, or the name of the run folder when empty."""
    return name or Path(folder).name


class TrackerHook(SSLHook, MetricsWriter):
    """What the MLflow and W&B hooks share: on rank 0, ``_open`` the tracker's run at the start
    (continuing the run of ``<tracker>_run_id.txt`` when the run resumes), log every record of
    the metrics store as ``tracker_scalars`` at its iteration (the store gives it the records
    other hooks wrote at the start before it), and at the end save the report files and
    ``_finish``; on an exception, ``_finish`` with the failure (a failure to close is a
    warning: the run's own exception is the one to report). Subclasses implement ``_open``,
    ``_log``, ``_save`` and ``_finish``, and keep their client in ``self.handle``."""

    name = ""  # the tracker's name in messages and in <name>_run_id.txt

    def __init__(self, cfg):
        super().__init__()
        self.folder = cfg.CHECKPOINT.DIR
        self.config = cfg.to_dict()
        self.handle = None
        self.store = None

    def on_start(self, task) -> None:
        if not is_primary():
            return
        self._open(task, read_run_id(self.folder, self.name) if resumes(task) else None)
        self.store = getattr(task, "metrics", None)
        if self.store is not None:
            self.store.add_writer(self)

    def write(self, record: Record) -> None:
        scalars = tracker_scalars(record.row)
        if self.handle is not None and scalars:
            self._log(record.iteration, scalars)

    def _close(self) -> None:
        if self.store is not None:
            self.store.remove_writer(self)
        self.handle = self.store = None

    def on_end(self, task) -> None:
        if self.handle is None:
            return
        for path in report_files(self.folder):
            self._save(path)
        self._finish(failed=False, stopping=False)
        self._close()

    def on_exception(self, task) -> None:
        if self.handle is None:
            return
        try:
            self._finish(failed=True, stopping=bool(getattr(task, "stopping", False)))
        except Exception as error:  # the run's own exception is the one to report
            logger.warning("%s: could not close run: %s", self.name, error)
        self._close()

    def _open(self, task, run_id: Optional[str]) -> None:
        """Start the tracker's run, or continue ``run_id``; set ``self.handle``."""
        raise NotImplementedError

    def _log(self, step: int, scalars: Dict[str, float]) -> None:
        raise NotImplementedError

    def _save(self, path: Path) -> None:
        raise NotImplementedError

    def _finish(self, failed: bool, stopping: bool) -> None:
        raise NotImplementedError
