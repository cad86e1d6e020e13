"""The run in Weights & Biases (HOOKS.WANDB): metrics.json's scalars as they are written
(against ``iteration``), the config, the report files and metrics.json at the end. Offline by
default: the run is written under HOOKS.WANDB.DIR/wandb/ and nothing leaves the machine until
``wandb sync``. Rank 0 only; the ``wandb`` package is an optional extra
(``pip install -e ".[wandb]"``)."""
import logging
from pathlib import Path

from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.trackers import (MetricsRows, read_run_id, report_files, resumes,
                                       run_name, write_run_id)
from ssl_engine.utils.distributed import is_primary

logger = logging.getLogger(__name__)


class WandbHook(SSLHook):
    """Logs the run to W&B; a run resumed from a checkpoint continues the W&B run whose id is
    in CHECKPOINT.DIR/wandb_run_id.txt. Built by trainer/default_hooks.py when
    HOOKS.WANDB.ENABLED."""

    def __init__(self, cfg):
        super().__init__()
        settings = cfg.HOOKS.WANDB
        self.folder = cfg.CHECKPOINT.DIR
        self.init_args = {
            "project": settings.PROJECT, "entity": settings.ENTITY or None,
            "name": run_name(settings.NAME, self.folder), "dir": settings.DIR or self.folder,
            "mode": settings.MODE, "tags": list(settings.TAGS) or None,
        }
        self.config = cfg.to_dict()
        self.rows = MetricsRows(self.folder)
        self.run = None

    def on_start(self, task) -> None:
        if not is_primary():
            return
        import wandb  # inside: an optional package

        run_id = read_run_id(self.folder, "wandb") if resumes(task) else None
        if run_id is not None:  # the rows before where the run continues were logged then
            self.rows.skip_existing()  # (a new run logs metrics.json from its first row)
        Path(self.init_args["dir"]).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(id=run_id, resume="allow" if run_id else None, config=self.config,
                              allow_val_change=True, **self.init_args)
        self.run.define_metric("iteration")
        self.run.define_metric("*", step_metric="iteration")
        write_run_id(self.folder, "wandb", self.run.id)
        logger.info("W&B: run %s (%s), mode %s, in %s", self.init_args["name"], self.run.id,
                    self.init_args["mode"], self.init_args["dir"])

    def _log_new_rows(self) -> None:
        for step, scalars in self.rows.new_scalars():
            self.run.log({**scalars, "iteration": step})

    def on_step(self, task) -> None:
        if self.run is not None:
            self._log_new_rows()

    on_phase_end = on_step

    def on_end(self, task) -> None:
        if self.run is None:
            return
        self._log_new_rows()
        for path in report_files(self.folder):
            self.run.save(str(path), base_path=self.folder, policy="now")
        self.run.finish(exit_code=0)
        self.run = None

    def on_exception(self, task) -> None:
        if self.run is None:
            return
        try:  # what was written before the failure, then the run's end
            self._log_new_rows()
            self.run.finish(exit_code=1)
        except Exception as error:  # the run's own exception is the one to report
            logger.warning("W&B: could not finish run %s: %s", self.run.id, error)
        self.run = None
