"""The precision of the heads under mixed precision (MODEL.AMP_PARAMS).

Mixed precision is for where the compute is. A projection or prototype head is a small part of
a step and makes the embeddings that the losses compare at fine resolution, so the heads run in
float32, autocast off, on float32 copies of the trunk's output. A head that is itself a
transformer (MAE's decoder, I-JEPA's predictor, data2vec 2.0's decoder, AIM's head; CAPI's head
stays in float32 for its clustering) can hold as much compute as the trunk: it sets the class
attribute ``MIXED_PRECISION = True`` and runs under the trunk's autocast instead on a GPU (its
final normalisations and linear layers cast as autocast casts them; the loss still receives
float32 copies of every output, utils/device.py ``float32_outputs``). Measured: MAE ViT-B/16's
bfloat16 step on an H200 went from 1.84x the bare loop's to 0.78x. On a CPU these heads stay in
float32: there the I-JEPA quickstart's step under bfloat16 heads took 658 ms instead of 475
(the backward pass 336 ms instead of 176), at the same accuracy.
"""
import contextlib
from typing import Optional, Tuple

import torch

AUTOCAST_DEVICES = ("cuda",)  # where MIXED_PRECISION heads run under autocast


class HeadPrecision:
    """Given by ``float32_heads``: ``input`` casts a head's input, calling it runs a head
    (under the trunk's autocast when the head declares ``MIXED_PRECISION`` and the device is
    one of ``AUTOCAST_DEVICES``)."""

    def __init__(self, autocast: Optional[Tuple[str, torch.dtype]]):
        self.autocast = autocast  # (device type, dtype) of the trunk's autocast, or None

    def input(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self.autocast is None else tensor.float()

    def __call__(self, head, *args, **kwargs):
        if self.autocast is None or not getattr(head, "MIXED_PRECISION", False) \
                or self.autocast[0] not in AUTOCAST_DEVICES:
            return head(*args, **kwargs)
        device_type, dtype = self.autocast
        with torch.autocast(device_type, dtype=dtype):
            return head(*args, **kwargs)


@contextlib.contextmanager
def float32_heads(features: torch.Tensor):
    """Autocast off for the heads when it is on for ``features``' device; yields the
    ``HeadPrecision`` to run them with."""
    device_type = features.device.type
    if not torch.is_autocast_enabled(device_type):
        yield HeadPrecision(None)
        return
    dtype = torch.get_autocast_dtype(device_type)
    with torch.autocast(device_type, enabled=False):
        yield HeadPrecision((device_type, dtype))
