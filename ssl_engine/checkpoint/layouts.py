"""Which layout a weights file is in, read from its keys, for MODEL.WEIGHTS_INIT: this engine's
(``trunk.*``, ``heads.*``), VISSL's ViT (``class_token``, ``pos_embedding``), or a plain state
dict of the trunk's timm or torchvision counterpart (``counterparts``).

A plain state dict (no key under ``trunk.`` or ``heads.``) is read through each counterpart's
renaming of the model's trunk; the one under which most of the trunk's keys are found wins when
it finds at least half of them, and its keys become ``trunk.<k>``.  Keys it does not place (a
classifier ``fc.*``, ``head.*``) keep the file's names and are reported unexpected.  Buffers every
library recomputes (``relative_position_index``) are taken from the model.
"""
from typing import Dict, Mapping, Optional, Tuple

import torch

from ssl_engine.checkpoint import counterpart_maps as maps
from ssl_engine.checkpoint.counterparts import DERIVED, matches
from ssl_engine.checkpoint.formats import VISSL_VIT_NAMES, vit_trunk_from_vissl
from ssl_engine.models.registry import MODEL_TRUNKS

StateDict = Dict[str, torch.Tensor]
MIN_SHARE = 0.5  # share of the trunk's keys a layout must place to be chosen


def trunk_name_of(model: torch.nn.Module) -> Optional[str]:
    """The registered name of ``model.trunk``'s class (None when not registered)."""
    cls = type(getattr(model, "trunk", None))
    return next((n for n in MODEL_TRUNKS.names() if MODEL_TRUNKS.get(n) is cls), None)


def _positional(file_state: Mapping[str, torch.Tensor], trunk_state: Mapping[str, torch.Tensor],
                skip: str) -> StateDict:
    """The file's keys (but ``skip*``) named as the trunk's, in order, where every shape
    agrees; the file unchanged otherwise."""
    theirs = [k for k in file_state if not k.startswith(skip)]
    ours = list(trunk_state)
    if len(theirs) != len(ours) or any(tuple(file_state[a].shape) != tuple(trunk_state[b].shape)
                                       for a, b in zip(theirs, ours)):
        return dict(file_state)
    renamed = dict(zip(theirs, ours))
    return {renamed.get(k, k): v for k, v in file_state.items()}


def readers(trunk_name: str, trunk_state: Mapping[str, torch.Tensor]):
    """{layout name: function reading such a plain state dict in the trunk's names}."""
    strip_model = (lambda s: maps.add_prefix(s, "model."))
    table = {
        "resnet": {"timm/torchvision ResNet": maps.identity},
        "vision_transformer": {"timm VisionTransformer": lambda s: maps.add_prefix(s, "vit.")},
        "swin_transformer": {"timm SwinTransformer": maps.swin_from_timm},
        "convnext": {"timm ConvNeXt": maps.convnext_from_timm},
        "xcit": {"timm XCiT": maps.xcit_from_timm},
        "beit": {"timm Beit": maps.identity},
        "regnet": {"torchvision RegNet": maps.regnet_from_torchvision},
        "efficientnet": {"torchvision EfficientNet":
                         lambda s: _positional(s, trunk_state, "classifier.")},
        "mobilenetv3_tv": {"torchvision MobileNetV3": strip_model},
        "mobilenetv3_timm": {"timm MobileNetV3": strip_model},
    }
    return table.get(trunk_name, {})


def adapt_to_model(state: Mapping[str, torch.Tensor],
                   model: torch.nn.Module) -> Tuple[StateDict, str]:
    """``state`` (model-level keys after the prefixes) in the names of ``model``, and the name
    of the layout it was found in ("" for this engine's own)."""
    state = dict(state)
    trunk = getattr(model, "trunk", None)
    name = trunk_name_of(model)
    if trunk is None or name is None:
        return state, ""
    if name == "vision_transformer" and any(
            k in state for k in (f"trunk.{v}" for v in VISSL_VIT_NAMES)):
        trunk_keys = {k[len("trunk."):]: v for k, v in state.items() if k.startswith("trunk.")}
        other = {k: v for k, v in state.items() if not k.startswith("trunk.")}
        return {**other, **{f"trunk.{k}": v for k, v in
                            vit_trunk_from_vissl(trunk_keys).items()}}, "VISSL ViT"
    if any(k.startswith(("trunk.", "heads.")) for k in state):
        return state, ""
    trunk_state = trunk.state_dict()
    best, best_share, best_state = "", 0.0, state
    for layout, read in readers(name, trunk_state).items():
        mapped = read(state)
        share = matches(mapped, [k for k in trunk_state if not k.endswith(DERIVED)])
        if share > best_share:
            best, best_share, best_state = layout, share, mapped
    if best_share < MIN_SHARE:
        return state, ""
    placed = {k: v for k, v in best_state.items() if k in trunk_state}
    placed_ids, mapped_ids = {id(v) for v in placed.values()}, {id(v) for v in best_state.values()}
    adapted = {f"trunk.{k}": v for k, v in placed.items()}
    # what the layout did not place is reported under the file's own names (a joined tensor's
    # parts, such as XCiT's q, k and v, are placed through it)
    adapted.update({k: v for k, v in state.items()
                    if id(v) in mapped_ids and id(v) not in placed_ids})
    for key, value in trunk_state.items():  # buffers the file's library recomputes itself
        if key.endswith(DERIVED) and f"trunk.{key}" not in adapted:
            adapted[f"trunk.{key}"] = value
    return adapted, best
