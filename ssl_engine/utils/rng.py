"""Seeding and the RNG states a checkpoint keeps (torch, cuda, numpy, python)."""
import random
from typing import Any, Dict, List

import numpy as np
import torch


def set_seeds(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def get_rng_state() -> Dict[str, Any]:
    state = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def select_rank_state(states: List[Dict[str, Any]], rank: int) -> Dict[str, Any]:
    """This rank's saved state; a run resumed on more ranks than it saved reuses rank 0's."""
    return states[rank] if rank < len(states) else states[0]
