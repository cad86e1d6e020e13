"""Strict state-dict loading whose error names every missing, unexpected or reshaped key.

``BaseSSLMultiInputOutputModel.set_classy_state`` loads its trunk and heads with it; the
checkpoint formats (``ssl_engine.checkpoint.formats``) word their key differences alike.
"""
from typing import Iterable, Mapping

import torch
from torch import nn

MAX_NAMED = 10  # keys named per kind of difference; the count says how many there are


def named_keys(keys: Iterable) -> str:
    """The first ``MAX_NAMED`` of ``keys``, then how many more there are."""
    keys = list(keys)
    more = f", ... ({len(keys) - MAX_NAMED} more)" if len(keys) > MAX_NAMED else ""
    return ", ".join(keys[:MAX_NAMED]) + more


def key_differences(missing, unexpected, reshaped=()) -> str:
    """The missing, unexpected and reshaped keys, each kind with its count ('' when none)."""
    return "; ".join(f"{title} ({len(items)}): {named_keys(items)}"
                     for title, items in (("missing keys", list(missing)),
                                          ("unexpected keys", list(unexpected)),
                                          ("shape mismatches", list(reshaped))) if items)


def state_dict_mismatches(module: nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """A readable list of the differences between ``module.state_dict()`` and ``state``."""
    expected = module.state_dict()
    return key_differences(
        [key for key in expected if key not in state],
        [key for key in state if key not in expected],
        [f"{key}: checkpoint {tuple(state[key].shape)} vs model {tuple(value.shape)}"
         for key, value in expected.items()
         if key in state and tuple(state[key].shape) != tuple(value.shape)])


def load_state_dict_strict(module: nn.Module, state: Mapping[str, torch.Tensor], what: str) -> None:
    """Load ``state`` into ``module``; any difference raises ValueError naming the keys."""
    problems = state_dict_mismatches(module, state)
    if problems:
        raise ValueError(f"cannot load the {what} state: {problems}")
    module.load_state_dict(state, strict=True)
