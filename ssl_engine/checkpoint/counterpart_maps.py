"""Renamings between the trunks' parameter names and those of their timm and torchvision
counterparts (``counterparts``), one pair of functions per layout; each is a pure function of a
state dict (tensors are shared, or split/joined along their first axis)."""
import re
from typing import Any, Callable, Dict, Mapping, Tuple

import torch

StateDict = Dict[str, torch.Tensor]


class NoCounterpartError(ValueError):
    """The trunk (or its settings) has no network of the asked library."""


def identity(state: Mapping[str, torch.Tensor]) -> StateDict:
    return dict(state)


def strip_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> StateDict:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


def add_prefix(state: Mapping[str, torch.Tensor], prefix: str) -> StateDict:
    return {prefix + k: v for k, v in state.items()}


def drop_keys(*endings: str) -> Callable[[Mapping[str, torch.Tensor]], StateDict]:
    """A conversion leaving out the keys whose last part is one of ``endings``."""
    def drop(state):
        return {k: v for k, v in state.items() if k.rsplit(".", 1)[-1] not in endings}
    return drop


def known_names(library: str):
    if library == "timm":
        import timm

        return set(timm.list_models())
    import torchvision

    return set(torchvision.models.list_models())


# ------------------------------------------------------------------ torchvision builders
def build_torchvision(name: str, kwargs: Mapping[str, Any]) -> torch.nn.Module:
    """torchvision's ``name`` with random weights; RegNets given by parameters are built from
    torchvision's ``BlockParams``; MobileNet's batch-norm settings by ``norm_eps``."""
    import torchvision
    from functools import partial

    kwargs = dict(kwargs)
    if name == "regnet_from_params":
        from torchvision.models.regnet import BlockParams, RegNet

        return RegNet(BlockParams.from_init_params(**kwargs))
    if "norm_eps" in kwargs:
        kwargs["norm_layer"] = partial(torch.nn.BatchNorm2d, eps=kwargs.pop("norm_eps"),
                                       momentum=kwargs.pop("norm_momentum"))
    return getattr(torchvision.models, name)(weights=None, **kwargs)


def torchvision_call(name: str, kwargs: Mapping[str, Any]) -> str:
    if name == "regnet_from_params":
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return ("torchvision.models.regnet.RegNet(torchvision.models.regnet.BlockParams."
                f"from_init_params({args}))")
    if "norm_eps" in kwargs:
        return (f"torchvision.models.{name}(weights=None, norm_layer=functools.partial("
                f"torch.nn.BatchNorm2d, eps={kwargs['norm_eps']}, "
                f"momentum={kwargs['norm_momentum']}))")
    args = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    return f"torchvision.models.{name}(weights=None{args})"


# ------------------------------------------------------------------ names of timm's presets
def vit_name(kwargs: Mapping[str, Any]) -> str:
    """timm's ViT name of these sizes (the keyword arguments set them all anyway)."""
    sizes = {192: "tiny", 384: "small", 768: "base", 1024: "large", 1280: "huge"}
    size = sizes.get(kwargs["embed_dim"], "base")
    name = f"vit_{size}_patch{kwargs['patch_size']}_{kwargs['img_size']}"
    return name if name in known_names("timm") else "vit_base_patch16_224"


def swin_name(kwargs: Mapping[str, Any]) -> str:
    sizes = {(96, (2, 2, 6, 2)): "tiny", (96, (2, 2, 18, 2)): "small",
             (128, (2, 2, 18, 2)): "base", (192, (2, 2, 18, 2)): "large"}
    size = sizes.get((kwargs["embed_dim"], kwargs["depths"]), "tiny")
    return f"swin_{size}_patch4_window7_224"


# ------------------------------------------------------------------ Swin
SWIN_DOWNSAMPLE = re.compile(r"^layers\.(\d+)\.downsample\.")


def swin_to_timm(state: Mapping[str, torch.Tensor]) -> StateDict:
    """The trunk merges patches at the end of stage i, timm at the start of stage i + 1."""
    out = {}
    for key, value in state.items():
        if key.endswith("relative_position_index"):
            continue
        key = SWIN_DOWNSAMPLE.sub(lambda m: f"layers.{int(m.group(1)) + 1}.downsample.", key)
        out[key] = value
    return out


def swin_from_timm(state: Mapping[str, torch.Tensor]) -> StateDict:
    return {SWIN_DOWNSAMPLE.sub(lambda m: f"layers.{int(m.group(1)) - 1}.downsample.", k): v
            for k, v in state.items()}


# ------------------------------------------------------------------ ConvNeXt
CONVNEXT_BLOCK = {"dwconv": "conv_dw", "norm": "norm", "pwconv1": "mlp.fc1",
                  "pwconv2": "mlp.fc2", "gamma": "gamma"}


def convnext_to_timm(state: Mapping[str, torch.Tensor]) -> StateDict:
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "downsample_layers":
            stage, rest = int(parts[1]), ".".join(parts[2:])
            key = f"stem.{rest}" if stage == 0 else f"stages.{stage}.downsample.{rest}"
        elif parts[0] == "stages":
            layer = CONVNEXT_BLOCK[parts[3]] if len(parts) > 4 else parts[3]
            rest = ".".join([layer] + parts[4:])
            key = f"stages.{parts[1]}.blocks.{parts[2]}.{rest}"
        elif parts[0] == "norm":
            key = "head." + key
        out[key] = value
    return out


def convnext_from_timm(state: Mapping[str, torch.Tensor]) -> StateDict:
    back = {v: k for k, v in CONVNEXT_BLOCK.items()}
    out = {}
    for key, value in state.items():
        parts = key.split(".")
        if parts[0] == "stem":
            key = "downsample_layers.0." + ".".join(parts[1:])
        elif parts[0] == "stages" and parts[2] == "downsample":
            key = f"downsample_layers.{parts[1]}." + ".".join(parts[3:])
        elif parts[0] == "stages" and parts[2] == "blocks":
            rest = ".".join(parts[4:])
            layer = next((b for t, b in back.items() if rest.startswith(t + ".") or rest == t),
                         None)
            if layer is not None:
                rest = layer + rest[len(CONVNEXT_BLOCK[layer]):]
            key = f"stages.{parts[1]}.{parts[3]}.{rest}"
        elif key.startswith("head.norm."):
            key = key[len("head."):]
        out[key] = value
    return out


# ------------------------------------------------------------------ XCiT
CLASS_ATTENTION_QKV = re.compile(r"^(cls_attn_blocks\.\d+\.attn\.)qkv\.(weight|bias)$")


def xcit_to_timm(state: Mapping[str, torch.Tensor]) -> StateDict:
    """``pos_embeder`` is timm's ``pos_embed``; a class-attention ``qkv`` is timm's separate
    ``q``, ``k``, ``v`` (its rows in that order)."""
    out = {}
    for key, value in state.items():
        match = CLASS_ATTENTION_QKV.match(key)
        if match:
            for name, part in zip("qkv", value.chunk(3, dim=0)):
                out[f"{match.group(1)}{name}.{match.group(2)}"] = part
            continue
        out[key.replace("pos_embeder.", "pos_embed.", 1) if key.startswith("pos_embeder.")
            else key] = value
    return out


def xcit_from_timm(state: Mapping[str, torch.Tensor]) -> StateDict:
    out = {}
    for key, value in state.items():
        match = re.match(r"^(cls_attn_blocks\.\d+\.attn\.)([qkv])\.(weight|bias)$", key)
        if match:
            if match.group(2) == "q":
                parts = [state.get(f"{match.group(1)}{n}.{match.group(3)}") for n in "qkv"]
                if all(p is not None for p in parts):
                    out[f"{match.group(1)}qkv.{match.group(3)}"] = torch.cat(parts, dim=0)
            continue
        out[key.replace("pos_embed.", "pos_embeder.", 1) if key.startswith("pos_embed.")
            else key] = value
    return out


# ------------------------------------------------------------------ RegNet (torchvision)
REGNET_INNER = {"proj.weight": "proj.0.weight", "bn.": "proj.1.", "f.se.excitation.0.":
                "f.se.fc1.", "f.se.excitation.2.": "f.se.fc2.", "f.c.weight": "f.c.0.weight",
                "f.final_bn.": "f.c.1."}
REGNET_BLOCK = re.compile(r"^_feature_blocks\.res(\d+)\.(block\d+-\d+)\.(.*)$")
TV_REGNET_BLOCK = re.compile(r"^trunk_output\.block(\d+)\.(block\d+-\d+)\.(.*)$")


def regnet_arguments(r) -> Tuple[str, Dict[str, Any]]:
    """torchvision's name (or ``regnet_from_params``) and arguments of MODEL.TRUNK.REGNET."""
    name = r.get("name")
    if name == "anynet" or r.get("stem_type", "simple_stem_in") != "simple_stem_in" or r.get(
            "block_type", "res_bottleneck_block") != "res_bottleneck_block" or r.get(
            "activation", "relu") != "relu" or float(r.get("bn_epsilon", 1e-5)) != 1e-5:
        raise NoCounterpartError("config.MODEL.TRUNK.REGNET: only RegNets of the simple stem, "
                                 "bottleneck blocks, ReLU and batch-norm eps 1e-5 have a "
                                 "torchvision counterpart")
    if name:
        if name not in known_names("torchvision"):
            raise NoCounterpartError(f"config.MODEL.TRUNK.REGNET.name={name!r} is no "
                                     "torchvision model")
        return name, {}
    kwargs = dict(depth=int(r.depth), w_0=int(r.w_0), w_a=float(r.w_a), w_m=float(r.w_m),
                  group_width=int(r.group_width),
                  bottleneck_multiplier=float(r.bottleneck_multiplier),
                  se_ratio=float(r.se_ratio) if r.get("use_se", True) else None)
    return "regnet_from_params", kwargs


def _rename_inner(rest: str, table: Mapping[str, str]) -> str:
    for old, new in table.items():
        if rest.startswith(old):
            return new + rest[len(old):]
    return rest


def regnet_to_torchvision(state: Mapping[str, torch.Tensor]) -> StateDict:
    out = {}
    for key, value in state.items():
        match = REGNET_BLOCK.match(key)
        if match:
            stage, block, rest = match.groups()
            key = (f"trunk_output.block{int(stage) - 1}.{block}."
                   f"{_rename_inner(rest, REGNET_INNER)}")
        elif key.startswith("_feature_blocks.conv1.stem."):
            key = "stem." + key[len("_feature_blocks.conv1.stem."):]
        out[key] = value
    return out


def regnet_from_torchvision(state: Mapping[str, torch.Tensor]) -> StateDict:
    back = {v: k for k, v in REGNET_INNER.items()}
    out = {}
    for key, value in state.items():
        match = TV_REGNET_BLOCK.match(key)
        if match:
            stage, block, rest = match.groups()
            key = f"_feature_blocks.res{int(stage) + 1}.{block}.{_rename_inner(rest, back)}"
        elif key.startswith("stem."):
            key = "_feature_blocks.conv1.stem." + key[len("stem."):]
        out[key] = value
    return out


# ------------------------------------------------------------------ same order, other names
def positional(trunk_state: Mapping[str, torch.Tensor], torchvision_name: str):
    """Conversions for two networks holding the same tensors in the same order under other
    names (classy_vision's EfficientNet, which the trunk holds, and torchvision's): the k-th
    key of one is the k-th of the other, every shape checked; the target's keys no trunk
    tensor fills (its classifier) are left out."""
    import torchvision

    with torch.device("meta"):
        reference = getattr(torchvision.models, torchvision_name)(weights=None).state_dict()
    ours = list(trunk_state)
    theirs = [k for k in reference if not k.startswith("classifier.")]
    shapes_ours = [tuple(trunk_state[k].shape) for k in ours]
    shapes_theirs = [tuple(reference[k].shape) for k in theirs]
    if shapes_ours != shapes_theirs:
        raise NoCounterpartError(f"the trunk's tensors are not those of torchvision's "
                                 f"{torchvision_name} ({len(ours)} vs {len(theirs)} tensors)")
    forward, backward = dict(zip(ours, theirs)), dict(zip(theirs, ours))

    def to_target(state):
        return {forward.get(k, k): v for k, v in state.items()}

    def from_target(state):
        return {backward.get(k, k): v for k, v in state.items()}
    return to_target, from_target
