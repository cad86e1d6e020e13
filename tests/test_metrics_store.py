"""The metrics store: windows, groups, one all-reduce per reduction, what a checkpoint keeps."""
import importlib
import logging
import sys
from pathlib import Path

import pytest
import torch

from engine_utils import metrics, run_engine
from ssl_engine.utils import metrics_store
from ssl_engine.utils.metrics_store import MetricsStore


@pytest.fixture
def reductions(monkeypatch):
    """The tensors handed to the all-reduce, in call order (world size 1: the identity)."""
    calls = []

    def all_reduce_mean(tensor):
        calls.append(tensor.clone())
        return tensor.clone()

    monkeypatch.setattr(metrics_store, "all_reduce_mean", all_reduce_mean)
    return calls


def filled() -> MetricsStore:
    store = MetricsStore()
    for step, (loss, terms) in enumerate([(4.0, {"b": 1.0, "a": 2.0}), (2.0, {"b": 3.0}),
                                          (6.0, {"b": 5.0, "a": 4.0})]):
        store.put("loss", torch.tensor(loss))
        store.put("loss_terms", {name: torch.tensor(v) for name, v in terms.items()})
        if step:  # a series put less often has a window of its own
            store.put("monitor", {"embedding_std": torch.tensor(float(step))})
    return store


def test_window_means_per_series_and_per_key_of_a_group(reductions):
    store = filled()
    assert store.reduce() == {"loss": 4.0, "loss_terms": {"a": 3.0, "b": 3.0},
                              "monitor": {"embedding_std": 1.5}}
    # the last 2 entries of each series; a group key over the entries that have it
    assert store.reduce(last=2) == {"loss": 4.0, "loss_terms": {"a": 4.0, "b": 4.0},
                                    "monitor": {"embedding_std": 1.5}}
    assert store.reduce(last=1) == {"loss": 6.0, "loss_terms": {"a": 4.0, "b": 5.0},
                                    "monitor": {"embedding_std": 2.0}}


def test_one_all_reduce_in_sorted_name_order_and_answered_again_until_the_next_put(reductions):
    store = filled()
    store.reduce()
    store.reduce()
    assert len(reductions) == 1
    # loss, loss_terms/a, loss_terms/b, monitor/embedding_std
    assert reductions[0].tolist() == [4.0, 3.0, 3.0, 1.5]
    store.reduce(last=1)
    store.put("loss", 0.0)
    store.reduce()
    assert len(reductions) == 3


def test_empty_store_and_empty_groups_make_no_collective(reductions):
    store = MetricsStore()
    assert store.reduce() == {}
    store.put("loss_terms", {})
    assert store.reduce() == {"loss_terms": {}}
    assert reductions == []


def test_a_user_scalar_is_a_series_of_its_own(reductions):
    store = filled()
    store.put("grad_norm", 0.5)
    store.put("grad_norm", 1.5)
    assert store.reduce()["grad_norm"] == 1.0


def test_floats_round_trip_through_a_checkpoint(reductions):
    store = filled()
    saved = {"losses": store.floats("loss"), "loss_terms": store.floats("loss_terms")}
    assert saved == {"losses": [4.0, 2.0, 6.0],
                     "loss_terms": [{"b": 1.0, "a": 2.0}, {"b": 3.0}, {"b": 5.0, "a": 4.0}]}
    restored = MetricsStore()
    restored.set_history("loss", saved["losses"])
    restored.set_history("loss_terms", saved["loss_terms"])
    assert restored.reduce() == {key: value for key, value in store.reduce().items()
                                 if key != "monitor"}
    store.reset()
    assert store.names() == [] and store.reduce() == {}


def test_documented_hook_puts_a_scalar_the_log_and_metrics_json_report(tmp_path, caplog):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs/examples"))
    try:
        importlib.import_module("grad_norm_hook")  # registers "grad_norm"
    finally:
        sys.path.pop(0)
    with caplog.at_level(logging.INFO):
        run_engine(tmp_path, ["config.OPTIMIZER.num_epochs=1", "config.LOG_FREQUENCY=1",
                              "config.HOOKS.EXTRA_HOOKS=[grad_norm]"])
    records = metrics(tmp_path)
    steps = [r for r in records if r.get("phase") == "train"]
    assert steps and all(r["metrics"]["grad_norm"] > 0 for r in steps)
    phase_end = next(r for r in records if r.get("phase_end") == "train")
    mean = sum(r["metrics"]["grad_norm"] for r in steps) / len(steps)
    assert phase_end["metrics_avg"]["grad_norm"] == pytest.approx(mean, rel=1e-5)
    assert any(f"grad_norm {steps[0]['metrics']['grad_norm']:.4g} |" in r.getMessage()
               for r in caplog.records)
