"""Every number a run reports goes one road: into the task's metrics store with its iteration,
reduced over ranks once per log window, then to the writers (the log line, metrics.json,
TensorBoard, the trackers), none of which reads another's output."""
from pathlib import Path

import pytest
import torch

from engine_utils import metrics, run_engine
from ssl_engine.hooks import SSLHook
from ssl_engine.trainer.default_hooks import default_hook_generator
from ssl_engine.utils import metrics_store
from ssl_engine.utils.distributed import get_rank
from ssl_engine.utils.metrics_store import MetricsStore, MetricsWriter

from test_eval_hooks import WITH_TEST_SPLIT

# 24 training images in batches of 4 on each of 2 processes: 3 steps per epoch, 2 epochs
TWO_PROCESSES = WITH_TEST_SPLIT + [
    "config.HOOKS.KNN_EVAL.USE_KNN_EVAL=true", "config.NEAREST_NEIGHBOR.TOPK=5",
    "config.HOOKS.ONLINE_LINEAR_PROBE.ENABLED=true",
    "config.HOOKS.TENSORBOARD_SETUP.USE_TENSORBOARD=true", "config.LOG_FREQUENCY=2",
    "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=24", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4",
    "config.MODEL.TRUNK.RESNETS.NORM=GroupNorm", "config.DISTRIBUTED.NUM_PROC_PER_NODE=2",
]


class CountReductions(SSLHook):
    """Counts the store's all-reduces of this process and writes the count at the end."""

    def __init__(self, folder):
        super().__init__()
        self.folder, self.calls = Path(folder), 0

    def on_start(self, task):
        reduce = metrics_store.all_reduce_mean

        def counted(tensor):
            self.calls += 1
            return reduce(tensor)

        metrics_store.all_reduce_mean = counted

    def on_end(self, task):
        (self.folder / f"reductions_rank{get_rank()}.txt").write_text(str(self.calls))


def counting_hooks(cfg):
    return default_hook_generator(cfg) + [CountReductions(cfg.CHECKPOINT.DIR)]


def tensorboard_scalars(folder: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_two_processes_reduce_once_per_log_row_and_tensorboard_shows_knn_and_probe(tmp_path):
    run_engine(tmp_path, TWO_PROCESSES, hook_generator=counting_hooks)
    rows = metrics(tmp_path)
    steps = [row for row in rows if "phase" in row]
    # train: iterations 2, 3 (the phase's last), 4, 6; test: its one batch, twice
    assert [(row["phase"], row["iteration"]) for row in steps] == [
        ("train", 2), ("train", 3), ("test", 3), ("train", 4), ("train", 6), ("test", 6)]
    for rank in (0, 1):  # one all-reduce per log row; the phase ends reduce nothing again
        assert int((tmp_path / f"reductions_rank{rank}.txt").read_text()) == len(steps)
    knn = [(row["knn"]["top1"], row["knn"]["top5"]) for row in rows if "knn" in row]
    probe = [(row["online_probe"]["top1"], row["online_probe"]["top5"]) for row in rows
             if "online_probe" in row]
    assert len(knn) == len(probe) == 2
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert [value for _, value in scalars["knn/top1"]] == pytest.approx([k[0] for k in knn])
    assert [value for _, value in scalars["knn/top5"]] == pytest.approx([k[1] for k in knn])
    assert [value for _, value in scalars["online_probe/top1"]] == pytest.approx(
        [p[0] for p in probe])
    assert [step for step, _ in scalars["knn/top1"]] == [3, 6]  # the iteration they belong to
    train_loss = [(row["iteration"], row["loss"]) for row in steps if row["phase"] == "train"]
    assert [step for step, _ in scalars["Losses/train_loss"]] == [s for s, _ in train_loss]
    assert [v for _, v in scalars["Losses/train_loss"]] == pytest.approx(
        [v for _, v in train_loss])
    phase_ends = [row for row in rows if row.get("phase_end") == "train"]
    for end in phase_ends:  # the phase's mean, from the windows' means
        windows = [row["loss"] for row in steps if row["phase"] == "train"
                   and row["train_phase_idx"] == end["train_phase_idx"]]
        sizes = [2, 1] if end["train_phase_idx"] == 0 else [1, 2]
        mean = sum(size * loss for size, loss in zip(sizes, windows)) / 3
        assert end["loss_avg"] == pytest.approx(mean, rel=1e-6)


class MicroBatchLosses(SSLHook):
    """Every training micro-batch's loss, with the iteration it was computed at."""

    losses = []

    def on_loss_and_meter(self, task):
        if task.train:
            MicroBatchLosses.losses.append((task.iteration, float(task.last_loss)))


def micro_batch_hooks(cfg):
    return default_hook_generator(cfg) + [MicroBatchLosses()]


def test_with_gradient_accumulation_a_logged_loss_is_the_mean_of_every_micro_batch(tmp_path):
    MicroBatchLosses.losses.clear()
    # 32 images in batches of 4: 8 micro-batches, 2 updates of 4 per epoch, a row per update
    run_engine(tmp_path, ["config.OPTIMIZER.num_epochs=1", "config.LOG_FREQUENCY=1",
                          "config.OPTIMIZER.gradient_accumulation_steps=4",
                          "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=32",
                          "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=4"],
               hook_generator=micro_batch_hooks)
    losses = MicroBatchLosses.losses
    assert len(losses) == 8 and len({loss for _, loss in losses}) == 8
    rows = [row for row in metrics(tmp_path) if row.get("phase") == "train"]
    assert [row["iteration"] for row in rows] == [1, 2]
    for row in rows:  # the micro-batches of update `iteration` ran at iteration - 1
        window = [loss for iteration, loss in losses if iteration == row["iteration"] - 1]
        assert len(window) == 4
        assert row["loss"] == pytest.approx(sum(window) / 4, rel=1e-6)
    [end] = [row for row in metrics(tmp_path) if row.get("phase_end") == "train"]
    assert end["loss_avg"] == pytest.approx(sum(loss for _, loss in losses) / 8, rel=1e-6)


class Collect(MetricsWriter):
    def __init__(self):
        self.records, self.closed = [], False

    def write(self, record):
        self.records.append(record)

    def close(self):
        self.closed = True


def test_store_windows_phase_means_and_records(monkeypatch):
    calls = []

    def all_reduce_mean(tensor):
        calls.append(tensor.clone())
        return tensor * 2  # stands for the other ranks

    monkeypatch.setattr(metrics_store, "all_reduce_mean", all_reduce_mean)
    store, early, late, after = MetricsStore(), Collect(), Collect(), Collect()
    store.add_writer(early)
    store.write({"model_complexity": {"flops": 5}}, 0)
    store.add_writer(late)  # at the start: given what was written before it
    store.set_history("loss", [1.0, 3.0])  # a resumed phase: kept values, not reduced again
    assert store.reduce_window() == {}
    for value in (1.0, 2.0, 3.0):
        store.put("loss", torch.tensor(value))
    assert store.reduce_window() == {"loss": 4.0} and len(calls) == 1
    store.put("loss", torch.tensor(5.0))
    assert store.reduce_window() == {"loss": 10.0} and len(calls) == 2
    assert store.reduce_phase() == {"loss": pytest.approx((1 + 3 + 3 * 4 + 10) / 6)}
    assert len(calls) == 2  # the phase's mean comes from the windows
    store.add_writer(after)  # after the first window: what comes from now on
    store.write({"knn": {"top1": 50.0}}, 7)
    store.write({"phase": "train", "loss": 1.0}, 8, kind="step", reduced=True)
    assert [(r.kind, r.iteration, r.reduced) for r in late.records] == [
        ("model_complexity", 0, False), ("knn", 7, False), ("step", 8, True)]
    assert early.records == late.records and after.records == late.records[1:]
    store.close()
    assert early.closed and late.closed and after.closed


def test_no_writer_reads_another_writers_output():
    root = Path(__file__).resolve().parents[1] / "ssl_engine/hooks"
    for name in ("trackers.py", "mlflow_hook.py", "wandb_hook.py", "online_probe_hook.py",
                 "knn_hook.py", "feature_report_hook.py", "perf_hooks.py", "ema_model_hook.py"):
        text = (root / name).read_text()
        assert "MetricsRows(" not in text.replace("class MetricsRows", ""), name
        assert "TensorboardHook" not in text and "append_metrics" not in text, name
