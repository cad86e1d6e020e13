"""TensorBoard curves with tensorboard's own SummaryWriter: a writer of the task's metrics store
(``MetricsWriter``), given every record with its iteration: the train steps' loss, terms, lr
and other series, each phase's means and meters, and any other record's scalars under the
trackers' names (``knn/top1``, ``online_probe/top1``, ...) at its iteration."""
from pathlib import Path

from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.trackers import tracker_scalars
from ssl_engine.utils.distributed import is_primary
from ssl_engine.utils.metrics_store import MetricsWriter, Record


def _flatten(prefix: str, value, out: dict) -> dict:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}/{key}", sub, out)
    elif isinstance(value, (int, float)):
        out[prefix] = float(value)
    return out


class TensorboardHook(SSLHook, MetricsWriter):
    def __init__(self, log_dir: str, log_frequency: int, flush_every_n_min: int = 1,
                 log_params: bool = False):
        super().__init__()
        self.log_dir = Path(log_dir)
        self.log_frequency = log_frequency
        self.flush_secs = max(1, int(flush_every_n_min * 60))
        self.log_params = log_params
        self.writer = None

    def on_start(self, task) -> None:
        if is_primary():
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.log_dir), flush_secs=self.flush_secs)
            task.metrics.add_writer(self)

    def write(self, record: Record) -> None:
        if self.writer is None:
            return
        row = record.row
        if record.kind == "step":
            if row["phase"] == "train":
                self._step(row, record.iteration)
        elif record.kind == "phase_end":
            self._phase_end(row)
        else:
            for tag, value in tracker_scalars(row).items():
                self.writer.add_scalar(tag, value, record.iteration)
            self.writer.flush()

    def _step(self, row: dict, iteration: int) -> None:
        self.writer.add_scalar("Losses/train_loss", row["loss"], iteration)
        for name, value in row.get("loss_terms", {}).items():
            self.writer.add_scalar(f"Losses/train_{name}", value, iteration)
        for tag, value in _flatten("Metrics/train", row.get("metrics", {}), {}).items():
            self.writer.add_scalar(tag, value, iteration)
        if row["lr"] is not None:
            self.writer.add_scalar("Optimizer/lr", row["lr"], iteration)

    def _phase_end(self, row: dict) -> None:
        phase, step = row["phase_end"], row["train_phase_idx"]
        self.writer.add_scalar(f"Losses/{phase}_loss_avg", row["loss_avg"], step)
        for name, value in row["loss_terms_avg"].items():
            self.writer.add_scalar(f"Losses/{phase}_{name}_avg", value, step)
        for tag, value in _flatten(f"Metrics/{phase}_avg", row.get("metrics_avg", {}),
                                   {}).items():
            self.writer.add_scalar(tag, value, step)
        for tag, value in _flatten(f"Meters/{phase}", row["meters"], {}).items():
            self.writer.add_scalar(tag, value, step)

    def on_phase_end(self, task) -> None:
        if self.writer is None:
            return
        step = task.train_phase_idx
        if self.log_params and task.train:
            for name, param in task.base_model.named_parameters():
                self.writer.add_histogram(f"Parameters/{name}", param.detach().cpu(), step)
        self.writer.flush()

    def on_end(self, task) -> None:
        if self.writer is not None:  # records written after this still come (the feature
            self.writer.flush()      # report's): the store closes its writers at the run's end

    on_exception = on_end

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
