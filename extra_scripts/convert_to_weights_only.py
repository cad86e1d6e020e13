#!/usr/bin/env python
"""Rewrite a weights file you trust as plain data that the engine loads weights-only.

    python extra_scripts/convert_to_weights_only.py IN.pth OUT.torch --i-trust-this-file

The engine refuses a file that holds Python objects other than tensors, numbers, strings and
containers of them, because unpickling such objects can run code the file carries (see
docs/safety.md). Some files you may legitimately want to use hold such objects: a checkpoint
with its ``argparse.Namespace`` of arguments, numpy scalars, a whole pickled ``nn.Module``.
This script loads IN **with full unpickling, which runs whatever code IN carries**: use it
only on a file whose origin you trust. It writes OUT with:

- numpy arrays and scalars as tensors and numbers, ``argparse.Namespace`` as a dict,
  an ``nn.Module`` as its ``state_dict()``, an enum member as its value;
- any other object left out (each one is listed on stdout).

OUT is then checked by loading it back the way the engine does.
"""
import argparse
import enum
import sys
from pathlib import Path
from typing import Any, List

import numpy as np
import torch

from ssl_engine.checkpoint import atomic_torch_save, check_plain_state, load_checkpoint

_LEAVES = (type(None), bool, int, float, complex, str, bytes, bytearray, torch.dtype,
           torch.device, torch.Size)
_LEFT_OUT = object()  # what to_plain returns for an object it cannot convert


def to_plain(obj: Any, where: str, dropped: List[str]) -> Any:
    """``obj`` as tensors, numbers, strings and dicts/lists/tuples of them; the path of every
    object that cannot be converted is appended to ``dropped``, and _LEFT_OUT returned."""
    if torch.is_tensor(obj):
        return obj.detach().clone() if isinstance(obj, torch.nn.Parameter) else obj
    if type(obj) in _LEAVES:
        return obj
    if isinstance(obj, enum.Enum):
        return to_plain(obj.value, where, dropped)
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, argparse.Namespace):
        obj = vars(obj)
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            key = to_plain(key, f"{where} (a key)", dropped)
            if key is _LEFT_OUT:
                continue
            value = to_plain(value, f"{where}/{key}", dropped)
            if value is not _LEFT_OUT:
                out[key] = value
        return out
    if isinstance(obj, (list, tuple, set, frozenset)):
        items = [to_plain(v, f"{where}[{i}]", dropped) for i, v in enumerate(obj)]
        items = [v for v in items if v is not _LEFT_OUT]
        return tuple(items) if isinstance(obj, tuple) else items
    dropped.append(f"{where} ({type(obj).__module__}.{type(obj).__qualname__})")
    return _LEFT_OUT


def convert(source: Path, target: Path) -> List[str]:
    """Write the plain-data version of ``source`` to ``target``; return what was left out."""
    obj = torch.load(source, map_location="cpu", weights_only=False)  # trusted by the caller
    dropped: List[str] = []
    plain = to_plain(obj, "file", dropped)
    if plain is _LEFT_OUT:
        raise SystemExit(f"error: {source} holds a {type(obj).__name__}, nothing to convert")
    check_plain_state(plain, "file")
    atomic_torch_save(plain, target)
    load_checkpoint(target)  # the engine's own load accepts it
    return dropped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--i-trust-this-file", action="store_true",
                        help="confirm that SOURCE comes from a trusted origin: loading it runs "
                             "any code it carries")
    args = parser.parse_args(argv)
    if not args.i_trust_this_file:
        print(f"error: loading {args.source} fully runs any code it carries; if you trust its "
              "origin, run again with --i-trust-this-file", file=sys.stderr)
        return 2
    if not args.source.is_file():
        print(f"error: {args.source} does not exist", file=sys.stderr)
        return 2
    dropped = convert(args.source, args.target)
    for entry in dropped:
        print(f"left out {entry}")
    print(f"wrote {args.target} ({len(dropped)} entries left out)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
