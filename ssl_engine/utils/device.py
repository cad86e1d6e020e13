"""Moving nested batches and outputs between devices, and casting them to float32."""
import torch


def to_device(obj, device: torch.device, non_blocking: bool = False, channels_last: bool = False):
    """``obj`` (a tensor, or lists / tuples / dicts of them) on ``device``; 4-d tensors in the
    channels-last layout when asked."""
    if torch.is_tensor(obj):
        obj = obj.to(device, non_blocking=non_blocking)
        if channels_last and obj.dim() == 4:
            obj = obj.contiguous(memory_format=torch.channels_last)
        return obj
    if isinstance(obj, dict):
        return {k: to_device(v, device, non_blocking, channels_last) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device, non_blocking, channels_last) for v in obj)
    return obj


def from_host(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor``, made on the host during a step (a seeded permutation, random directions),
    on ``device`` without making the host wait: to a GPU through pinned memory with an
    asynchronous copy (a plain ``.to(device)`` waits for every queued kernel first)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def float32_outputs(obj):
    """``obj`` (a tensor, or lists / tuples / dicts of them) with its floating tensors in
    float32: what a loss receives from a forward pass run under autocast."""
    if torch.is_tensor(obj):
        return obj.float() if obj.is_floating_point() and obj.dtype != torch.float32 else obj
    if isinstance(obj, dict):
        return {key: float32_outputs(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(float32_outputs(value) for value in obj)
    return obj
