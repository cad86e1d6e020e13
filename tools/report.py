#!/usr/bin/env python
"""Write report.png and report.html into a run folder (CHECKPOINT.DIR), from what it holds.

    python tools/report.py <CHECKPOINT.DIR> [--max-samples 1000] [--no-map]

Works on a finished run, one in progress, one killed mid-way and one made before the report
existed: the curves come from metrics.json; when the folder has a checkpoint and the composed
config (config.yaml, or the one the checkpoint keeps) with a TEST split, the model is rebuilt
from the latest checkpoint for the 2-D map of the TEST features beside raw pixels'.
"""
import argparse
import sys

import torch

from ssl_engine.checkpoint import CheckpointError, load_checkpoint
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model
from ssl_engine.report import feature_map, has_test_split, read_run_folder, write_report


def map_from_checkpoint(run, max_samples: int, device: torch.device):
    """The map of the latest checkpoint's trunk, or (None, why not)."""
    if not run.checkpoints:
        return None, "no checkpoint in the folder"
    if not run.config:
        return None, "no config.yaml and no config in the checkpoints"
    cfg = AttrDict(run.config)
    if not has_test_split(cfg):
        return None, "the config has no TEST split (config.DATA.TEST.DATA_SOURCES)"
    layer = cfg.HOOKS.get("RUN_REPORT", {}).get("LAYER") or cfg.HOOKS.FEATURE_REPORT.LAYER
    try:
        state = load_checkpoint(run.checkpoints[-1])
        model = build_model(cfg.MODEL)
        model.set_classy_state(state["classy_state_dict"]["base_model"])
        return feature_map(cfg, model.to(device), layer, device, max_samples), ""
    except (CheckpointError, OSError, KeyError, RuntimeError, ValueError) as error:
        return None, f"{type(error).__name__}: {error}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="the run folder (its CHECKPOINT.DIR)")
    parser.add_argument("--max-samples", type=int, default=1000,
                        help="TEST images in the 2-D map (default 1000)")
    parser.add_argument("--no-map", action="store_true", help="curves and tables only")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    try:
        run = read_run_folder(args.folder)
    except FileNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    points = None
    if not args.no_map and args.max_samples > 0:
        points, why = map_from_checkpoint(run, args.max_samples, torch.device(args.device))
        if points is None:
            print(f"no feature map: {why}")
    png, html = write_report(args.folder, points)
    print(f"wrote {png} and {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
