"""A train step that, after iteration $SSL_ENGINE_TEST_EAT_AT (only on rank
$SSL_ENGINE_TEST_EAT_RANK when that is set), allocates and touches memory 256 MiB at a time
until the process is killed, for the out-of-memory tests: they run it under a memory cgroup
with a limit, so the kernel's out-of-memory killer ends it as it ends a run that grew too
large."""
import os

import torch.distributed as dist

from ssl_engine.trainer import register_train_step
from ssl_engine.trainer.train_steps.standard_train_step import standard_train_step

_eaten = []


@register_train_step("eat_memory_after_iteration")
def eat_memory_after_iteration(task):
    standard_train_step(task)
    rank = os.environ.get("SSL_ENGINE_TEST_EAT_RANK")
    this_rank = rank is None or int(rank) == dist.get_rank()
    if task.train and this_rank and task.iteration == int(os.environ["SSL_ENGINE_TEST_EAT_AT"]):
        for _ in range(256):  # 64 GiB at most: more than any test machine's limit
            chunk = bytearray(256 * 2**20)
            chunk[::4096] = b"x" * len(range(0, len(chunk), 4096))  # every page resident
            _eaten.append(chunk)
    return task
