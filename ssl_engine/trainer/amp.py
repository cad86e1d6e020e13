"""Mixed precision (MODEL.AMP_PARAMS) on ``torch.amp``.

The trunk's forward pass (the model's and a momentum target's) runs under autocast in bfloat16
or float16; the heads run in float32 (models/head_precision.py), except, on a GPU,
transformer heads that declare ``MIXED_PRECISION`` (MAE's decoder and the like), which run under
it too; the loss always runs in float32 on float32 copies of the model's outputs
(``float32_outputs`` in utils/device.py), so softmaxes over large logits, normalisations and
cross-correlations keep their precision.
Parameters, gradients, optimizer state and EMA updates stay float32. float16 needs a
GradScaler (CUDA only); its state is part of the checkpoint.
"""
import contextlib
import logging
from typing import Any, Dict, Optional

import torch

from ssl_engine.config.gpu_settings import APEX_AMP_ARGS
from ssl_engine.utils.errors import ConfigError

logger = logging.getLogger(__name__)

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def amp_dtype(amp_cfg, device_type: str) -> Optional[torch.dtype]:
    """The autocast dtype of MODEL.AMP_PARAMS on ``device_type`` (None: AMP off); refuses the
    settings that cannot run: apex, an unknown dtype, float16 on a CPU."""
    if not amp_cfg.USE_AMP:
        return None
    amp_type = str(amp_cfg.AMP_TYPE).lower()
    if amp_type == "apex":
        raise ConfigError(
            "config.MODEL.AMP_PARAMS.AMP_TYPE=apex is not supported (apex is not maintained for "
            "current torch): use config.MODEL.AMP_PARAMS.AMP_TYPE=pytorch, with "
            "config.MODEL.AMP_PARAMS.AMP_ARGS.dtype=float16 for apex's O1 on GPUs or bfloat16")
    if amp_type != "pytorch":
        raise ConfigError(f"config.MODEL.AMP_PARAMS.AMP_TYPE must be pytorch, "
                          f"got {amp_cfg.AMP_TYPE!r}")
    args = amp_cfg.get("AMP_ARGS", None) or {}
    name = args.get("dtype", None) or ("bfloat16" if device_type == "cpu" else "float16")
    if str(name) not in DTYPES:
        raise ConfigError(f"config.MODEL.AMP_PARAMS.AMP_ARGS.dtype must be one of bfloat16, "
                          f"float16; got {name!r}")
    dtype = DTYPES[str(name)]
    if dtype == torch.float16 and device_type != "cuda":
        raise ConfigError("config.MODEL.AMP_PARAMS.AMP_ARGS.dtype=float16 needs a GPU; on a CPU "
                          "use bfloat16 (the default there)")
    unknown = set(args) - {"dtype", *APEX_AMP_ARGS}  # apex's: dropped, warned, when composed
    if unknown:
        raise ConfigError(f"unknown config.MODEL.AMP_PARAMS.AMP_ARGS keys {sorted(unknown)}; "
                          "known: dtype (bfloat16 | float16)")
    return dtype


def cpu_has_bf16() -> bool:
    """Whether oneDNN runs bfloat16 natively on this CPU."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def compile_unavailable_reason(device_type: str) -> Optional[str]:
    """Why torch.compile cannot build kernels here, or None.  Its CPU backend compiles C++
    kernels whose Python bindings include Python.h."""
    import os
    import sysconfig

    if device_type == "cpu" and not os.path.isfile(
            os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        return ("torch.compile's CPU backend builds C++ kernels that include Python.h, which is "
                "not installed (install the Python development headers, e.g. python3-dev)")
    return None


class MixedPrecision:
    """What a train step needs for AMP: ``autocast()`` for the forward pass, ``backward`` and
    ``step`` that go through the GradScaler when there is one, and its state."""

    def __init__(self, dtype: Optional[torch.dtype], device_type: str):
        self.dtype = dtype
        self.device_type = device_type
        self.scaler = (torch.amp.GradScaler(device_type)
                       if dtype == torch.float16 else None)

    @classmethod
    def from_config(cls, cfg, device: torch.device) -> "MixedPrecision":
        dtype = amp_dtype(cfg.MODEL.AMP_PARAMS, device.type)
        if dtype == torch.bfloat16 and device.type == "cpu" and not cpu_has_bf16():
            logger.warning("config.MODEL.AMP_PARAMS.USE_AMP=true, but this CPU has no native "
                           "bfloat16 instructions (avx512_bf16 / amx): bfloat16 is emulated and "
                           "likely slower than float32; set config.MODEL.AMP_PARAMS.USE_AMP=false")
        return cls(dtype, device.type)

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer) -> None:
        """Divide the gradients by the loss scale now (before clipping them); ``step`` then
        leaves them as they are."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer, **kwargs) -> None:
        if self.scaler is None:
            optimizer.step(**kwargs)
        else:  # skipped when the scaled gradients overflowed; the scale then shrinks
            self.scaler.step(optimizer, **kwargs)
            self.scaler.update()

    def state_dict(self) -> Dict[str, Any]:
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

