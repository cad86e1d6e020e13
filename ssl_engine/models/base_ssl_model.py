"""The SSL model: a trunk run on every input crop, then a chain of heads."""
from typing import Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from ssl_engine.models.registry import MODEL_HEADS, MODEL_TRUNKS
from ssl_engine.models.state_dict import load_state_dict_strict

ModelInput = Union[torch.Tensor, Sequence[torch.Tensor]]


def build_head(index: int, entry) -> nn.Module:
    """One head from an entry ``[head_name, {params}]`` of MODEL.HEAD.PARAMS."""
    where = f"MODEL.HEAD.PARAMS[{index}]"
    if not isinstance(entry, (list, tuple)) or len(entry) != 2 or not isinstance(entry[0], str):
        raise ValueError(f"{where} must be [head_name, {{params}}], got {entry!r}")
    name, params = entry
    head_cls = MODEL_HEADS.get(name)
    params = dict(params or {})
    try:
        return head_cls(**params)
    except TypeError as error:
        raise ValueError(f"{where} ('{name}') has invalid params {params}: {error}") from None


def concat_crops(stage: str, features: List[torch.Tensor]) -> torch.Tensor:
    """The features of every crop along dim 0; crops must agree on the other dimensions."""
    shapes = {tuple(f.shape[1:]) for f in features}
    if len(shapes) > 1:
        raise ValueError(
            f"stage '{stage}' gives differently shaped features for the input crops "
            f"{sorted(shapes)}; request a pooled stage or feed crops of one resolution"
        )
    return torch.cat(features, dim=0)


class BaseSSLMultiInputOutputModel(nn.Module):
    """``trunk`` (MODEL.TRUNK.NAME) followed by ``heads`` (MODEL.HEAD.PARAMS, applied in order).

    ``forward`` takes one batch [N, C, H, W] or a list of batches (multi-crop, any resolutions):
    the trunk runs on each, the outputs are concatenated along dim 0 in input order, and the
    heads run once on the result.  It returns a list of outputs (one: the last head's output, or
    the flattened trunk output when there are no heads).
    """

    def __init__(self, model_cfg):
        super().__init__()
        self.trunk = MODEL_TRUNKS.get(model_cfg.TRUNK.NAME)(model_cfg)
        self.heads = nn.ModuleList(
            build_head(index, entry) for index, entry in enumerate(model_cfg.HEAD.PARAMS)
        )

    def extract_features(
        self, x: ModelInput, out_feat_keys: Optional[Sequence[str]] = None
    ) -> Dict[str, torch.Tensor]:
        """Trunk stage outputs by name (default: the trunk's default output), crops concatenated."""
        batches = [x] if isinstance(x, torch.Tensor) else list(x)
        if not batches or not all(isinstance(batch, torch.Tensor) for batch in batches):
            raise TypeError("the model takes a Tensor or a non-empty list of Tensors")
        keys = self.trunk.check_out_feat_keys(out_feat_keys)
        per_batch = [self.trunk(batch, keys) for batch in batches]
        return {key: concat_crops(key, [f[i] for f in per_batch]) for i, key in enumerate(keys)}

    def forward(self, x: ModelInput) -> List[torch.Tensor]:
        (output,) = self.extract_features(x).values()
        if not self.heads:
            return [torch.flatten(output, 1)]
        for head in self.heads:
            output = head(output)
        return [output]

    def get_classy_state(self) -> dict:
        return {"model": {"trunk": self.trunk.state_dict(), "heads": self.heads.state_dict()}}

    def set_classy_state(self, state: dict) -> None:
        """Load a ``get_classy_state()`` dict; any missing, extra or reshaped key raises."""
        model_state = state.get("model") if isinstance(state, dict) else None
        if not isinstance(model_state, dict) or set(model_state) != {"trunk", "heads"}:
            found = sorted(model_state) if isinstance(model_state, dict) else sorted(state or {})
            raise ValueError(
                "model state must be {'model': {'trunk': ..., 'heads': ...}}, "
                f"found keys {found}"
            )
        load_state_dict_strict(self.trunk, model_state["trunk"], "trunk")
        load_state_dict_strict(self.heads, model_state["heads"], "heads")


def build_model(model_cfg) -> BaseSSLMultiInputOutputModel:
    """The SSL model described by ``cfg.MODEL``."""
    return BaseSSLMultiInputOutputModel(model_cfg)
