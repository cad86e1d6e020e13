#!/usr/bin/env python
"""Run an engine (train, extract_features, ...) on a composed config.

    python tools/run_distributed_engines.py config=quickstart/simclr_digits \
        [engine_name=train] [config.OPTIMIZER.num_epochs=3 ...]

The same as ``ssl-engine train`` (``ssl_engine/cli.py``, which also forks the out-of-memory
watcher before torch is imported and leaves a failed run without the interpreter's teardown).
"""
import sys

from ssl_engine.cli import run_engine

if __name__ == "__main__":
    sys.exit(run_engine(sys.argv[1:]))
