"""A train step that, at its first iteration (or $SSL_ENGINE_TEST_WAIT_AT), writes its process
id to the file $SSL_ENGINE_TEST_STARTED and waits (at most two minutes) for the file
$SSL_ENGINE_TEST_GO: a run held alive for as long as a test needs, e.g. to launch a second run
into its folder meanwhile, or to signal it."""
import os
import time
from pathlib import Path

from ssl_engine.trainer import register_train_step
from ssl_engine.trainer.train_steps.standard_train_step import standard_train_step


@register_train_step("wait_for_go")
def wait_for_go(task):
    standard_train_step(task)
    if task.iteration == int(os.environ.get("SSL_ENGINE_TEST_WAIT_AT", "1")):
        Path(os.environ["SSL_ENGINE_TEST_STARTED"]).write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not Path(os.environ["SSL_ENGINE_TEST_GO"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return task
