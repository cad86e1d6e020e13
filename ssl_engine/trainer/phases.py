"""The sequence of train and test phases of a run."""
from typing import Dict, List


def build_phases(cfg) -> List[Dict]:
    """One train phase per epoch, a test phase after every ``TEST_EVERY_NUM_EPOCH`` epochs
    (and after the last one) when ``TEST_MODEL``; ``TEST_ONLY``: a single test phase."""
    if cfg.TEST_ONLY:
        return [{"train": False, "epoch": 0}]
    num_epochs = cfg.OPTIMIZER.num_epochs
    phases = []
    for epoch in range(num_epochs):
        phases.append({"train": True, "epoch": epoch})
        is_last = epoch == num_epochs - 1
        if cfg.TEST_MODEL and ((epoch + 1) % cfg.TEST_EVERY_NUM_EPOCH == 0 or is_last):
            phases.append({"train": False, "epoch": epoch})
    return phases
