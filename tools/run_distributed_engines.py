#!/usr/bin/env python
"""Run an engine (train, extract_features, ...) on a composed config.

    python tools/run_distributed_engines.py config=quickstart/simclr_digits \
        [engine_name=train] [config.OPTIMIZER.num_epochs=3 ...]
"""
import logging
import os
import sys

from ssl_engine.engines.launcher import main

if __name__ == "__main__":
    code = main(sys.argv[1:])
    if code == 1:
        # A run that failed has said all it has to say in one line: leave without the
        # interpreter's teardown, where torch's finalisers of shared memory left by dead
        # data-loader workers can print "Exception ignored ..." tracebacks after that line.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
