"""VISSL keys that act on the run: the NCCL environment, DDP's buffer broadcast, clearing the
CUDA cache."""
import copy
import logging
import os

import pytest
import torch.distributed as dist

from ssl_engine.config import ConfigError, compose_config
from ssl_engine.config.derive import derive_settings
from ssl_engine.trainer.process import setup_distributed
from ssl_engine.trainer.trainer import SelfSupervisionTrainer

QUICK = "config=test/quick_simclr_synthetic"
SET = ["config.DISTRIBUTED.NCCL_DEBUG=true", "config.DISTRIBUTED.NCCL_SOCKET_NTHREADS=4",
       "config.DISTRIBUTED.BROADCAST_BUFFERS=false",
       "config.MODEL.CUDA_CACHE.CLEAR_CUDA_CACHE=true", "config.MODEL.CUDA_CACHE.CLEAR_FREQ=4"]


@pytest.fixture(scope="module")
def composed():
    """(the defaults, the keys of SET set): both accepted; each test takes copies."""
    return compose_config([QUICK])[1], compose_config([QUICK, *SET])[1]


@pytest.fixture
def default_cfg(composed):
    return copy.deepcopy(composed[0])


@pytest.fixture
def set_cfg(composed):
    return copy.deepcopy(composed[1])


def _bare_trainer(cfg, rank=0):
    """A trainer with just what run_phase reads (no task, no data)."""
    trainer = object.__new__(SelfSupervisionTrainer)
    trainer.cfg, trainer.dist_run_id, trainer.rank, trainer.world_size = \
        cfg, "tcp://127.0.0.1:1", rank, 2
    return trainer


def _setup_distributed(cfg, rank=0):
    """The process group's set-up of rank ``rank`` of 2."""
    setup_distributed(cfg, "tcp://127.0.0.1:1", rank, 2)


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_nccl_variables_are_set_before_the_process_group(monkeypatch, caplog, set_cfg, backend):
    cfg = set_cfg
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
        _setup_distributed(cfg)
    assert seen == {"backend": backend, "debug": "INFO", "threads": "4"}
    notes = [r.getMessage() for r in caplog.records if "NCCL_DEBUG=INFO" in r.getMessage()]
    assert len(notes) == 1
    assert ("no effect on the gloo backend" in notes[0]) == (backend == "gloo")


def test_nccl_variables_left_alone_by_default(monkeypatch, default_cfg):
    cfg = default_cfg
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.delenv("NCCL_SOCKET_NTHREADS", raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: None)
    _setup_distributed(cfg)
    assert os.environ["NCCL_DEBUG"] == "WARN"
    assert "NCCL_SOCKET_NTHREADS" not in os.environ


@pytest.mark.parametrize("value", ["0", 0, "many"])
def test_bad_socket_thread_count_is_refused(set_cfg, value):
    set_cfg.DISTRIBUTED.NCCL_SOCKET_NTHREADS = value
    with pytest.raises(ConfigError, match="NCCL_SOCKET_NTHREADS must be empty"):
        derive_settings(set_cfg)


@pytest.fixture
def one_process_group(tmp_path):
    """A gloo group of one process (DDP needs a group; its broadcasts are then no-ops)."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("value", [True, False])
def test_ddp_is_built_with_the_configured_buffer_broadcast(monkeypatch, one_process_group,
                                                          default_cfg, set_cfg, value):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    import ssl_engine.trainer.task as task_module

    cfg = default_cfg if value else set_cfg  # true: VISSL's default
    task = task_module.SelfSupervisionTask(cfg, torch.device("cpu"))
    monkeypatch.setattr(task_module, "get_world_size", lambda: 2)  # as in a 2-process run
    wrapped = task._wrap_model(torch.nn.Sequential(torch.nn.Linear(3, 3),
                                                   torch.nn.BatchNorm1d(3)))
    assert isinstance(wrapped, DistributedDataParallel)
    assert wrapped.will_sync_module_buffers() is value  # what its forward pass checks


@pytest.mark.parametrize("value", [True, False])
def test_sharded_ddp_gets_the_configured_buffer_broadcast(monkeypatch, default_cfg, set_cfg,
                                                          value):
    import fairscale.nn.data_parallel as fairscale_dp
    import torch

    from ssl_engine.trainer.sharded_ddp import wrap_sharded_ddp

    cfg = default_cfg if value else set_cfg
    cfg.MODEL.SHARDED_DDP_SETUP.USE_SDP = True
    built = {}

    class Recorder:
        _buffer_max_size = 0

        def __init__(self, module, optimizer, **kwargs):
            built.update(kwargs)

    class Optimizer:
        sharded = object()

    monkeypatch.setattr(fairscale_dp, "ShardedDataParallel", Recorder)
    wrap_sharded_ddp(torch.nn.Linear(2, 2), Optimizer(), cfg)
    assert built["broadcast_buffers"] is value


def test_fsdp_buffer_hook_sends_rank0_buffers_like_ddp(monkeypatch):
    import torch

    from ssl_engine.utils.distributed import BufferBroadcast

    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    sent = []

    def broadcast(tensor, src):  # rank 0's values arrive: here 7 everywhere
        sent.append((src, tensor.dtype, tensor.numel()))
        tensor.fill_(7)

    monkeypatch.setattr(dist, "broadcast", broadcast)
    model.register_forward_pre_hook(BufferBroadcast(model))
    model.train()
    x = torch.randn(4, 3)
    model(x)
    # one flat tensor per dtype: running mean and var (float32), num_batches_tracked (int64)
    assert sorted(sent, key=str) == [(0, torch.float32, 6), (0, torch.int64, 1)]
    bn = model[1]
    assert bn.num_batches_tracked.item() == 8  # 7 received, then this forward's update
    batch_mean = model[0](x).mean(dim=0).detach()
    assert torch.allclose(bn.running_mean, 0.9 * 7.0 + 0.1 * batch_mean)  # updated from 7
    sent.clear()
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 3))  # follows a forward with gradients: synced
        model(torch.randn(4, 3))  # follows one without: not
    assert len(sent) == 2
    assert torch.equal(bn.running_mean, torch.full((3,), 7.0))


class _Steps:
    """A task whose phase has ``count`` steps; counts the on_step hooks run."""

    train = True

    def __init__(self, count):
        self.left, self.hooks = count, 0

    def train_step(self):
        if not self.left:
            raise StopIteration
        self.left -= 1

    def run_hook(self, event):
        self.hooks += 1


@pytest.mark.parametrize("device, expected", [("cuda", 2), ("cpu", 0)])
def test_cuda_cache_emptied_every_clear_freq_steps(monkeypatch, caplog, set_cfg, device,
                                                   expected):
    import torch

    from ssl_engine.trainer.cuda_cache import CudaCacheClearer

    cfg = set_cfg  # CLEAR_FREQ=4
    trainer = _bare_trainer(cfg)
    clears = []  # the step count at each clear
    monkeypatch.setattr(torch.cuda, "empty_cache",
                        lambda: clears.append(trainer.cuda_cache.steps))
    with caplog.at_level(logging.INFO):
        trainer.cuda_cache = CudaCacheClearer(cfg, torch.device(device, 0) if device == "cuda"
                                              else torch.device("cpu"))
    for count in (5, 6):  # two phases: the count goes on across them
        task = _Steps(count)
        trainer.run_phase(task)
        assert task.hooks == count
    assert clears == [4, 8][:expected]
    cpu_note = [r for r in caplog.records if "no effect on a CPU run" in r.getMessage()]
    assert len(cpu_note) == (device == "cpu")


def test_cuda_cache_left_alone_by_default(monkeypatch, default_cfg):
    import torch

    from ssl_engine.trainer.cuda_cache import CudaCacheClearer

    cfg = default_cfg
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: pytest.fail("cache emptied"))
    clearer = CudaCacheClearer(cfg, torch.device("cuda", 0))
    for _ in range(200):
        clearer.after_step()


def test_clear_freq_below_one_is_refused(set_cfg):
    set_cfg.MODEL.CUDA_CACHE.CLEAR_FREQ = 0
    with pytest.raises(ConfigError, match="CUDA_CACHE.CLEAR_FREQ must be an integer >= 1"):
        derive_settings(set_cfg)
