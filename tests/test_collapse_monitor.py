"""The collapse monitor: its statistic, its warning (once), and SwAV's entropies."""
import logging
from types import SimpleNamespace

import pytest
import torch

from ssl_engine.hooks.collapse_monitor_hook import CollapseMonitorHook, embedding_std
from ssl_engine.losses.base import SSLLoss
from ssl_engine.losses.swav_loss import SwAVLoss
from ssl_engine.utils.metrics_store import MetricsStore


def test_embedding_std_is_one_when_spread_and_zero_when_collapsed():
    torch.manual_seed(0)
    spread = torch.randn(4096, 64)
    assert embedding_std(spread).item() == pytest.approx(1.0, abs=0.02)
    point = torch.randn(1, 64).expand(512, 64) * torch.rand(512, 1)  # one direction, scaled
    assert embedding_std(point).item() == pytest.approx(0.0, abs=1e-5)
    # two clusters: in between, computed independently (per-dimension std of unit vectors)
    a, b = torch.zeros(64), torch.zeros(64)
    a[0], b[1] = 1.0, 1.0
    two = torch.stack([a, b]).repeat(50, 1)
    expected = two.std(dim=0).mean().item() * 8
    assert embedding_std(two).item() == pytest.approx(expected, rel=1e-6)


def test_hook_records_every_training_step_and_warns_once(caplog):
    hook = CollapseMonitorHook(min_embedding_std=0.05)
    task = SimpleNamespace(train=True, iteration=3, metrics=MetricsStore(), loss=SSLLoss(),
                           last_model_output=[torch.ones(8, 16)])
    with caplog.at_level(logging.WARNING):
        hook.on_loss_and_meter(task)
        hook.on_loss_and_meter(task)
    assert [float(s["embedding_std"]) for s in task.metrics.history("monitor")] == [0.0, 0.0]
    warnings = [r for r in caplog.records if "collapse at iteration 3" in r.getMessage()]
    assert len(warnings) == 1
    task.train = False  # evaluation steps are not monitored
    hook.on_loss_and_meter(task)
    assert len(task.metrics.history("monitor")) == 2


def test_swav_reports_entropies_and_warns_when_assignments_are_uniform():
    loss_fn = SwAVLoss(embedding_dim=4, num_prototypes=[6])
    same = torch.nn.functional.normalize(torch.ones(8, 4), dim=1)  # every sample alike
    loss_fn([same, same @ torch.randn(6, 4).t()])
    stats = loss_fn.collapse_statistics()
    assert float(stats["assignment_entropy"]) == pytest.approx(1.0, abs=1e-4)
    assert "uniform" in SwAVLoss.collapse_warning(stats)
    torch.manual_seed(0)
    distinct = torch.nn.functional.normalize(torch.randn(8, 4), dim=1)
    loss_fn([distinct, distinct @ torch.nn.functional.normalize(torch.randn(6, 4), dim=1).t()])
    assert float(loss_fn.collapse_statistics()["assignment_entropy"]) < 0.9
    assert SwAVLoss.collapse_warning(loss_fn.collapse_statistics()) is None


def test_dino_reports_the_teacher_entropies_and_warns_on_both_collapses():
    from ssl_engine.losses.dino_loss import DINOLoss

    log_k = torch.log(torch.tensor(5.0))
    uniform = torch.full((4, 5), 0.2)
    loss_fn = DINOLoss(output_dim=5)
    loss_fn._statistics(uniform)
    stats = loss_fn.collapse_statistics()
    assert float(stats["teacher_entropy"]) == pytest.approx(1.0, abs=1e-6)
    assert "uniform" in DINOLoss.collapse_warning(stats)
    one_prototype = torch.nn.functional.one_hot(torch.zeros(4, dtype=torch.long), 5).float()
    loss_fn._statistics(one_prototype)
    assert float(loss_fn.collapse_statistics()["teacher_mean_entropy"]) == pytest.approx(0.0)
    assert "same prototypes" in DINOLoss.collapse_warning(loss_fn.collapse_statistics())
    peaked = torch.nn.functional.one_hot(torch.arange(4), 5).float() * 0.9 + 0.02
    loss_fn._statistics(peaked)
    expected = -(peaked * peaked.log()).sum(dim=1).mean() / log_k
    assert float(loss_fn.collapse_statistics()["teacher_entropy"]) == pytest.approx(
        float(expected), rel=1e-6)
    assert DINOLoss.collapse_warning(loss_fn.collapse_statistics()) is None
    hook_task = SimpleNamespace(train=True, iteration=0, metrics=MetricsStore(), loss=loss_fn,
                                last_model_output=[torch.randn(4, 5)])
    CollapseMonitorHook(0.05).on_loss_and_meter(hook_task)
    assert set(hook_task.metrics.history("monitor")[0]) == {"teacher_entropy", "teacher_mean_entropy"}
