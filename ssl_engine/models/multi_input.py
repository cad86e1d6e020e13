"""MODEL.MULTI_INPUT_HEAD_MAPPING: the model fed a dict of named inputs (VISSL's language, as
its iBOT configs use it).

Each entry is ``[input name, {"feat_names": [trunk outputs], "additional_keys": [names]}]``.
Given a dict of inputs (the masking collator's ``global_views``, ``local_views``, ``mask``),
the trunk runs once per entry whose input is present, in the mapping's order, asked for
``feat_names`` and given those of the ``additional_keys`` inputs that are present as keyword
arguments (``mask=...``; iBOT's teacher gets the global views without their masks);
the heads then run on the list of every output so produced (a lone output: itself), and
each head also receives, as keyword arguments, the additional inputs its ``forward`` names
(MAE's decoder takes ``mask``).  Entries whose input is absent are skipped (the teacher has
no local views).
"""
import inspect
from typing import Dict, List, NamedTuple, Sequence

import torch
from torch import nn

KEY = "config.MODEL.MULTI_INPUT_HEAD_MAPPING"


class InputEntry(NamedTuple):
    input_name: str
    feat_names: List[str]
    additional_keys: List[str]


def parse_mapping(mapping) -> List[InputEntry]:
    """The entries of MULTI_INPUT_HEAD_MAPPING (ValueError naming the entry otherwise)."""
    entries = []
    for index, entry in enumerate(mapping or ()):
        if (not isinstance(entry, (list, tuple)) or len(entry) != 2
                or not isinstance(entry[0], str) or not isinstance(entry[1], dict)):
            raise ValueError(f"{KEY}[{index}] must be [input name, {{feat_names: [...], "
                             f"additional_keys: [...]}}], got {entry!r}")
        name, spec = entry
        unknown = sorted(set(spec) - {"feat_names", "additional_keys"})
        if unknown or not spec.get("feat_names"):
            raise ValueError(f"{KEY}[{index}] ({name}) takes feat_names (at least one) and "
                             f"additional_keys, got {dict(spec)}")
        entries.append(InputEntry(name, [str(f) for f in spec["feat_names"]],
                                  [str(k) for k in spec.get("additional_keys") or ()]))
    return entries


def check_mapping(entries: Sequence[InputEntry], trunk: nn.Module) -> None:
    """Every entry's outputs are the trunk's and its additional inputs are parameters of the
    trunk's ``forward``."""
    accepted = inspect.signature(trunk.forward).parameters
    for index, entry in enumerate(entries):
        try:
            trunk.check_out_feat_keys(entry.feat_names)
        except ValueError as error:
            raise ValueError(f"{KEY}[{index}]: {error}") from None
        missing = [key for key in entry.additional_keys if key not in accepted]
        if missing:
            raise ValueError(f"{KEY}[{index}]: the trunk {type(trunk).__name__} takes no "
                             f"input {missing} (additional_keys)")


def head_keywords(head: nn.Module) -> List[str]:
    """The names of the keyword inputs a head's ``forward`` takes besides its first."""
    return list(inspect.signature(head.forward).parameters)[1:]


def mapped_trunk_outputs(trunk: nn.Module, entries: Sequence[InputEntry],
                         inputs: Dict[str, torch.Tensor]):
    """(the trunk's outputs of every entry present in ``inputs``, in order; the additional
    inputs they used, by name)."""
    outputs: List[torch.Tensor] = []
    extras: Dict[str, torch.Tensor] = {}
    for entry in entries:
        if entry.input_name not in inputs:
            continue
        keywords = {key: inputs[key] for key in entry.additional_keys if key in inputs}
        outputs.extend(trunk(inputs[entry.input_name], entry.feat_names, **keywords))
        extras.update(keywords)
    if not outputs:
        raise ValueError(f"none of the inputs {sorted(inputs)} is named in {KEY}")
    return outputs, extras
