#!/usr/bin/env python
"""Runs side by side: a table of each run folder's method, epochs, wall time, final loss,
k-NN, 1-/5-shot and online probe accuracy ("-" where a folder does not hold it), and one
picture of their curves overlaid.

    python tools/compare_runs.py RUN_DIR [RUN_DIR ...] [--out runs.png]
"""
import argparse
import logging
import sys

from ssl_engine.report import comparison_figure, comparison_table, read_run_folder, save_figure


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", help="run folders (their CHECKPOINT.DIR)")
    parser.add_argument("--out", default="compare_runs.png", help="the picture (PNG)")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s: %(message)s")  # e.g. lines of metrics.json skipped
    try:
        runs = [read_run_folder(folder) for folder in args.folders]
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(comparison_table(runs))
    print(f"\ncurves: {save_figure(comparison_figure(runs), args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
