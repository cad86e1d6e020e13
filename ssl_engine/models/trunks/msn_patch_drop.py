"""MSN's random patch drop (Assran et al. 2022): the anchor views of the student lose a share of
their patch tokens before the first block; the class token always stays.

MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING = {NAME: msn, PARAMS: {drop_ratio}}
puts a ``PatchDrop`` in the ViT where timm applies its patch dropout (after the position
embeddings, before the blocks), so the kept tokens carry their own positions.

As in MSN, one random set of patch positions is kept for the whole batch of a forward call
(every sample and every rank alike): ``floor(L * (1 - drop_ratio))`` of the ``L`` patch
tokens, at least one.  The set is drawn from a generator seeded by ``seed`` (the config's
SEED_VALUE unless PARAMS.seed says otherwise) and the number of training forward calls made
so far, a buffer of the trunk: a resumed run replays the drops of an uninterrupted one, and
two processes with half the batch each drop what one process drops.  Only training forwards
drop (and count); evaluation and feature extraction see every patch.  ``enabled = False``
turns it off for good (MSN's target network, a copy of the student, sees whole images).

``global_view_tokens`` (VISSL's name; default: none) limits the drop to the views with exactly
that many patch tokens, the global views (196 for 224-pixel images in 16-pixel patches): the
smaller local views keep every patch.  Every training forward still counts as a call.
"""
from typing import Mapping

import torch
from torch import nn

from ssl_engine.utils.device import from_host

PARAMS_KEYS = ("drop_ratio", "seed", "global_view_tokens")
WHERE = "config.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING.PARAMS"


class PatchDrop(nn.Module):
    """Keeps a random subset of the patch tokens of ``[N, prefix + L, D]`` token tensors."""

    def __init__(self, drop_ratio: float, num_prefix_tokens: int, seed: int = 0,
                 global_view_tokens: int = 0):
        super().__init__()
        if not 0.0 <= drop_ratio < 1.0:
            raise ValueError(f"{WHERE}.drop_ratio must be in [0, 1), got {drop_ratio}")
        self.drop_ratio = float(drop_ratio)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.seed = int(seed)
        self.global_view_tokens = int(global_view_tokens or 0)  # 0: every view drops
        self.enabled = True
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        # the same count on the host: reading the buffer back from the device at every call
        # would make the host wait; a loaded state dict sets both
        self._host_calls = 0

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if prefix + "calls" in state_dict:  # a checkpoint's tensor, on the host
            self._host_calls = int(state_dict[prefix + "calls"])

    def kept_positions(self, num_patches: int, call: int) -> torch.Tensor:
        """The patch positions (sorted, 0-based among the patches) that call ``call`` keeps."""
        keep = max(1, int(num_patches * (1.0 - self.drop_ratio)))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + call)
        return torch.randperm(num_patches, generator=generator)[:keep].sort().values

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if not (self.training and self.enabled and self.drop_ratio > 0):
            return tokens
        call = self._host_calls
        self._host_calls += 1
        self.calls += 1
        prefix = self.num_prefix_tokens
        if self.global_view_tokens and tokens.shape[1] - prefix != self.global_view_tokens:
            return tokens  # a local view
        kept = self.kept_positions(tokens.shape[1] - prefix, call) + prefix
        index = from_host(torch.cat([torch.arange(prefix), kept]), tokens.device)
        return tokens.index_select(1, index)

    def extra_repr(self) -> str:
        only = f", global_view_tokens={self.global_view_tokens}" if self.global_view_tokens else ""
        return f"drop_ratio={self.drop_ratio}, seed={self.seed}{only}"


def msn_patch_drop(params: Mapping, num_prefix_tokens: int) -> PatchDrop:
    """The ``PatchDrop`` of MASKED_IMAGE_MODELING.PARAMS (``drop_ratio``, ``seed``,
    ``global_view_tokens``)."""
    unknown = sorted(set(params or {}) - set(PARAMS_KEYS))
    if unknown:
        raise ValueError(f"{WHERE} has unknown key(s) {unknown} for NAME=msn; it takes "
                         f"{', '.join(PARAMS_KEYS)}")
    params = dict(params or {})
    if "drop_ratio" not in params:
        raise ValueError(f"{WHERE}.drop_ratio is needed for NAME=msn (e.g. 0.7, MSN's ViT-S)")
    return PatchDrop(float(params["drop_ratio"]), num_prefix_tokens, int(params.get("seed", 0)),
                     int(params.get("global_view_tokens") or 0))


def disable_patch_drop(network: nn.Module) -> None:
    """Turn off every ``PatchDrop`` of ``network`` (a target network sees whole images)."""
    for module in network.modules():
        if isinstance(module, PatchDrop):
            module.enabled = False
