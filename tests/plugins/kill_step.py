"""A train step that SIGKILLs its own process after iteration $SSL_ENGINE_TEST_KILL_AT (only on
rank $SSL_ENGINE_TEST_KILL_RANK when that is set, and only in torchrun's first attempt when
$SSL_ENGINE_TEST_KILL_FIRST_ATTEMPT is set), for the crash tests: the standard step, then a
hard kill (no clean-up, as in a crash)."""
import os
import signal

import torch.distributed as dist

from ssl_engine.trainer import register_train_step
from ssl_engine.trainer.train_steps.standard_train_step import standard_train_step


@register_train_step("kill_after_iteration")
def kill_after_iteration(task):
    standard_train_step(task)
    rank = os.environ.get("SSL_ENGINE_TEST_KILL_RANK")
    this_rank = rank is None or int(rank) == dist.get_rank()
    if os.environ.get("SSL_ENGINE_TEST_KILL_FIRST_ATTEMPT"):  # torchrun counts its restarts
        this_rank = this_rank and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if task.train and this_rank and task.iteration == int(os.environ["SSL_ENGINE_TEST_KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return task
