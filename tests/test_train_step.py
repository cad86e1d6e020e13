"""The standard train step on a hand-made task: NaN losses stop with a clear error."""
from types import SimpleNamespace

import pytest
import torch

from engine_utils import FunctionLoss
from ssl_engine.trainer.amp import MixedPrecision
from ssl_engine.trainer.train_steps.standard_train_step import (
    NonFiniteLossError, standard_train_step,
)
from ssl_engine.utils.metrics_store import MetricsStore


class RecordingOptimizer:
    def __init__(self):
        self.wheres = []

    def zero_grad(self):
        pass

    def step(self, where):
        self.wheres.append(where)


def fake_task(loss_value):
    model = torch.nn.Linear(2, 1)
    batch = {"input": torch.ones(3, 2), "target": torch.zeros(3, dtype=torch.long)}
    return SimpleNamespace(
        data_iterator=iter([batch]), to_device=lambda b: b, model=model, train=True,
        loss=FunctionLoss(lambda out, target: out.sum() * 0 + loss_value), meters=[],
        metrics=MetricsStore(), run_hook=lambda event: None, iteration=41, phase_idx=3,
        schedule_iteration=41, schedule_length=50, iteration_num_in_phase=5,
        optimizer=RecordingOptimizer(), where=0.5, amp=MixedPrecision(None, "cpu"),
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_loss_names_the_iteration(value):
    task = fake_task(value)
    with pytest.raises(NonFiniteLossError, match=r"loss is (nan|inf) at iteration 41 \(phase 3, "
                                                 r"iteration 5 of the phase\)"):
        standard_train_step(task)


def test_step_updates_counters_and_stops_at_end_of_data():
    task = fake_task(1.0)
    standard_train_step(task)
    assert task.iteration == 42 and task.iteration_num_in_phase == 6
    assert float(task.last_loss) == 1.0 and len(task.metrics.history("loss")) == 1
    assert task.optimizer.wheres == [0.5]
    with pytest.raises(StopIteration):
        standard_train_step(task)
