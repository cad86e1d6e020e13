"""MODEL.MULTI_INPUT_HEAD_MAPPING (VISSL's, for PIRL): the model takes a dict of inputs, each
through the trunk and then its own chain of heads.

``MULTI_INPUT_HEAD_MAPPING: [[input key, [stage]], ...]`` pairs entry ``i`` with the chain of
heads ``MODEL.HEAD.PARAMS[i]`` (a list of ``[head_name, {params}]``): the input ``x[key]`` goes
through the trunk, its ``stage`` output is flattened (VISSL's stage name ``flatten`` is the
trunk's default output) and goes through the heads of the chain one after the other; the
model's outputs are the chains' last outputs, in the mapping's order.
"""
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

KEY = "config.MODEL.MULTI_INPUT_HEAD_MAPPING"


def parse_mapping(mapping, num_chains: int) -> List[Tuple[str, str]]:
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


def multi_input_forward(trunk: nn.Module, chains: nn.ModuleList,
                        mapping: List[Tuple[str, str]],
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
