#!/usr/bin/env python
"""Convert model weights between this engine's checkpoints, VISSL's and torchvision's ResNets.

    python extra_scripts/convert_checkpoint.py to-vissl        OURS.torch   VISSL.torch [--trunk T]
    python extra_scripts/convert_checkpoint.py from-vissl      VISSL.torch  OURS.torch  [--trunk T]
    python extra_scripts/convert_checkpoint.py to-torchvision  OURS.torch   resnet50.pth
    python extra_scripts/convert_checkpoint.py from-torchvision resnet50.pth OURS.torch

Only model weights are converted (trunk and heads; torchvision: the trunk), tensors unchanged:

- to-vissl: a consolidated VISSL checkpoint (``classy_state_dict -> base_model -> model ->
  {trunk, heads}``, trunk keys as VISSL's trunk of that name spells them: a ResNet's under
  ``_feature_blocks.``), with the phase and iteration of the source; VISSL loads it with
  STATE_DICT_KEY_NAME=classy_state_dict. The trunk is the one the checkpoint's config names
  (``--trunk`` overrides); a vision_transformer (timm's names) is refused.
- from-vissl: ``--trunk`` names the trunk (default resnet): a ResNet's ``_feature_blocks.`` is
  taken off, other trunks' names are VISSL's already.
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
from typing import Optional

from ssl_engine.checkpoint import CheckpointError, atomic_torch_save, formats, load_checkpoint

POSITION_KEYS = ("phase_idx", "train_phase_idx", "iteration", "iteration_num")


def trunk_name_of(source: dict) -> Optional[str]:
    """MODEL.TRUNK.NAME of the config saved in this engine's checkpoints (None without one)."""
    return (((source.get("config") or {}).get("MODEL") or {}).get("TRUNK") or {}).get("NAME")


def to_vissl(source: dict, trunk: Optional[str] = None) -> dict:
    """This engine's checkpoint in VISSL's layout of its trunk (``trunk`` or the one its config
    names; a file without either is taken for a ResNet)."""
    model_state = formats.model_state_of(source)
    trunk = trunk or trunk_name_of(source)
    prefix = formats.trunk_vissl_layout(trunk)
    if prefix is None:
        raise formats.CheckpointFormatError(
            f"this checkpoint's trunk '{trunk}' (MODEL.TRUNK.NAME) has no VISSL layout here: its "
            "parameter names are not VISSL's")
    if formats.ENGINE_CHECKPOINT_KEYS[0] not in source and prefix \
            and formats.is_vissl_model_state(model_state, prefix):
        raise formats.CheckpointFormatError("the file is already in VISSL's layout (trunk keys "
                                            f"under {prefix})")
    position = {key: source[key] for key in POSITION_KEYS if key in source}
    return formats.vissl_checkpoint(model_state, prefix, **position)


def from_vissl(source: dict, trunk: Optional[str] = None) -> dict:
    """A VISSL checkpoint of a ``trunk`` (default: a ResNet) as this engine's weights file."""
    prefix = formats.vissl_key_prefix(trunk or "resnet")
    return formats.engine_checkpoint(
        formats.model_state_from_vissl(formats.model_state_of(source), prefix))


def to_torchvision(source: dict, trunk: Optional[str] = None) -> dict:
    model_state = formats.model_state_of(source)
    if formats.is_vissl_model_state(model_state):  # a VISSL checkpoint converts as well
        model_state = formats.model_state_from_vissl(model_state)
    return formats.trunk_to_torchvision(model_state)[0]


def from_torchvision(source: dict, trunk: Optional[str] = None) -> dict:
    return formats.engine_checkpoint(formats.model_state_from_torchvision(source)[0])


CONVERSIONS = {"to-vissl": to_vissl, "from-vissl": from_vissl,
               "to-torchvision": to_torchvision, "from-torchvision": from_torchvision}


def convert(direction: str, source: Path, target: Path, trunk: Optional[str] = None) -> None:
    """Write the conversion of ``source`` to ``target``; raises CheckpointError (unreadable or
    unsafe file) or CheckpointFormatError (keys that do not fit)."""
    converted = CONVERSIONS[direction](load_checkpoint(source), trunk)
    atomic_torch_save(converted, target)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("direction", choices=sorted(CONVERSIONS))
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--trunk", help="MODEL.TRUNK.NAME of the weights (to-vissl: default the "
                        "one the checkpoint's config names; from-vissl: default resnet)")
    args = parser.parse_args(argv)
    try:
        convert(args.direction, args.source, args.target, args.trunk)
    except (CheckpointError, formats.CheckpointFormatError) as err:
        print(f"error: {args.source}: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
