"""MODEL.CUDA_CACHE: empty torch's CUDA cache every CLEAR_FREQ steps of a GPU run.

The steps counted are the ones this process runs, training and test alike, since it started;
the cache is emptied after each CLEAR_FREQ-th.  Emptying it hands the memory torch keeps for
later allocations back to the driver (it can help a run that fragments GPU memory, and slows
the steps that follow it).  On a CPU run it has nothing to empty: one line says so.
"""
import logging

import torch

logger = logging.getLogger(__name__)

KEY = "config.MODEL.CUDA_CACHE"


class CudaCacheClearer:
    def __init__(self, cfg, device: torch.device, log: bool = True):
        cache = cfg.MODEL.get("CUDA_CACHE") or {}
        enabled = bool(cache.get("CLEAR_CUDA_CACHE", False))
        self.freq = int(cache.get("CLEAR_FREQ", 100)) if enabled and device.type == "cuda" else 0
        self.steps = 0
        if enabled and log:
            if self.freq:
                logger.info("%s: emptying the CUDA cache every %d steps", KEY, self.freq)
            else:
                logger.info("%s.CLEAR_CUDA_CACHE=true has no effect on a CPU run (no CUDA "
                            "cache to empty)", KEY)

    def after_step(self) -> None:
        self.steps += 1
        if self.freq and self.steps % self.freq == 0:
            torch.cuda.empty_cache()
            logger.debug("CUDA cache emptied after step %d of this process", self.steps)
