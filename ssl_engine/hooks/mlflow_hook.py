"""The run in MLflow (HOOKS.MLFLOW): the metrics store's scalars as they are written, the config as
params and config.yaml, the report files and metrics.json at the end. Rank 0 only; the
``mlflow`` package is an optional extra (``pip install -e ".[mlflow]"``)."""
import logging
import os
import time
from pathlib import Path

import yaml

from ssl_engine.hooks.trackers import TrackerHook, flat_config, run_name, write_run_id

logger = logging.getLogger(__name__)

MAX_BATCH = 100  # params per log_batch call (MLflow's limit; metrics allow 1000)
MAX_PARAM_LENGTH = 6000  # longer values are in config.yaml only


def default_store(folder: str) -> tuple:
    """(tracking URI, artifact location) of the local store in ``folder``/mlruns: an SQLite
    database (mlflow.db) beside the artifacts (artifacts/)."""
    root = Path(folder).resolve() / "mlruns"
    return f"sqlite:///{root / 'mlflow.db'}", str(root / "artifacts")


class MlflowHook(TrackerHook):
    """Logs the run to MLflow; a run resumed from a checkpoint continues the MLflow run whose
    id is in CHECKPOINT.DIR/mlflow_run_id.txt. Built by trainer/default_hooks.py when
    HOOKS.MLFLOW.ENABLED."""

    name = "mlflow"

    def __init__(self, cfg):
        super().__init__(cfg)
        settings = cfg.HOOKS.MLFLOW
        if settings.TRACKING_URI:
            self.tracking_uri, self.artifact_location = settings.TRACKING_URI, None
        else:  # the local store of the directory the run is launched from
            self.tracking_uri, self.artifact_location = default_store(os.getcwd())
        self.experiment_name = settings.EXPERIMENT_NAME
        self.run_name = run_name(settings.RUN_NAME, self.folder)
        self.run_id = None

    @property
    def client(self):
        return self.handle

    def _open(self, task, run_id) -> None:
        from mlflow.tracking import MlflowClient  # inside: an optional package

        self.handle = MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id = self._resumed_run(run_id) if run_id else None
        if self.run_id is None:
            self.run_id = self._new_run()
        write_run_id(self.folder, "mlflow", self.run_id)
        logger.info("MLflow: run %s (%s) in experiment %s at %s", self.run_name, self.run_id,
                    self.experiment_name, self.tracking_uri)

    def _resumed_run(self, run_id: str):
        from mlflow.exceptions import MlflowException  # inside: an optional package

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

    def _log(self, step: int, scalars) -> None:
        from mlflow.entities import Metric  # inside: an optional package

        now = int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for name, value in scalars.items()]
        for start in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def _save(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def _finish(self, failed: bool, stopping: bool) -> None:
        status = ("KILLED" if stopping else "FAILED") if failed else "FINISHED"
        self.client.set_terminated(self.run_id, status)
