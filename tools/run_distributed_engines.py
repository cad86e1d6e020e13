#!/usr/bin/env python
"""Run an engine (train, extract_features, ...) on a composed config.

    python tools/run_distributed_engines.py config=quickstart/simclr_digits \
        [engine_name=train] [config.OPTIMIZER.num_epochs=3 ...]
"""
import logging
import os
import sys

from ssl_engine.utils.oom import watch_parent

if __name__ == "__main__":
    # before torch is imported: a small copy of this process that says so if this one is
    # killed for lack of memory (nothing else can: the kernel's SIGKILL leaves no last word)
    watch = watch_parent()
    from ssl_engine.engines.launcher import main

    code = main(sys.argv[1:])
    watch.finished()
    if code == 1:
        # A run that failed has said all it has to say in one line: leave without the
        # interpreter's teardown, where torch's finalisers of shared memory left by dead
        # data-loader workers can print "Exception ignored ..." tracebacks after that line.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
