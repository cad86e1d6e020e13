"""Run chosen VISSL config files again as ``vissl_config_coverage.py --run`` runs them
(extra_scripts/vissl_config_run.py), or print the table of ``--run`` logs.

    python extra_scripts/vissl_config_rerun.py TREE [NAME ...] [--failed-from LOG]
        [--any-dataset] [--run-batch 2] [--run-timeout 900] [--run-memory-gb 20]
    python extra_scripts/vissl_config_rerun.py TREE --table-from LOG [--table-from LOG2 ...]

NAME: a file of the tree without .yaml (``pretrain/swav/swav_8node_resnet``), composed with
the coverage script's pairing; ``--failed-from``: also the files a previous ``--run`` log
reports as failed. Each outcome is printed as the file ends, then the table. ``--table-from``
runs nothing: it prints the table of the logs' files, a later log's outcome of a file replacing
an earlier one's (a run's failures run again with fixes).
"""
import argparse
import logging
import os
import re
import sys
from pathlib import Path

from vissl_common import BASE_OVERRIDES, complete_catalog
from vissl_config_pairing import config_names
from vissl_config_run import print_table, run_sample


def results_in(log: str):
    """The outcome of every file a ``--run`` log reports (its lines ``[i/N] s name: ...``)."""
    pattern = re.compile(r"^\[\d+/\d+\]\s+([\d.]+) s  (\S+): (ran|FAILED  (.*))$")
    return [{"name": m.group(2), "seconds": float(m.group(1)), "ok": m.group(3) == "ran",
             "error": m.group(4) or ""}
            for line in Path(log).read_text(errors="replace").splitlines()
            for m in [pattern.match(line)] if m]


def failed_in(log: str):
    """The names of the files a previous ``--run`` log reports as failed."""
    return [result["name"] for result in results_in(log) if not result["ok"]]


def merged_table(logs) -> None:
    """The table of the files of ``logs``, a later log's outcome of a file replacing an
    earlier one's (a run's failures run again with fixes)."""
    outcomes = {}
    for log in logs:
        outcomes.update((result["name"], result) for result in results_in(log))
    results = list(outcomes.values())
    print_table(results, sum(result["seconds"] for result in results))


def main(argv=None) -> int:
    """Run the named files again (or the failures of a previous log), as ``--run`` runs them."""
    parser = argparse.ArgumentParser(description="run chosen VISSL files as --run does")
    parser.add_argument("tree", help="VISSL's configs/config folder")
    parser.add_argument("names", nargs="*", help="files, e.g. pretrain/swav/swav_8node_resnet")
    parser.add_argument("--failed-from", metavar="LOG", help="also the files a --run log failed")
    parser.add_argument("--table-from", metavar="LOG", action="append", default=[],
                        help="no run: the table of these logs' files (a later log's outcome "
                             "of a file replacing an earlier one's)")
    parser.add_argument("--any-dataset", action="store_true", help="as the coverage script's")
    parser.add_argument("--run-batch", type=int, default=2)
    parser.add_argument("--run-timeout", type=float, default=900)
    parser.add_argument("--run-memory-gb", type=float, default=20)
    args = parser.parse_intermixed_args(argv)  # names before or after the options
    if args.table_from:
        merged_table(args.table_from)
        return 0
    root = Path(args.tree).resolve()
    wanted = list(args.names) + (failed_in(args.failed_from) if args.failed_from else [])
    names, _ = config_names(root)
    pairs = dict(names)
    unknown = [name for name in wanted if name not in pairs]
    if unknown:
        parser.error(f"not engine configs of {root}: {', '.join(unknown)}")
    catalog = root / "dataset_catalog.json"
    catalog = str(catalog) if catalog.is_file() else None
    if args.any_dataset:
        catalog = complete_catalog(root, names, catalog)
    if catalog:
        os.environ["SSL_ENGINE_DATASET_CATALOG_PATH"] = catalog
    logging.getLogger("ssl_engine").setLevel(logging.ERROR)
    try:
        results, seconds = run_sample(root, [(name, pairs[name]) for name in wanted],
                                      BASE_OVERRIDES, args.run_batch, args.run_timeout,
                                      args.run_memory_gb)
    finally:
        if args.any_dataset:
            os.unlink(catalog)
    print_table(results, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
