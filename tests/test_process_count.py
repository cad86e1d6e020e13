"""More processes than the machine can hold are refused before any starts: on a CPU, more
than the cores this process may use (its CPU affinity); on GPUs, more than the visible GPUs."""
import os

import pytest
import torch

from engine_utils import QUICK
from ssl_engine.config import ConfigError, load_config
from ssl_engine.config.derive import check_processes_fit
from ssl_engine.engines.launcher import main


def test_more_processes_than_cores_are_refused_before_launch(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # a 2-core share
    code = main([QUICK, f"config.CHECKPOINT.DIR={tmp_path / 'run'}",
                 "config.DISTRIBUTED.NUM_PROC_PER_NODE=64"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "error: config.DISTRIBUTED.NUM_PROC_PER_NODE=64 starts 64 processes, but this machine "
        "gives this process 2 CPU core(s) (its CPU affinity): more processes than cores only "
        "compete for them and for memory. Set config.DISTRIBUTED.NUM_PROC_PER_NODE to at most 2")
    assert not (tmp_path / "run").exists()  # nothing started, not even the lock


def test_the_cores_counted_are_those_of_the_affinity(monkeypatch):
    _, cfg = load_config([QUICK, "config.DISTRIBUTED.NUM_PROC_PER_NODE=2"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})  # e.g. `taskset -c 3`
    with pytest.raises(ConfigError, match=r"=2 starts 2 processes, but this machine gives this "
                                          r"process 1 CPU core\(s\)"):
        check_processes_fit(cfg)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3})
    check_processes_fit(cfg)  # as many processes as cores: accepted


def test_more_processes_than_visible_gpus_are_refused(monkeypatch):
    _, cfg = load_config([QUICK, "config.DISTRIBUTED.NUM_PROC_PER_NODE=4"])
    cfg.MACHINE.DEVICE = "gpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError) as err:
        check_processes_fit(cfg)
    assert str(err.value) == (
        "config.DISTRIBUTED.NUM_PROC_PER_NODE=4 starts one process per GPU, but 2 GPU(s) are "
        "visible (CUDA_VISIBLE_DEVICES=0,1): set config.DISTRIBUTED.NUM_PROC_PER_NODE to at "
        "most 2")
