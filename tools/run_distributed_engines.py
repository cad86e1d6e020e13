#!/usr/bin/env python
"""Run an engine (train, extract_features, ...) on a composed config.

    python tools/run_distributed_engines.py config=quickstart/simclr_digits \
        [engine_name=train] [config.OPTIMIZER.num_epochs=3 ...]
"""
import sys

from ssl_engine.engines.launcher import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
