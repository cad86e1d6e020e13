"""The run in Weights & Biases (HOOKS.WANDB): the metrics store's scalars as they are written
(against ``iteration``), the config, the report files and metrics.json at the end. Offline by
default: the run is written under HOOKS.WANDB.DIR/wandb/ and nothing leaves the machine until
``wandb sync``. Rank 0 only; the ``wandb`` package is an optional extra
(``pip install -e ".[wandb]"``)."""
import logging
from pathlib import Path

from ssl_engine.hooks.trackers import TrackerHook, run_name, write_run_id

logger = logging.getLogger(__name__)


class WandbHook(TrackerHook):
    """Logs the run to W&B; a run resumed from a checkpoint continues the W&B run whose id is
    in CHECKPOINT.DIR/wandb_run_id.txt. Built by trainer/default_hooks.py when
    HOOKS.WANDB.ENABLED."""

    name = "wandb"

    def __init__(self, cfg):
        super().__init__(cfg)
        settings = cfg.HOOKS.WANDB
        self.init_args = {
            "project": settings.PROJECT, "entity": settings.ENTITY or None,
            "name": run_name(settings.NAME, self.folder), "dir": settings.DIR or self.folder,
            "mode": settings.MODE, "tags": list(settings.TAGS) or None,
        }

    @property
    def run(self):
        return self.handle

    def _open(self, task, run_id) -> None:
        import wandb  # inside: an optional package

        Path(self.init_args["dir"]).mkdir(parents=True, exist_ok=True)
        self.handle = wandb.init(id=run_id, resume="allow" if run_id else None,
                                 config=self.config, allow_val_change=True, **self.init_args)
        self.run.define_metric("iteration")
        self.run.define_metric("*", step_metric="iteration")
        write_run_id(self.folder, "wandb", self.run.id)
        logger.info("W&B: run %s (%s), mode %s, in %s", self.init_args["name"], self.run.id,
                    self.init_args["mode"], self.init_args["dir"])

    def _log(self, step: int, scalars) -> None:
        self.run.log({**scalars, "iteration": step})

    def _save(self, path: Path) -> None:
        self.run.save(str(path), base_path=self.folder, policy="now")

    def _finish(self, failed: bool, stopping: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)
