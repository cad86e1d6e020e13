"""The timm and torchvision networks that compute what a trunk of this engine computes, and the
renaming of the trunk's parameters into theirs and back.

A ``Counterpart`` names a model of another library (``library``, ``model_name`` and the keyword
arguments that make it match the trunk's settings), says which of its calls gives which trunk
output (``features``) and converts state dicts both ways.  Conversions only rename, split or
join tensors (XCiT's class-attention ``qkv`` is timm's ``q``, ``k``, ``v``); buffers a library
recomputes itself (Swin's and BEiT's ``relative_position_index``) are left out on the way there
and taken from the trunk on the way back (``DERIVED``).

Which trunks have one (``TABLE``), and why the others have none, is written in
docs/evaluation.md ("Use the model elsewhere").  A trunk whose settings leave the counterpart
(a convolutional ViT stem, a ResNet of another width ...) is refused with one line naming the
setting (``NoCounterpartError``).
"""
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Tuple

import torch

from ssl_engine.checkpoint import counterpart_maps as maps
from ssl_engine.checkpoint.counterpart_maps import NoCounterpartError

StateDict = Dict[str, torch.Tensor]
TARGETS = ("timm", "torchvision")
DERIVED = ("relative_position_index",)  # buffers every library computes from the sizes


@dataclass
class Counterpart:
    """A network of ``library`` built as ``build()`` that loads ``to_target(trunk state)``.

    ``features``: the call on that network and the trunk output it equals;
    ``strict``: whether ``load_state_dict`` takes the converted state strictly (False where the
    network has parameters the trunk lacks, e.g. timm BEiT's ``fc_norm``, listed in ``extra``).
    """

    trunk: str
    library: str
    model_name: str
    kwargs: Dict[str, Any]
    features: str
    to_target: Callable[[Mapping[str, torch.Tensor]], StateDict]
    from_target: Callable[[Mapping[str, torch.Tensor]], StateDict]
    strict: bool = True
    extra: List[str] = field(default_factory=list)

    def build(self) -> torch.nn.Module:
        """The network with random weights (never a download)."""
        if self.library == "timm":
            import timm

            return timm.create_model(self.model_name, pretrained=False, **self.kwargs)
        return maps.build_torchvision(self.model_name, self.kwargs)

    def call(self) -> str:
        """The line that builds it, for the description file and the docs."""
        if self.library == "timm":
            args = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
            return f"timm.create_model({self.model_name!r}, pretrained=False{args})"
        return maps.torchvision_call(self.model_name, self.kwargs)


# ------------------------------------------------------------------ one function per trunk
def _resnet(cfg, library: str) -> Counterpart:
    r = cfg.TRUNK.RESNETS
    fixed = {"WIDTH_MULTIPLIER": 1, "NORM": "BatchNorm", "SMALL_IMAGE_STEM": False,
             "SMALL_IMAGE_STEM_STRIDE": 1, "LAYER4_STRIDE": 2, "STANDARDIZE_CONVOLUTIONS": False}
    for key, value in fixed.items():
        if key in r and r[key] != value:
            raise NoCounterpartError(f"config.MODEL.TRUNK.RESNETS.{key}={r[key]!r} has no "
                                     f"{library} counterpart (it needs {value!r})")
    depth, groups, width = int(r.DEPTH), int(r.GROUPS), int(r.WIDTH_PER_GROUP)
    if depth not in (18, 34, 50, 101, 152):
        raise NoCounterpartError(f"config.MODEL.TRUNK.RESNETS.DEPTH={depth} has no {library} "
                                 "counterpart (18, 34, 50, 101, 152)")
    name = f"resnext{depth}_{groups}x{width}d" if groups > 1 else f"resnet{depth}"
    known = maps.known_names(library)
    kwargs: Dict[str, Any] = {}
    if name not in known:  # any groups / width: the plain depth with its arguments
        name = f"resnet{depth}"
        kwargs = ({"cardinality": groups, "base_width": width} if library == "timm"
                  else {"groups": groups, "width_per_group": width})
    if library == "timm":
        kwargs["num_classes"] = 0
    same = maps.identity
    return Counterpart("resnet", library, name, kwargs,
                       "model(x) equals the trunk's res5avg (torchvision: after "
                       "model.fc = torch.nn.Identity())", same, same,
                       strict=library == "timm", extra=[] if library == "timm" else ["fc.*"])


def _vit(cfg, library: str, trunk: torch.nn.Module) -> Counterpart:
    v = cfg.TRUNK.VISION_TRANSFORMERS
    if (v.get("HYBRID") or {}).get("CONV_STEM"):
        raise NoCounterpartError("config.MODEL.TRUNK.VISION_TRANSFORMERS.HYBRID.CONV_STEM has "
                                 "no timm counterpart (timm's ViT patchifies)")
    vit = trunk.vit
    dim, depth = vit.embed_dim, len(vit.blocks)
    kwargs = dict(img_size=int(v.IMAGE_SIZE), patch_size=int(vit.patch_embed.patch_size[0]),
                  embed_dim=dim, depth=depth, num_heads=vit.blocks[0].attn.num_heads,
                  mlp_ratio=vit.blocks[0].mlp.fc1.out_features / dim,
                  qkv_bias=vit.blocks[0].attn.qkv.bias is not None, num_classes=0)
    name = maps.vit_name(kwargs)
    if not vit.has_class_token:
        kwargs.update(class_token=False, global_pool="avg", fc_norm=False)
    drop_mask = maps.drop_keys("mask_token")
    features = ("model(x) equals the trunk's lastCLS" if vit.has_class_token else
                "model(x) and model.forward_features(x).mean(1) equal the trunk's lastPOOL")
    return Counterpart("vision_transformer", library, name, kwargs,
                       features + "; model.get_intermediate_layers(x, n) gives the blocks' "
                       "outputs",
                       lambda s: maps.strip_prefix(drop_mask(s), "vit."),
                       lambda s: maps.add_prefix(s, "vit."))


def _swin(cfg, library: str) -> Counterpart:
    s = cfg.TRUNK.SWIN_TRANSFORMER
    if s.get("name"):
        raise NoCounterpartError("config.MODEL.TRUNK.SWIN_TRANSFORMER.name: give the sizes "
                                 "(EMBED_DIM, DEPTHS, NUM_HEADS ...) to export to timm")
    kwargs = dict(img_size=int(s.IMAGE_SIZE), patch_size=int(s.PATCH_SIZE),
                  embed_dim=int(s.EMBED_DIM), depths=tuple(int(d) for d in s.DEPTHS),
                  num_heads=tuple(int(h) for h in s.NUM_HEADS),
                  window_size=int(s.WINDOW_SIZE), mlp_ratio=float(s.MLP_RATIO),
                  qkv_bias=bool(s.QKV_BIAS), num_classes=0)
    return Counterpart("swin_transformer", library, maps.swin_name(kwargs), kwargs,
                       "model(x) equals the trunk's lastCLS", maps.swin_to_timm,
                       maps.swin_from_timm)


def _convnext(cfg, library: str) -> Counterpart:
    c = cfg.TRUNK.CONVNEXT
    kwargs = dict(depths=tuple(int(d) for d in c.DEPTH), dims=tuple(int(d) for d in c.DIMS),
                  num_classes=0)
    names = {((3, 3, 9, 3), (96, 192, 384, 768)): "convnext_tiny",
             ((3, 3, 27, 3), (96, 192, 384, 768)): "convnext_small",
             ((3, 3, 27, 3), (128, 256, 512, 1024)): "convnext_base"}
    name = names.get((kwargs["depths"], kwargs["dims"]), "convnext_tiny")
    return Counterpart("convnext", library, name, kwargs, "model(x) equals the trunk's lastCLS",
                       maps.convnext_to_timm, maps.convnext_from_timm)


def _xcit(cfg, library: str) -> Counterpart:
    x = cfg.TRUNK.XCIT
    if x.get("name"):
        raise NoCounterpartError("config.MODEL.TRUNK.XCIT.name: give the sizes to export")
    if x.get("QK_SCALE") not in (None, False):
        raise NoCounterpartError("config.MODEL.TRUNK.XCIT.QK_SCALE has no timm counterpart")
    kwargs = dict(img_size=int(x.IMAGE_SIZE), patch_size=int(x.PATCH_SIZE),
                  embed_dim=int(x.HIDDEN_DIM), depth=int(x.NUM_LAYERS),
                  num_heads=int(x.NUM_HEADS), mlp_ratio=float(x.MLP_RATIO),
                  qkv_bias=bool(x.QKV_BIAS), eta=float(x.ETA),
                  tokens_norm=bool(x.TOKENS_NORM), num_classes=0)
    return Counterpart("xcit", library, "xcit_small_12_p16_224", kwargs,
                       "model(x) equals the trunk's lastCLS (to float32 rounding, about 1e-6)",
                       maps.xcit_to_timm, maps.xcit_from_timm)


def _beit(cfg, library: str) -> Counterpart:
    b = cfg.TRUNK.BEIT
    if b.get("QK_SCALE") not in (None, False):
        raise NoCounterpartError("config.MODEL.TRUNK.BEIT.QK_SCALE has no timm counterpart")
    mean = bool(b.USE_MEAN_POOLING)
    init = b.get("INIT_VALUES")
    kwargs = dict(img_size=int(b.IMAGE_SIZE), patch_size=int(b.PATCH_SIZE),
                  embed_dim=int(b.HIDDEN_DIM), depth=int(b.NUM_LAYERS),
                  num_heads=int(b.NUM_HEADS), mlp_ratio=float(b.MLP_RATIO),
                  qkv_bias=bool(b.QKV_BIAS), use_abs_pos_emb=bool(b.USE_ABS_POS_EMB),
                  use_rel_pos_bias=bool(b.USE_REL_POS_BIAS),
                  use_shared_rel_pos_bias=bool(b.USE_SHARED_REL_POS_BIAS),
                  init_values=float(init) if init not in (None, False) else None,
                  global_pool="avg" if mean else "token", num_classes=0)
    features = ("model.forward_features(x)[:, 0] equals the trunk's lastCLS and "
                "[:, 1:].mean(1) its lastPOOL (timm's fc_norm, absent from the trunk, is left "
                "at its initial values)" if mean else "model(x) equals the trunk's lastCLS")
    return Counterpart("beit", library, "beit_base_patch16_224", kwargs, features,
                       maps.drop_keys(*DERIVED), maps.identity, strict=not mean,
                       extra=["fc_norm.*"] if mean else [])


def _regnet(cfg, library: str) -> Counterpart:
    name, kwargs = maps.regnet_arguments(cfg.TRUNK.REGNET)
    return Counterpart("regnet", library, name, kwargs,
                       "model(x) equals the trunk's flatten (after model.fc = "
                       "torch.nn.Identity())", maps.regnet_to_torchvision,
                       maps.regnet_from_torchvision, strict=False, extra=["fc.*"])


def _efficientnet(cfg, library: str, trunk: torch.nn.Module) -> Counterpart:
    e = cfg.TRUNK.EFFICIENT_NETS
    version = str(e.model_version).lower()
    fixed = {"width_divisor": 8, "use_se": True}
    for key, value in fixed.items():
        if key in e and e[key] != value:
            raise NoCounterpartError(f"config.MODEL.TRUNK.EFFICIENT_NETS.{key}={e[key]!r} has "
                                     f"no torchvision counterpart (it needs {value!r})")
    name = f"efficientnet_{version}"
    to_tv, from_tv = maps.positional(trunk.state_dict(), name)
    # torchvision's EfficientNet-B* take batch norms of eps 1e-5 unless given the trunk's
    kwargs = {"norm_eps": float(e.bn_epsilon), "norm_momentum": float(e.bn_momentum)}
    return Counterpart("efficientnet", library, name, kwargs, "model(x) equals the trunk's "
                       "dropout/flatten (after model.classifier = torch.nn.Identity())",
                       to_tv, from_tv, strict=False, extra=["classifier.*"])


def _mobilenet_tv(cfg, library: str) -> Counterpart:
    timm_bn = bool(cfg.TRUNK.MOBILE_NET.get("TIMM_BN", False))
    kwargs = {"norm_eps": 1e-5, "norm_momentum": 0.1} if timm_bn else {}
    return Counterpart("mobilenetv3_tv", library, "mobilenet_v3_large", kwargs,
                       "model(x) equals the trunk's trunk_pool (after model.classifier = "
                       "torch.nn.Identity())", lambda s: maps.strip_prefix(s, "model."),
                       lambda s: maps.add_prefix(s, "model."), strict=False,
                       extra=["classifier.*"])


def _mobilenet_timm(cfg, library: str) -> Counterpart:
    m = cfg.TRUNK.MOBILE_NET
    trunk_only = bool(m.get("TRUNK_ONLY", False))
    return Counterpart("mobilenetv3_timm", library, str(m.NAME), {"num_classes": 0},
                       "model.forward_features(x) equals the trunk's trunk" if trunk_only
                       else "model(x) equals the trunk's flatten",
                       lambda s: maps.strip_prefix(s, "model."),
                       lambda s: maps.add_prefix(s, "model."), strict=not trunk_only,
                       extra=["conv_head.*"] if trunk_only else [])


# trunk name -> {library: (function, whether it needs the built trunk)}
TABLE: Dict[str, Dict[str, Tuple[Callable, bool]]] = {
    "resnet": {"timm": (_resnet, False), "torchvision": (_resnet, False)},
    "vision_transformer": {"timm": (_vit, True)},
    "swin_transformer": {"timm": (_swin, False)},
    "convnext": {"timm": (_convnext, False)},
    "xcit": {"timm": (_xcit, False)},
    "beit": {"timm": (_beit, False)},
    "regnet": {"torchvision": (_regnet, False)},
    "efficientnet": {"torchvision": (_efficientnet, True)},
    "mobilenetv3_tv": {"torchvision": (_mobilenet_tv, False)},
    "mobilenetv3_timm": {"timm": (_mobilenet_timm, False)},
}


def targets_of(trunk_name: str) -> List[str]:
    """The libraries ``trunk_name`` has a counterpart in (may be empty)."""
    return list(TABLE.get(trunk_name, {}))


def counterpart(model_cfg, library: str, trunk: torch.nn.Module = None) -> Counterpart:
    """The ``library`` counterpart of the trunk MODEL.TRUNK.NAME with ``model_cfg``'s settings;
    ``trunk``: that trunk, built (some conversions read its modules). NoCounterpartError, one
    line naming the libraries it has, for any other."""
    name = model_cfg.TRUNK.NAME
    known = TABLE.get(name, {})
    if library not in known:
        has = ", ".join(known) or "none (use --to safetensors or --to vissl)"
        raise NoCounterpartError(f"the {name} trunk has no {library} counterpart; its "
                                 f"targets: {has}")
    function, needs_trunk = known[library]
    if needs_trunk:
        if trunk is None:
            raise ValueError(f"the {name} counterpart needs the built trunk")
        return function(model_cfg, library, trunk)
    return function(model_cfg, library)


def matches(state_keys, reference_keys) -> float:
    """The share of ``reference_keys`` found in ``state_keys`` (0 for no reference)."""
    reference = set(reference_keys)
    return len(reference & set(state_keys)) / len(reference) if reference else 0.0
