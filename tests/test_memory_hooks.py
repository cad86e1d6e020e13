"""HOOKS.MEMORY_SUMMARY and HOOKS.LOG_GPU_STATS on a CPU run: the memory line after the chosen
iteration, the live tensors after an exception, nothing for GPU stats without a GPU."""
import logging
from types import SimpleNamespace

import torch
from torch import nn

from ssl_engine.hooks.memory_hooks import GpuStatsHook, MemorySummaryHook


def task(iteration, train=True):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.BatchNorm1d(512))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()  # one momentum buffer per parameter
    return SimpleNamespace(base_model=model, optimizer=optimizer, device=torch.device("cpu"),
                           train=train, iteration=iteration)


def test_memory_summary_once_after_the_chosen_iteration(caplog):
    hook = MemorySummaryHook(print_summary=True, log_iteration=2)
    with caplog.at_level(logging.INFO, logger="ssl_engine.hooks.memory_hooks"):
        for iteration in (1, 2):
            hook.on_step(task(iteration))
        assert not caplog.records  # iteration 2 (counted from 0) is not done yet
        run = task(3)
        hook.on_step(run)
        hook.on_step(task(4))
    assert len(caplog.records) == 1
    weights = sum(t.numel() * t.element_size() for t in
                  list(run.base_model.parameters()) + list(run.base_model.buffers())) / 2**20
    momentum = sum(p.numel() * 4 for p in run.base_model.parameters()) / 2**20
    message = caplog.records[0].getMessage()
    assert message.startswith("memory of rank 0 after iteration 2: resident memory ")
    assert f"model parameters and buffers {weights:.1f} MiB; optimizer state {momentum:.1f} MiB" \
        in message


def test_live_tensors_are_listed_largest_first_after_an_exception(caplog):
    big = torch.zeros(1000, 1000)  # noqa: F841  (alive during the dump)
    with caplog.at_level(logging.ERROR, logger="ssl_engine.hooks.memory_hooks"):
        MemorySummaryHook(print_summary=False, dump_on_exception=True).on_exception(task(1))
        MemorySummaryHook(print_summary=False, dump_on_exception=False).on_exception(task(1))
    assert len(caplog.records) == 1
    lines = caplog.records[0].getMessage().splitlines()
    assert lines[0].startswith("live tensors of rank 0 after the exception: ")
    assert lines[1].split() == ["3.81", "MiB", "(1000,", "1000)", "torch.float32", "cpu"]


def test_gpu_stats_say_nothing_on_a_cpu_run(caplog):
    with caplog.at_level(logging.INFO, logger="ssl_engine.hooks.memory_hooks"):
        GpuStatsHook().on_start(task(0))
    assert not caplog.records
