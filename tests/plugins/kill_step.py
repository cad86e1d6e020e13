"""A train step that SIGKILLs its own process after iteration $SSL_ENGINE_TEST_KILL_AT, for the
crash-and-resume tests: the standard step, then a hard kill (no clean-up, as in a crash)."""
import os
import signal

from ssl_engine.trainer import register_train_step
from ssl_engine.trainer.train_steps.standard_train_step import standard_train_step


@register_train_step("kill_after_iteration")
def kill_after_iteration(task):
    standard_train_step(task)
    if task.train and task.iteration == int(os.environ["SSL_ENGINE_TEST_KILL_AT"]):
        os.kill(os.getpid(), signal.SIGKILL)
    return task
