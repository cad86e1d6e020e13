"""The run in MLflow (HOOKS.MLFLOW): metrics.json's scalars as they are written, the config as
params and config.yaml, the report files and metrics.json at the end. Rank 0 only; the
``mlflow`` package is an optional extra (``pip install -e ".[mlflow]"``)."""
import logging
import os
import time
from pathlib import Path

import yaml

from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.trackers import (MetricsRows, flat_config, read_run_id, report_files,
                                       resumes, run_name, write_run_id)
from ssl_engine.utils.distributed import is_primary

logger = logging.getLogger(__name__)

MAX_BATCH = 100  # params per log_batch call (MLflow's limit; metrics allow 1000)
MAX_PARAM_LENGTH = 6000  # longer values are in config.yaml only


def default_store(folder: str) -> tuple:
    """(tracking URI, artifact location) of the local store in ``folder``/mlruns: an SQLite
    database (mlflow.db) beside the artifacts (artifacts/)."""
    root = Path(folder).resolve() / "mlruns"
    return f"sqlite:///{root / 'mlflow.db'}", str(root / "artifacts")


class MlflowHook(SSLHook):
    """Logs the run to MLflow; a run resumed from a checkpoint continues the MLflow run whose
    id is in CHECKPOINT.DIR/mlflow_run_id.txt. Built by trainer/default_hooks.py when
    HOOKS.MLFLOW.ENABLED."""

    def __init__(self, cfg):
        super().__init__()
        settings = cfg.HOOKS.MLFLOW
        self.folder = cfg.CHECKPOINT.DIR
        if settings.TRACKING_URI:
            self.tracking_uri, self.artifact_location = settings.TRACKING_URI, None
        else:  # the local store of the directory the run is launched from
            self.tracking_uri, self.artifact_location = default_store(os.getcwd())
        self.experiment_name = settings.EXPERIMENT_NAME
        self.run_name = run_name(settings.RUN_NAME, self.folder)
        self.config = cfg.to_dict()
        self.rows = MetricsRows(self.folder)
        self.client = None
        self.run_id = None

    def on_start(self, task) -> None:
        if not is_primary():
            return
        from mlflow.tracking import MlflowClient  # inside: an optional package

        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id = self._resumed_run() if resumes(task) else None
        if self.run_id is None:  # a new run logs metrics.json from its first row
            self.run_id = self._new_run()
        else:  # the rows before where the run continues were logged by the run that wrote them
            self.rows.skip_existing()
        write_run_id(self.folder, "mlflow", self.run_id)
        logger.info("MLflow: run %s (%s) in experiment %s at %s", self.run_name, self.run_id,
                    self.experiment_name, self.tracking_uri)

    def _resumed_run(self):
        from mlflow.exceptions import MlflowException  # inside: an optional package

        run_id = read_run_id(self.folder, "mlflow")
        if run_id is None:
            return None
        try:
            self.client.get_run(run_id)
        except MlflowException:
            logger.warning("MLflow: run %s of %s/mlflow_run_id.txt is not in %s; starting a "
                           "new run", run_id, self.folder, self.tracking_uri)
            return None
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def _new_run(self) -> str:
        from mlflow.entities import Param  # inside: an optional package

        experiment = self.client.get_experiment_by_name(self.experiment_name)
        experiment_id = experiment.experiment_id if experiment else \
            self.client.create_experiment(self.experiment_name, self.artifact_location)
        run_id = self.client.create_run(experiment_id, run_name=self.run_name,
                                        tags={"checkpoint_dir": self.folder}).info.run_id
        params = [Param(key, value) for key, value in flat_config(self.config).items()
                  if len(value) <= MAX_PARAM_LENGTH]
        for start in range(0, len(params), MAX_BATCH):
            self.client.log_batch(run_id, params=params[start:start + MAX_BATCH])
        self.client.log_text(run_id, yaml.safe_dump(self.config, sort_keys=False),
                             "config.yaml")
        return run_id

    def _log_new_rows(self) -> None:
        from mlflow.entities import Metric  # inside: an optional package

        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for step, scalars in self.rows.new_scalars()
                   for name, value in scalars.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def on_step(self, task) -> None:
        if self.client is not None:
            self._log_new_rows()

    on_phase_end = on_step

    def on_end(self, task) -> None:
        if self.client is None:
            return
        self._log_new_rows()
        for path in report_files(self.folder):
            self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED")
        self.client = None

    def on_exception(self, task) -> None:
        if self.client is None:
            return
        try:  # what was written before the failure, then the run's end
            self._log_new_rows()
            self.client.set_terminated(self.run_id, "KILLED" if task.stopping else "FAILED")
        except Exception as error:  # the run's own exception is the one to report
            logger.warning("MLflow: could not close run %s: %s", self.run_id, error)
        self.client = None
