#!/usr/bin/env python
"""Convert model weights between this engine's checkpoints, VISSL's and torchvision's ResNets.

    python extra_scripts/convert_checkpoint.py to-vissl        OURS.torch   VISSL.torch
    python extra_scripts/convert_checkpoint.py from-vissl      VISSL.torch  OURS.torch
    python extra_scripts/convert_checkpoint.py to-torchvision  OURS.torch   resnet50.pth
    python extra_scripts/convert_checkpoint.py from-torchvision resnet50.pth OURS.torch

Only model weights are converted (trunk and heads; torchvision: the trunk), tensors unchanged:

- to-vissl: a consolidated VISSL checkpoint (``classy_state_dict -> base_model -> model ->
  {trunk, heads}``, trunk keys under ``_feature_blocks.``), with the phase and iteration of the
  source; VISSL loads it with STATE_DICT_KEY_NAME=classy_state_dict.
- from-vissl / from-torchvision: a file this engine loads as MODEL.WEIGHTS_INIT.PARAMS_FILE
  (the defaults apply). torchvision's ``fc.*`` is left out (no head).
- to-torchvision: (from this engine's or VISSL's checkpoint) the trunk of a ResNet-18/34/50/101/152 at width 1 with the standard stem,
  as a state dict of ``torchvision.models.resnet<depth>`` without ``fc.*``: set
  ``net.fc = torch.nn.Identity()`` and ``net.load_state_dict(state)`` gives the trunk's
  pooled features (layer ``res5avg``).

Every input is loaded weights-only (docs/safety.md). A file whose keys do not fit is refused
with one message naming the missing and unexpected keys; nothing is written.
"""
import argparse
import sys
from pathlib import Path

from ssl_engine.models import checkpoint_formats as formats
from ssl_engine.utils.checkpoint import CheckpointError, atomic_torch_save, load_checkpoint

POSITION_KEYS = ("phase_idx", "train_phase_idx", "iteration", "iteration_num")


def to_vissl(source: dict) -> dict:
    model_state = formats.model_state_of(source)
    if formats.is_vissl_model_state(model_state):
        raise formats.CheckpointFormatError("the file is already in VISSL's layout (trunk keys "
                                            "under _feature_blocks.)")
    trunk_name = (((source.get("config") or {}).get("MODEL") or {}).get("TRUNK") or {}).get("NAME")
    if trunk_name not in (None, "resnet") and not str(trunk_name).startswith("alexnet_"):
        raise formats.CheckpointFormatError(
            f"only ResNet and AlexNet trunks have a VISSL layout here; this checkpoint's trunk is "
            f"'{trunk_name}' (MODEL.TRUNK.NAME)")
    position = {key: source[key] for key in POSITION_KEYS if key in source}
    return formats.vissl_checkpoint(model_state, **position)


def from_vissl(source: dict) -> dict:
    return formats.engine_checkpoint(formats.model_state_from_vissl(formats.model_state_of(source)))


def to_torchvision(source: dict) -> dict:
    model_state = formats.model_state_of(source)
    if formats.is_vissl_model_state(model_state):  # a VISSL checkpoint converts as well
        model_state = formats.model_state_from_vissl(model_state)
    return formats.trunk_to_torchvision(model_state)[0]


def from_torchvision(source: dict) -> dict:
    return formats.engine_checkpoint(formats.model_state_from_torchvision(source)[0])


CONVERSIONS = {"to-vissl": to_vissl, "from-vissl": from_vissl,
               "to-torchvision": to_torchvision, "from-torchvision": from_torchvision}


def convert(direction: str, source: Path, target: Path) -> None:
    """Write the conversion of ``source`` to ``target``; raises CheckpointError (unreadable or
    unsafe file) or CheckpointFormatError (keys that do not fit)."""
    converted = CONVERSIONS[direction](load_checkpoint(source))
    atomic_torch_save(converted, target)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("direction", choices=sorted(CONVERSIONS))
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    try:
        convert(args.direction, args.source, args.target)
    except (CheckpointError, formats.CheckpointFormatError) as err:
        print(f"error: {args.source}: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
