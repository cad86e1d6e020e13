"""TensorBoard curves (loss, lr, meters, any other series of the metrics store) with
tensorboard's own SummaryWriter."""
from pathlib import Path

from ssl_engine.hooks.base import SSLHook
from ssl_engine.hooks.log_hooks import other_series
from ssl_engine.utils.distributed import is_primary


def _flatten(prefix: str, value, out: dict) -> dict:
    if isinstance(value, dict):
        for key, sub in value.items():
            _flatten(f"{prefix}/{key}", sub, out)
    elif isinstance(value, (int, float)):
        out[prefix] = float(value)
    return out


class TensorboardHook(SSLHook):
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

    def on_step(self, task) -> None:
        if not task.train or task.iteration % self.log_frequency:
            return
        values = task.metrics.reduce(last=self.log_frequency)  # collective: every rank
        if self.writer is None:
            return
        self.writer.add_scalar("Losses/train_loss", values.get("loss", float("nan")),
                               task.iteration)
        for name, value in values.get("loss_terms", {}).items():
            self.writer.add_scalar(f"Losses/train_{name}", value, task.iteration)
        for tag, value in _flatten("Metrics/train", other_series(values), {}).items():
            self.writer.add_scalar(tag, value, task.iteration)
        if task.optimizer is not None:
            self.writer.add_scalar("Optimizer/lr", task.optimizer.get_lr(), task.iteration)

    def on_phase_end(self, task) -> None:
        values = task.metrics.reduce()  # the whole phase; collective: every rank
        if self.writer is None:
            return
        step = task.train_phase_idx
        self.writer.add_scalar(f"Losses/{task.phase_type}_loss_avg",
                               values.get("loss", float("nan")), step)
        for name, value in values.get("loss_terms", {}).items():
            self.writer.add_scalar(f"Losses/{task.phase_type}_{name}_avg", value, step)
        for tag, value in _flatten(f"Metrics/{task.phase_type}_avg", other_series(values),
                                   {}).items():
            self.writer.add_scalar(tag, value, step)
        for meter in task.meters:
            for tag, value in _flatten(f"Meters/{task.phase_type}/{meter.name}", meter.value,
                                       {}).items():
                self.writer.add_scalar(tag, value, step)
        if self.log_params and task.train:
            for name, param in task.base_model.named_parameters():
                self.writer.add_histogram(f"Parameters/{name}", param.detach().cpu(), step)
        self.writer.flush()

    def on_end(self, task) -> None:
        if self.writer is not None:
            self.writer.close()

    on_exception = on_end
