"""Strict state-dict loading whose error names every missing, unexpected or reshaped key."""
from typing import Mapping

import torch
from torch import nn

MAX_NAMED = 10  # keys named per kind of difference; the count says how many there are


def state_dict_mismatches(module: nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """A readable list of the differences between ``module.state_dict()`` and ``state``."""
    expected = module.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected]
    reshaped = [
        f"{key}: checkpoint {tuple(state[key].shape)} vs model {tuple(value.shape)}"
        for key, value in expected.items()
        if key in state and tuple(state[key].shape) != tuple(value.shape)
    ]
    problems = []
    for title, items in (("missing keys", missing), ("unexpected keys", unexpected),
                         ("shape mismatches", reshaped)):
        if items:
            more = f", ... ({len(items) - MAX_NAMED} more)" if len(items) > MAX_NAMED else ""
            problems.append(f"{title} ({len(items)}): {', '.join(items[:MAX_NAMED])}{more}")
    return "; ".join(problems)


def load_state_dict_strict(module: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """Load ``state`` into ``module``; any difference raises ValueError naming the keys."""
    problems = state_dict_mismatches(module, state)
    if problems:
        raise ValueError(f"cannot load the {what} state: {problems}")
    module.load_state_dict(state, strict=True)
