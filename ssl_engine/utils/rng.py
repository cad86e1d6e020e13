"""Seeding and the RNG states a checkpoint keeps (torch, cuda, numpy, python).

The states are stored as tensors, numbers and strings only, so that a checkpoint loads with
``torch.load(weights_only=True)``: numpy's state (a tuple holding a uint32 array) and python's
(a tuple of ints) are converted on the way out and back on the way in. States saved as the
raw tuples (checkpoints of earlier versions) are restored as well.
"""
import random
from typing import Any, Dict, List

import numpy as np
import torch


def set_seeds(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _numpy_to_plain(state) -> Dict[str, Any]:
    name, key, pos, has_gauss, cached_gaussian = state
    return {"bit_generator": str(name), "key": torch.from_numpy(key.astype(np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian)}


def _numpy_from_plain(state):
    if not isinstance(state, dict):  # the raw tuple of earlier checkpoints
        return state
    key = np.asarray(state["key"], dtype=np.int64).astype(np.uint32)
    return (state["bit_generator"], key, state["pos"], state["has_gauss"],
            state["cached_gaussian"])


def _python_to_plain(state) -> Dict[str, Any]:
    version, internal, gauss_next = state
    return {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": gauss_next}


def _python_from_plain(state):
    if not isinstance(state, dict):
        return (state[0], tuple(state[1]), state[2])
    internal = tuple(int(v) for v in state["internal"].tolist())
    return (state["version"], internal, state["gauss_next"])


def get_rng_state() -> Dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_to_plain(np.random.get_state()),
        "python": _python_to_plain(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(_numpy_from_plain(state["numpy"]))
    random.setstate(_python_from_plain(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def select_rank_state(states: List[Dict[str, Any]], rank: int) -> Dict[str, Any]:
    """This rank's saved state; a run resumed on more ranks than it saved reuses rank 0's."""
    return states[rank] if rank < len(states) else states[0]
