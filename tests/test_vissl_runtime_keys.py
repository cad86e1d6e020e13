"""VISSL keys that act on the run: the NCCL environment, DDP's buffer broadcast, clearing the
CUDA cache."""
import logging
import os

import pytest
import torch.distributed as dist

from ssl_engine.config import ConfigError, compose_config, load_config
from ssl_engine.trainer.trainer import SelfSupervisionTrainer

QUICK = "config=test/quick_simclr_synthetic"


def _bare_trainer(cfg, rank=0):
    """A trainer with just what setup_distributed reads (no task, no data)."""
    trainer = object.__new__(SelfSupervisionTrainer)
    trainer.cfg, trainer.dist_run_id, trainer.rank, trainer.world_size = \
        cfg, "tcp://127.0.0.1:1", rank, 2
    return trainer


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_nccl_variables_are_set_before_the_process_group(monkeypatch, caplog, backend):
    _, cfg = compose_config([QUICK, "config.DISTRIBUTED.NCCL_DEBUG=true",
                             "config.DISTRIBUTED.NCCL_SOCKET_NTHREADS=4"])
    cfg.DISTRIBUTED.BACKEND = backend
    for name in ("NCCL_DEBUG", "NCCL_SOCKET_NTHREADS"):
        monkeypatch.delenv(name, raising=False)
    seen = {}

    def init_process_group(**kwargs):  # what the group's set-up finds in the environment
        seen.update(backend=kwargs["backend"], debug=os.environ.get("NCCL_DEBUG"),
                    threads=os.environ.get("NCCL_SOCKET_NTHREADS"))

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    with caplog.at_level(logging.INFO):
        _bare_trainer(cfg).setup_distributed()
    assert seen == {"backend": backend, "debug": "INFO", "threads": "4"}
    notes = [r.getMessage() for r in caplog.records if "NCCL_DEBUG=INFO" in r.getMessage()]
    assert len(notes) == 1
    assert ("no effect on the gloo backend" in notes[0]) == (backend == "gloo")


def test_nccl_variables_left_alone_by_default(monkeypatch):
    _, cfg = compose_config([QUICK])
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.delenv("NCCL_SOCKET_NTHREADS", raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: None)
    _bare_trainer(cfg).setup_distributed()
    assert os.environ["NCCL_DEBUG"] == "WARN"
    assert "NCCL_SOCKET_NTHREADS" not in os.environ


@pytest.mark.parametrize("value", ["0", "many"])
def test_bad_socket_thread_count_is_refused(value):
    with pytest.raises(ConfigError, match="NCCL_SOCKET_NTHREADS must be empty"):
        load_config([QUICK, "config.MACHINE.DEVICE=cpu",
                     f"config.DISTRIBUTED.NCCL_SOCKET_NTHREADS={value}"])
