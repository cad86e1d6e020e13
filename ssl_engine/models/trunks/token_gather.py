"""Selecting the visible tokens of a patch mask by index, without waiting for the device.

Boolean-mask indexing (``tokens[~mask]``) sizes its output by the number of True values,
which the host must read back from the device before it can queue anything else. When
every image masks the same, known number of patches (MAE's RandomPatchMasking), a stable
sort of the mask gives the visible positions in grid order with a shape known in advance, and
``gather`` / ``scatter`` do the rest. MAE's encoder (trunks/vision_transformer.py) and its
decoder (heads/mae_decoder.py) share these.
"""
import torch


def visible_positions(mask: torch.Tensor, masked: int) -> torch.Tensor:
    """[N, L - masked] indices (grid order) of the unmasked patches of ``mask`` ([N, h, w] or
    [N, L], True: masked), for masks that mask ``masked`` patches in every row."""
    flat = mask.flatten(1)
    order = torch.argsort(flat.to(torch.uint8), dim=1, stable=True)  # visible first, in order
    return order[:, :flat.shape[1] - masked]


def assert_on_device(condition: torch.Tensor, message: str) -> None:
    """Fail with ``message`` (ValueError) unless every element of ``condition`` holds. On a GPU
    the check runs on the device (an asynchronous assert: no wait, and a failure stops the
    process with a device-side assertion); on a CPU it raises at once."""
    try:
        torch._assert_async(condition.all(), message)
    except RuntimeError as err:
        if message in str(err):
            raise ValueError(message) from None
        raise
