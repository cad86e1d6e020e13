#!/usr/bin/env python
"""Export a run's model for timm, torchvision, safetensors or VISSL, with a JSON of what it is.

    python tools/export_model.py RUN_DIR_OR_CHECKPOINT --to timm --out vit_s16.safetensors
    python tools/export_model.py model_final_checkpoint_phase99.torch --to torchvision \\
        --out resnet50.pth --heads
    python tools/export_model.py vissl_checkpoint.torch --to timm --out vit.safetensors \\
        --config config=pretrain/dino/dino_vit_s16

The trunk's settings come from the checkpoint's config (this engine's checkpoints hold it);
for a file without one (VISSL's, a weights-only file) give the config that built it with
``--config`` (the run command's overrides).  The logic lives in ssl_engine.checkpoint.export;
docs/evaluation.md ("Use the model elsewhere") says how to load each target.
"""
import argparse
import sys
from pathlib import Path

from ssl_engine.checkpoint.counterparts import NoCounterpartError
from ssl_engine.checkpoint.export import (EXPORT_TARGETS, ExportError, export_model,
                                          from_vissl_if_needed, read_source)
from ssl_engine.checkpoint.io import CheckpointError
from ssl_engine.config.attr_dict import AttrDict


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("source", help="a run folder (its latest checkpoint) or a checkpoint file")
    p.add_argument("--to", default="safetensors", dest="target",
                   help=f"target layout: {' | '.join(EXPORT_TARGETS)} (default safetensors)")
    p.add_argument("--out", required=True, help="the weights file (.safetensors by default; "
                   ".pth/.pt/.torch for a torch file); its description goes to <out>.json")
    p.add_argument("--heads", action="store_true", help="export the heads too")
    p.add_argument("--config", nargs="+", default=None,
                   help="overrides composing the config that built the model, for a "
                   "checkpoint without one (e.g. config=pretrain/dino/dino_vit_s16)")
    return p


def run_config(saved, overrides):
    """The run's config: the checkpoint's, else the one composed from ``overrides``."""
    if overrides:
        import ssl_engine.losses  # noqa: F401  (their settings count in the composed config)
        import ssl_engine.models  # noqa: F401
        from ssl_engine.config import compose_config

        # composed and validated, not derived: the device and data checks do not concern it
        return compose_config(list(overrides))[1]
    if saved is None:
        raise ExportError("the checkpoint holds no config: give the one that built it with "
                          "--config config=<group/name> [overrides]")
    return AttrDict(saved)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.target not in EXPORT_TARGETS:
        print(f"error: unknown --to {args.target!r}: one of {', '.join(EXPORT_TARGETS)}",
              file=sys.stderr)
        return 2
    try:
        state, saved, is_vissl = read_source(Path(args.source))
        cfg = run_config(saved, args.config)
        state = from_vissl_if_needed(state, cfg.MODEL.TRUNK.NAME, is_vissl)
        description = export_model(state, cfg.MODEL, args.target, Path(args.out),
                                   heads=args.heads, run_cfg=cfg, source=str(args.source))
    except (ExportError, NoCounterpartError, CheckpointError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} ({description['trunk']} for {args.target})")
    if description.get("build"):
        print(f"load it into: {description['build']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
