"""Export a trained model for use outside the engine (``tools/export_model.py``).

``export_model`` writes the trunk (and, asked, the heads) of a run or checkpoint in a target's
own key layout, plus a JSON description beside it (same name, ``.json``):

- ``timm`` / ``torchvision``: the state dict of the trunk's counterpart network
  (``counterparts``), loadable into ``description["build"]`` with ``load_state_dict``;
- ``safetensors``: this engine's own keys (``trunk.<k>``, ``heads.<k>``), loadable back as
  MODEL.WEIGHTS_INIT.PARAMS_FILE;
- ``vissl``: a consolidated VISSL checkpoint (``formats.vissl_checkpoint``; VISSL's ViT names
  for the ViT).

The weights go into a safetensors file unless ``out`` ends in ``.pth``, ``.pt`` or ``.torch``
(a torch file); ``vissl`` is always a torch file, as VISSL reads no other.  Heads, for the
timm and torchvision targets, go to ``<out stem>.heads.<suffix>`` in this engine's names.
"""
import json
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from ssl_engine.checkpoint.counterparts import TARGETS, counterpart
from ssl_engine.checkpoint.formats import (is_vissl_checkpoint, is_vissl_model_state,
                                           is_vissl_vit_trunk, model_state_from_vissl,
                                           model_state_of, trunk_vissl_layout, vissl_checkpoint,
                                           vissl_key_prefix, vit_trunk_from_vissl,
                                           vit_trunk_to_vissl)
from ssl_engine.checkpoint.io import latest_checkpoint_path, load_checkpoint
from ssl_engine.models import build_model

EXPORT_TARGETS = TARGETS + ("safetensors", "vissl")
TORCH_SUFFIXES = (".pth", ".pt", ".torch")
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


class ExportError(ValueError):
    """The source or the target cannot be exported (one line, naming what)."""


def read_source(source: Path) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], bool]:
    """(the model state ``{trunk, heads}`` as saved, the run's config or None, whether the
    file is VISSL's) of a run folder (its latest checkpoint) or a checkpoint file."""
    source = Path(source)
    if source.is_dir():
        path = latest_checkpoint_path(source)
        if path is None:
            raise ExportError(f"{source} holds no checkpoint (no checkpoint.torch, no "
                              "*.torch file)")
    else:
        path = source
    checkpoint = load_checkpoint(path)
    try:
        state = model_state_of(checkpoint, str(path))
    except ValueError as err:
        raise ExportError(str(err)) from None
    return ({"trunk": dict(state["trunk"]), "heads": dict(state["heads"])},
            checkpoint.get("config"), is_vissl_checkpoint(checkpoint))


def from_vissl_if_needed(checkpoint_state: Dict[str, Any], trunk_name: str,
                         is_vissl: bool) -> Dict[str, Any]:
    """A VISSL model state read in this engine's names (the ViT's too); a weights-only file of
    this engine (no config either, but this engine's names) is returned as it is."""
    prefix = vissl_key_prefix(trunk_name)
    if not is_vissl or (prefix and not is_vissl_model_state(checkpoint_state, prefix)):
        return checkpoint_state
    state = model_state_from_vissl(checkpoint_state, prefix)
    if trunk_name == "vision_transformer" and is_vissl_vit_trunk(state["trunk"]):
        state["trunk"] = vit_trunk_from_vissl(state["trunk"])
    return state


def _normalisation(cfg: Optional[Mapping[str, Any]]):
    """(mean, std) of the run's first Normalize transform, ImageNet's when there is none."""
    transforms = (((cfg or {}).get("DATA") or {}).get("TRAIN") or {}).get("TRANSFORMS") or []
    for transform in transforms:
        if isinstance(transform, Mapping) and transform.get("name") == "Normalize":
            return list(transform.get("mean", IMAGENET_MEAN)), list(transform.get("std",
                                                                              IMAGENET_STD))
    return IMAGENET_MEAN, IMAGENET_STD


def _input_size(model_cfg) -> int:
    """The trunk's IMAGE_SIZE where its section has one (the transformers), else 224."""
    section = model_cfg.TRUNK.get(_section_of(model_cfg.TRUNK.NAME)) or {}
    return int(section.get("IMAGE_SIZE") or 224)


def _section_of(trunk_name: str) -> str:
    return {"vision_transformer": "VISION_TRANSFORMERS", "swin_transformer": "SWIN_TRANSFORMER",
            "xcit": "XCIT", "beit": "BEIT"}.get(trunk_name, "")


def save_tensors(state: Mapping[str, torch.Tensor], path: Path, torch_file: bool) -> None:
    """``state`` as a safetensors file (own, contiguous copies: the format stores no shared
    storage) or a torch file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if torch_file:
        torch.save(dict(state), path)
        return
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(path))


def export_model(model_state: Mapping[str, Any], model_cfg, target: str, out: Path,
                 heads: bool = False, run_cfg: Optional[Mapping[str, Any]] = None,
                 source: str = "") -> Dict[str, Any]:
    """Write ``model_state`` (this engine's names) for ``target`` at ``out`` and its
    description at ``out`` with ``.json``; return the description. ``model_cfg``: the MODEL
    section that built it; ``run_cfg``: the whole config (normalisation), if known."""
    if target not in EXPORT_TARGETS:
        raise ExportError(f"unknown target {target!r}: one of {', '.join(EXPORT_TARGETS)}")
    out = Path(out)
    torch_file = target == "vissl" or out.suffix in TORCH_SUFFIXES
    with torch.device("meta"):
        trunk = build_model(model_cfg).trunk
    trunk_state = dict(model_state["trunk"])
    mean, std = _normalisation(run_cfg)
    description: Dict[str, Any] = {
        "trunk": model_cfg.TRUNK.NAME, "target": target, "source": source,
        "weights": out.name, "input_size": [3, _input_size(model_cfg), _input_size(model_cfg)],
        "mean": mean, "std": std,
        "layers": dict(getattr(trunk, "stage_dims", {})),
        "default_layer": getattr(trunk, "default_out_feat_key", None), "heads": None}
    head_state = dict(model_state["heads"]) if heads else {}
    if target in TARGETS:
        match = counterpart(model_cfg, target, trunk)
        converted = match.to_target(trunk_state)
        save_tensors(converted, out, torch_file)
        kept = match.from_target(converted)
        description.update(library=match.library, model_name=match.model_name,
                           model_kwargs=match.kwargs, build=match.call(),
                           load_strict=match.strict, not_in_file=match.extra,
                           features=match.features,
                           # the trunk's tensors the library has not (iBOT's mask token) or
                           # computes itself (relative position indices)
                           left_out=[k for k in trunk_state if k not in kept])
        if head_state:
            head_path = out.with_name(f"{out.stem}.heads{out.suffix or '.safetensors'}")
            save_tensors(head_state, head_path, torch_file)
            description["heads"] = head_path.name
    elif target == "safetensors":
        state = {f"trunk.{k}": v for k, v in trunk_state.items()}
        state.update({f"heads.{k}": v for k, v in head_state.items()})
        save_tensors(state, out, torch_file)
        description.update(library="ssl_engine", build="MODEL.WEIGHTS_INIT.PARAMS_FILE="
                           f"{out.name} (STATE_DICT_KEY_NAME='')")
        description["heads"] = out.name if head_state else None
    else:  # vissl
        prefix = trunk_vissl_layout(model_cfg.TRUNK.NAME)
        if prefix is None:  # the ViT: VISSL's own names
            state = {"trunk": vit_trunk_to_vissl(trunk_state), "heads": head_state}
            prefix = ""
        else:
            state = {"trunk": trunk_state, "heads": head_state}
        out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(vissl_checkpoint(state, prefix), out)
        description.update(library="vissl", build="VISSL's MODEL.WEIGHTS_INIT.PARAMS_FILE "
                           "with STATE_DICT_KEY_NAME=classy_state_dict")
        description["heads"] = out.name if head_state else None
    out.with_suffix(".json").write_text(json.dumps(description, indent=2, default=str) + "\n")
    return description
