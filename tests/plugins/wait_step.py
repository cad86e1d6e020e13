"""A train step that, at its first iteration (or $SSL_ENGINE_TEST_WAIT_AT), writes its process
id to the file $SSL_ENGINE_TEST_STARTED and waits (at most two minutes) for the file
$SSL_ENGINE_TEST_GO: a run held alive for as long as a test needs, e.g. to launch a second run
into its folder meanwhile, or to signal it. Once the process has noted a stop signal it writes
the file $SSL_ENGINE_TEST_STARTED.signal; with $SSL_ENGINE_TEST_GO_ON_SIGNAL set, that signal
ends the wait instead of the file GO."""
import os
import time
from pathlib import Path

from ssl_engine.trainer import register_train_step
from ssl_engine.trainer.train_steps.standard_train_step import standard_train_step
from ssl_engine.utils.stop_request import requested_signal


@register_train_step("wait_for_go")
def wait_for_go(task):
    standard_train_step(task)
    if task.iteration == int(os.environ.get("SSL_ENGINE_TEST_WAIT_AT", "1")):
        started = os.environ["SSL_ENGINE_TEST_STARTED"]
        Path(started).write_text(str(os.getpid()))
        go_on_signal = bool(os.environ.get("SSL_ENGINE_TEST_GO_ON_SIGNAL"))
        deadline = time.monotonic() + 120
        seen = False
        while time.monotonic() < deadline:
            if not seen and requested_signal() is not None:
                Path(f"{started}.signal").write_text(str(os.getpid()))
                seen = True
            if Path(os.environ.get("SSL_ENGINE_TEST_GO", started + ".go")).exists() or (
                    seen and go_on_signal):
                break
            time.sleep(0.05)
    return task
