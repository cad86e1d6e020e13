"""MODEL.MULTI_INPUT_HEAD_MAPPING: the model fed a dict of named inputs, in either of the two
forms VISSL's configs write.

Named-input form (VISSL's iBOT configs): each entry is ``[input name, {"feat_names": [trunk
outputs], "additional_keys": [names]}]``. Given a dict of inputs (the masking collator's
``global_views``, ``local_views``, ``mask``), the trunk runs once per entry whose input is
present, in the mapping's order, asked for ``feat_names`` and given those of the
``additional_keys`` inputs that are present as keyword arguments (``mask=...``; iBOT's teacher
gets the global views without their masks); the heads then run on the list of every output so
produced (a lone output: itself), and each head also receives, as keyword arguments, the
additional inputs its ``forward`` names (MAE's decoder takes ``mask``). An additional key the
trunk's ``forward`` does not take goes to the heads only, and some head must take it (I-JEPA's
predictor takes ``target_index``). Entries whose input is absent are skipped (the teacher has
no local views).

Chain form (VISSL's PIRL configs): ``[[input key, [stage]], ...]`` pairs entry ``i`` with the
chain of heads ``MODEL.HEAD.PARAMS[i]`` (a list of ``[head_name, {params}]``): the input
``x[key]`` goes through the trunk, its ``stage`` output is flattened (VISSL's stage name
``flatten`` is the trunk's default output) and goes through the heads of the chain one after
the other; the model's outputs are the chains' last outputs, in the mapping's order.
"""
import inspect
from typing import Callable, Dict, List, NamedTuple, Sequence, Tuple

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


def check_mapping(entries: Sequence[InputEntry], trunk: nn.Module,
                  heads: Sequence[nn.Module] = ()) -> None:
    """Every entry's outputs are the trunk's and its additional inputs are parameters of the
    trunk's ``forward`` or of a head's."""
    accepted = set(inspect.signature(trunk.forward).parameters)
    accepted.update(key for head in heads for key in head_keywords(head))
    for index, entry in enumerate(entries):
        try:
            trunk.check_out_feat_keys(entry.feat_names)
        except ValueError as error:
            raise ValueError(f"{KEY}[{index}]: {error}") from None
        missing = [key for key in entry.additional_keys if key not in accepted]
        if missing:
            raise ValueError(f"{KEY}[{index}]: neither the trunk {type(trunk).__name__} nor "
                             f"a head takes the input(s) {missing} (additional_keys)")


def head_keywords(head: nn.Module) -> List[str]:
    """The names of the keyword inputs a head's ``forward`` takes besides its first."""
    return list(inspect.signature(head.forward).parameters)[1:]


def mapped_trunk_outputs(trunk: nn.Module, entries: Sequence[InputEntry],
                         inputs: Dict[str, torch.Tensor]):
    """(the trunk's outputs of every entry present in ``inputs``, in order; the additional
    inputs they used, by name)."""
    outputs: List[torch.Tensor] = []
    extras: Dict[str, torch.Tensor] = {}
    accepted = inspect.signature(trunk.forward).parameters
    for entry in entries:
        if entry.input_name not in inputs:
            continue
        keywords = {key: inputs[key] for key in entry.additional_keys if key in inputs}
        outputs.extend(trunk(inputs[entry.input_name], entry.feat_names,
                             **{key: value for key, value in keywords.items() if key in accepted}))
        extras.update(keywords)
    if not outputs:
        raise ValueError(f"none of the inputs {sorted(inputs)} is named in {KEY}")
    return outputs, extras

def is_chain_mapping(mapping) -> bool:
    """Whether MULTI_INPUT_HEAD_MAPPING is in PIRL's chain form (``[key, [stage]]`` entries)."""
    return bool(mapping) and all(isinstance(entry, (list, tuple)) and len(entry) == 2
                                 and isinstance(entry[1], (list, tuple)) for entry in mapping)


def parse_chain_mapping(mapping, num_chains: int) -> List[Tuple[str, str]]:
    """[(input key, stage name)] from the config, one per chain of heads."""
    parsed = []
    for entry in mapping:
        if (not isinstance(entry, (list, tuple)) or len(entry) != 2
                or not isinstance(entry[0], str) or not isinstance(entry[1], (list, tuple))
                or len(entry[1]) != 1):
            raise ValueError(f"{KEY} entries are [input key, [one stage name]], got {entry!r}")
        parsed.append((entry[0], str(entry[1][0])))
    if len(parsed) != num_chains:
        raise ValueError(f"{KEY} has {len(parsed)} entries but config.MODEL.HEAD.PARAMS has "
                         f"{num_chains} chain(s) of heads: one chain per input")
    return parsed


def build_head_chains(params, build_head: Callable) -> nn.ModuleList:
    """One ModuleList of heads per entry of MODEL.HEAD.PARAMS (itself a list of heads)."""
    chains = []
    for index, chain in enumerate(params):
        if not isinstance(chain, (list, tuple)) or not chain or isinstance(chain[0], str):
            raise ValueError(f"with {KEY}, config.MODEL.HEAD.PARAMS[{index}] must be a list of "
                             f"heads [[head_name, {{params}}], ...], got {chain!r}")
        chains.append(nn.ModuleList(build_head(index, entry) for entry in chain))
    return nn.ModuleList(chains)


def chain_forward(trunk: nn.Module, chains: nn.ModuleList, mapping: List[Tuple[str, str]],
                  x: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    if not isinstance(x, dict) or any(key not in x for key, _ in mapping):
        found = sorted(x) if isinstance(x, dict) else type(x).__name__
        raise TypeError(f"{KEY} needs the inputs {[key for key, _ in mapping]} (e.g. "
                        f"patch_and_image_collator's), got {found}")
    outputs = []
    for (key, stage), chain in zip(mapping, chains):
        stage = trunk.default_out_feat_key if stage == "flatten" else stage
        (output,) = trunk(x[key], [stage])
        output = torch.flatten(output, 1)
        for head in chain:
            output = head(output)
        outputs.append(output)
    return outputs
