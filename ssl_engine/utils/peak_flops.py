"""Peak arithmetic throughput of the GPUs the engine knows, for the model FLOPs utilisation
(MFU: achieved FLOP/s over the device's peak) in the log.

One table, in TFLOP/s, from NVIDIA's data sheets (A100: the A100 Tensor Core GPU data sheet;
H100 and H200: the H100 and H200 Tensor Core GPU data sheets), the dense figures: the H100 and H200 sheets give
the tensor-core figures "with sparsity" (2:4 structured sparsity, which these models do not
use), twice the dense ones, which are listed here (e.g. H100 SXM bfloat16: 1,979 / 2). bfloat16 and float16 are tensor-core figures; float32 is the
non-tensor-core figure (torch runs float32 matrix products without TF32 unless
``torch.set_float32_matmul_precision`` says "high" or "medium"; then the TF32 tensor-core
figure applies). SXM and PCIe/NVL forms differ for H100 and H200 (clocks and power), and torch
names them apart; both A100 forms have the same peaks.
"""
from typing import Dict, Optional

import torch

# device -> dtype -> dense peak TFLOP/s
PEAK_TFLOPS: Dict[str, Dict[str, float]] = {
    "A100": {"bfloat16": 312.0, "float16": 312.0, "tf32": 156.0, "float32": 19.5},
    "H100 SXM": {"bfloat16": 989.5, "float16": 989.5, "tf32": 494.5, "float32": 67.0},
    "H100 PCIe": {"bfloat16": 756.5, "float16": 756.5, "tf32": 378.0, "float32": 51.0},
    "H100 NVL": {"bfloat16": 835.5, "float16": 835.5, "tf32": 417.5, "float32": 60.0},
    "H200 SXM": {"bfloat16": 989.5, "float16": 989.5, "tf32": 494.5, "float32": 67.0},
    "H200 NVL": {"bfloat16": 835.5, "float16": 835.5, "tf32": 417.5, "float32": 60.0},
}


def known_device(name: str) -> Optional[str]:
    """The PEAK_TFLOPS key of a CUDA device name (``torch.cuda.get_device_name``), or None."""
    for family in ("H200", "H100"):
        if family in name:
            if "NVL" in name:
                return f"{family} NVL"
            if "PCIe" in name or "PCIE" in name:
                return f"{family} PCIe" if family == "H100" else None
            return f"{family} SXM"  # "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    return "A100" if "A100" in name else None


def precision_name(amp_dtype: Optional[torch.dtype]) -> str:
    """The PEAK_TFLOPS column of a step: its autocast dtype, else float32 (or tf32)."""
    if amp_dtype is not None:
        return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(amp_dtype, "float32")
    return "float32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def peak_tflops(device: torch.device, amp_dtype: Optional[torch.dtype]) -> Optional[float]:
    """The dense peak TFLOP/s of ``device`` at the step's precision; None on a CPU or an
    unknown GPU (the log then shows TFLOP/s without MFU)."""
    if device.type != "cuda":
        return None
    family = known_device(torch.cuda.get_device_name(device))
    return PEAK_TFLOPS[family][precision_name(amp_dtype)] if family else None
