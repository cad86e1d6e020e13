"""Model weights in other layouts: VISSL's checkpoints and torchvision's ResNet state dicts.

This engine's model state is ``{"trunk": {...}, "heads": {...}}``. VISSL keeps the same
``classy_state_dict -> base_model -> model -> {trunk, heads}`` nesting; how its trunk keys are
spelt depends on the trunk, which each trunk class says with ``VISSL_KEY_PREFIX``:

- the ResNet trunk is named as in torchvision here (``conv1.weight``, ``layer1.0.conv1.weight``;
  no ``fc``), while VISSL holds the same layers in ``_feature_blocks``
  (``_feature_blocks.conv1.weight``): its prefix is ``_feature_blocks.``;
- the AlexNet trunks hold their blocks as ``0..8`` here and in VISSL's ``_feature_blocks``:
  their prefix is ``_feature_blocks.`` too, but DeepCluster's fixed Sobel filter (``sobel.*``)
  sits beside ``_feature_blocks`` in both (``BESIDE_FEATURE_BLOCKS``);
- the other trunks (RegNet, EfficientNet, ResNet-SK, BEiT, ConvNeXt ...) are spelt as VISSL
  spells them (some hold their own ``_feature_blocks``): their prefix is empty.

A trunk that VISSL wrapped for feature evaluation has its keys under ``base_model.`` besides,
and VISSL's ``eval_mlp`` head keeps its linear layers in ``clf.clf.`` where ours has
``mlp.clf.``. Every other head key (mlp, swav_head, dino_head) is spelt alike. Whether a file
is VISSL's is not read from its key names (the two agree for most trunks) but from what this
engine writes into its own checkpoints (``rng_states``, ``config``).

Conversions here are exact (tensors are shared, not changed) and refuse, with one message that
names the missing and unexpected keys, a state that does not fit the layout asked for.
"""
import re
from typing import Any, Dict, Mapping, Optional, Tuple

import torch
import torchvision

from ssl_engine.models.registry import MODEL_TRUNKS
from ssl_engine.models.state_dict import key_differences, named_keys

FEATURE_BLOCKS = "_feature_blocks."
FEATURE_EXTRACTOR = "base_model."
BESIDE_FEATURE_BLOCKS = ("sobel.",)  # VISSL trunk keys outside _feature_blocks, named alike
VISSL_EVAL_MLP, OUR_EVAL_MLP = "clf.clf.", "mlp.clf."
REGNET_FSDP_GROUP = re.compile(r"^(res\d+\.)block\d+-part\d+\.")

StateDict = Dict[str, torch.Tensor]


class CheckpointFormatError(ValueError):
    """A file's keys do not fit the layout it is converted from or to."""


def key_mismatch_message(what: str, missing, unexpected, reshaped=()) -> str:
    """``what``, then the missing, unexpected and reshaped keys ('' when none)."""
    differences = key_differences(missing, unexpected, reshaped)
    return f"{what}: {differences}" if differences else ""


# ------------------------------------------------------------------ key names, one at a time
def trunk_vissl_layout(trunk_name: Optional[str]) -> Optional[str]:
    """The ``VISSL_KEY_PREFIX`` of the trunk class registered as ``trunk_name``: what VISSL puts
    before its key names, or None when VISSL has no layout for it; ResNet's
    (``_feature_blocks.``) when no name is known."""
    if trunk_name is None or trunk_name not in MODEL_TRUNKS.names():
        return FEATURE_BLOCKS
    return getattr(MODEL_TRUNKS.get(trunk_name), "VISSL_KEY_PREFIX", "")


def vissl_key_prefix(trunk_name: Optional[str]) -> str:
    """The prefix to read VISSL's keys of ``trunk_name`` with ("" when it has none)."""
    return trunk_vissl_layout(trunk_name) or ""


def model_key_prefix(model) -> str:
    """``vissl_key_prefix`` of a built model (its ``trunk``'s class)."""
    trunk = getattr(model, "trunk", None)
    if trunk is None:
        return FEATURE_BLOCKS
    return getattr(type(trunk), "VISSL_KEY_PREFIX", FEATURE_BLOCKS) or ""


def is_vissl_trunk_key(key: str, prefix: str = FEATURE_BLOCKS) -> bool:
    """A key under VISSL's ``prefix`` or under ``base_model.`` (VISSL's feature-evaluation
    wrapper of any trunk)."""
    return key.startswith(FEATURE_EXTRACTOR) or bool(prefix) and key.startswith(prefix)


def trunk_key_from_vissl(key: str, prefix: str = FEATURE_BLOCKS) -> str:
    """``[base_model.]_feature_blocks.conv1.weight`` -> ``conv1.weight`` (prefix
    ``_feature_blocks.``); ``base_model.blocks.0.norm1.weight`` -> ``blocks.0.norm1.weight``
    (any prefix); others unchanged."""
    if key.startswith(FEATURE_EXTRACTOR):
        key = key[len(FEATURE_EXTRACTOR):]
    key = key[len(prefix):] if prefix and key.startswith(prefix) else key
    # VISSL's regnet_fsdp groups a stage's blocks in block<s>-part<g> (one FSDP unit each):
    # _feature_blocks.res2.block1-part0.block1-0.<k> is the regnet's _feature_blocks.res2.block1-0.<k>
    if key.startswith(FEATURE_BLOCKS):
        key = FEATURE_BLOCKS + REGNET_FSDP_GROUP.sub(r"\1", key[len(FEATURE_BLOCKS):])
    return key


def trunk_key_to_vissl(key: str, prefix: str = FEATURE_BLOCKS) -> str:
    return key if key.startswith(BESIDE_FEATURE_BLOCKS) else prefix + key


def head_key_from_vissl(key: str) -> str:
    """``0.clf.clf.0.weight`` (VISSL's eval_mlp) -> ``0.mlp.clf.0.weight``; others unchanged."""
    index, _, rest = key.partition(".")
    if rest.startswith(VISSL_EVAL_MLP):
        return f"{index}.{OUR_EVAL_MLP}{rest[len(VISSL_EVAL_MLP):]}"
    return key


def head_key_to_vissl(key: str) -> str:
    index, _, rest = key.partition(".")
    if rest.startswith(OUR_EVAL_MLP):
        return f"{index}.{VISSL_EVAL_MLP}{rest[len(OUR_EVAL_MLP):]}"
    return key


def model_key_from_vissl(key: str, prefix: str = FEATURE_BLOCKS) -> str:
    """A model-level key (``trunk.<k>`` / ``heads.<k>``, e.g. after VISSL's APPEND_PREFIX
    ``trunk._feature_blocks.`` or ``trunk.base_model._feature_blocks.``) in this engine's
    names; keys of neither part are returned unchanged."""
    part, _, rest = key.partition(".")
    if part == "trunk":
        return f"trunk.{trunk_key_from_vissl(rest, prefix)}"
    if part == "heads":
        return f"heads.{head_key_from_vissl(rest)}"
    return key


def model_key_to_vissl(key: str, prefix: str = FEATURE_BLOCKS) -> str:
    part, _, rest = key.partition(".")
    if part == "trunk":
        return f"trunk.{trunk_key_to_vissl(rest, prefix)}"
    if part == "heads":
        return f"heads.{head_key_to_vissl(rest)}"
    return key


# ------------------------------------------------------------------ VISSL's ViT
# VISSL's vision_transformer trunk holds timm's ViT layers at its top level, two of them under
# other names; the trunk here holds timm's ViT as ``vit``. (VISSL's LayerNorms have torch's
# default eps 1e-5, timm's 1e-6: the weights are the same, the features differ by that.)
VISSL_VIT_NAMES = {"class_token": "cls_token", "pos_embedding": "pos_embed"}


def vit_trunk_from_vissl(trunk: Mapping[str, torch.Tensor]) -> StateDict:
    """VISSL's ViT trunk keys (``class_token``, ``blocks.0.attn.qkv.weight``) as the
    vision_transformer trunk's (``vit.cls_token``, ``vit.blocks.0.attn.qkv.weight``)."""
    return {f"vit.{VISSL_VIT_NAMES.get(k, k)}": v for k, v in trunk.items()}


def vit_trunk_to_vissl(trunk: Mapping[str, torch.Tensor]) -> StateDict:
    """The inverse of ``vit_trunk_from_vissl`` (keys outside ``vit.``, such as iBOT's
    ``mask_token``, which VISSL's ViT has not, are left out)."""
    back = {v: k for k, v in VISSL_VIT_NAMES.items()}
    return {back.get(k[4:], k[4:]): v for k, v in trunk.items() if k.startswith("vit.")}


def is_vissl_vit_trunk(trunk: Mapping[str, Any]) -> bool:
    """Whether a trunk state is VISSL's ViT: its class token and position embedding under
    VISSL's names and no key of timm's ``vit.`` module."""
    return all(k in trunk for k in VISSL_VIT_NAMES) and not any(
        k.startswith("vit.") for k in trunk)


# ------------------------------------------------------------------ whole model states
def is_vissl_model_state(model_state: Mapping[str, Any], prefix: str = FEATURE_BLOCKS) -> bool:
    """Whether ``{trunk, heads}`` holds a trunk key that only VISSL's names have (under
    ``prefix`` or ``base_model.``)."""
    return any(is_vissl_trunk_key(key, prefix) for key in model_state.get("trunk") or {})


def model_state_from_vissl(model_state: Mapping[str, Mapping[str, torch.Tensor]],
                           prefix: str = FEATURE_BLOCKS) -> dict:
    """VISSL's ``{trunk, heads}`` in this engine's names. With a prefix (ResNet), refuses a
    trunk with keys outside it and ``base_model.``, naming them."""
    trunk = dict(model_state.get("trunk") or {})
    outside = [key for key in trunk if prefix and not is_vissl_trunk_key(key, prefix)
               and not key.startswith(BESIDE_FEATURE_BLOCKS)]
    if not trunk or outside:
        raise CheckpointFormatError(key_mismatch_message(
            f"the trunk is not in VISSL's layout (every key under {prefix})",
            [] if trunk else [f"{prefix}*"], outside))
    return {"trunk": {trunk_key_from_vissl(k, prefix): v for k, v in trunk.items()},
            "heads": {head_key_from_vissl(k): v for k, v in (model_state.get("heads") or {}).items()}}


def model_state_to_vissl(model_state: Mapping[str, Mapping[str, torch.Tensor]],
                         prefix: str = FEATURE_BLOCKS) -> dict:
    return {"trunk": {trunk_key_to_vissl(k, prefix): v for k, v in model_state["trunk"].items()},
            "heads": {head_key_to_vissl(k): v for k, v in model_state["heads"].items()}}


def model_state_of(checkpoint: Mapping[str, Any], what: str = "the file") -> Mapping[str, Any]:
    """``classy_state_dict -> base_model -> model`` of a checkpoint of this engine or VISSL."""
    try:
        state = checkpoint["classy_state_dict"]["base_model"]["model"]
        if isinstance(state, Mapping) and {"trunk", "heads"} <= set(state):
            return state
    except (KeyError, TypeError):
        pass
    raise CheckpointFormatError(
        f"{what} is no checkpoint of this engine or VISSL: expected classy_state_dict -> "
        f"base_model -> model -> {{trunk, heads}}; its top-level keys: {named_keys(checkpoint)}")


def engine_checkpoint(model_state: Mapping[str, Any], **extra: Any) -> dict:
    """A file this engine loads as MODEL.WEIGHTS_INIT.PARAMS_FILE (model weights only)."""
    return {**extra, "classy_state_dict": {"base_model": {"model": {
        "trunk": dict(model_state["trunk"]), "heads": dict(model_state["heads"])}}}}


def vissl_checkpoint(model_state: Mapping[str, Any], prefix: str = FEATURE_BLOCKS,
                     **extra: Any) -> dict:
    """A consolidated VISSL checkpoint of ``model_state`` (this engine's names)."""
    return {"type": "consolidated", **extra, "classy_state_dict": {
        "base_model": {"model": model_state_to_vissl(model_state, prefix)}}}


# ------------------------------------------------------------------ torchvision ResNets
def infer_resnet_depth(trunk: Mapping[str, Any]) -> int:
    """18/34/50/101/152 from the number of blocks per stage and the block type."""
    blocks = []
    for stage in range(1, 5):
        prefix = f"layer{stage}."
        blocks.append(len({key.split(".")[1] for key in trunk if key.startswith(prefix)}))
    bottleneck = any(key.endswith("conv3.weight") for key in trunk)
    depths = {((2, 2, 2, 2), False): 18, ((3, 4, 6, 3), False): 34, ((3, 4, 6, 3), True): 50,
              ((3, 4, 23, 3), True): 101, ((3, 8, 36, 3), True): 152}
    depth = depths.get((tuple(blocks), bottleneck))
    if depth is None:
        raise CheckpointFormatError(
            f"the trunk is no torchvision ResNet: blocks per stage {blocks} "
            f"({'bottleneck' if bottleneck else 'basic'} blocks); its keys: {named_keys(trunk)}")
    return depth


def torchvision_reference(depth: int) -> StateDict:
    """The keys and shapes of ``torchvision.models.resnet<depth>`` without fc (tensors on the
    meta device: no memory, no initialisation)."""
    with torch.device("meta"):
        net = getattr(torchvision.models, f"resnet{depth}")(weights=None)
    return {k: v for k, v in net.state_dict().items() if not k.startswith("fc.")}


def check_torchvision_trunk(trunk: Mapping[str, torch.Tensor], what: str,
                            depth: Optional[int] = None) -> int:
    """Refuse ``trunk`` unless its keys and shapes are those of a torchvision ResNet (fc
    aside); return the depth."""
    depth = depth or infer_resnet_depth(trunk)
    reference = torchvision_reference(depth)
    message = key_mismatch_message(
        f"{what} does not match torchvision.models.resnet{depth}",
        [k for k in reference if k not in trunk], [k for k in trunk if k not in reference],
        [f"{k}: {tuple(trunk[k].shape)} vs {tuple(v.shape)}" for k, v in reference.items()
         if k in trunk and tuple(trunk[k].shape) != tuple(v.shape)])
    if message:
        raise CheckpointFormatError(message)
    return depth


def trunk_to_torchvision(model_state: Mapping[str, Any]) -> Tuple[StateDict, int]:
    """The trunk as a ``torchvision.models.resnet<depth>`` state dict without ``fc.*`` (load it
    after ``net.fc = torch.nn.Identity()``, or with ``strict=False``); and the depth."""
    trunk = dict(model_state["trunk"])
    return trunk, check_torchvision_trunk(trunk, "the trunk")


def model_state_from_torchvision(state: Mapping[str, torch.Tensor]) -> Tuple[dict, int]:
    """A torchvision ResNet state dict as this engine's model state (its ``fc.*`` left out:
    no head); and the depth."""
    trunk = {k: v for k, v in state.items() if not k.startswith("fc.")}
    depth = check_torchvision_trunk(trunk, "the torchvision state dict")
    return {"trunk": trunk, "heads": {}}, depth


# ------------------------------------------------------------------ VISSL training checkpoints
VISSL_RESUME_NOT_RESTORED = (
    "optimizer state (momentum buffers), loss state (queues, centers, prototypes' state), "
    "training position (the run starts at epoch 0 of its own schedule), RNG states, meters")


ENGINE_CHECKPOINT_KEYS = ("rng_states", "config")  # written by this engine's checkpoint hook


def is_vissl_checkpoint(checkpoint: Mapping[str, Any], prefix: str = "") -> bool:
    """Whether a training checkpoint is VISSL's: it holds a model state and none of what this
    engine writes into its own training checkpoints (``ENGINE_CHECKPOINT_KEYS``); where the
    trunk has a VISSL ``prefix``, a trunk key under it too (a weights file of this engine,
    written by ``engine_checkpoint``, has none)."""
    if any(key in checkpoint for key in ENGINE_CHECKPOINT_KEYS):
        return False
    try:
        model_state = model_state_of(checkpoint)
    except CheckpointFormatError:
        return False
    return not prefix or is_vissl_model_state(model_state, prefix)


def load_vissl_model_weights(model: torch.nn.Module, checkpoint: Mapping[str, Any]) -> None:
    """Copy a VISSL checkpoint's trunk and heads into ``model`` (a BaseSSLMultiInputOutputModel
    of the same architecture); any missing, extra or reshaped key raises ValueError naming it."""
    state = model_state_from_vissl(model_state_of(checkpoint), model_key_prefix(model))
    trunk = getattr(model, "trunk", None)
    # the ViT (VISSL_KEY_PREFIX None: timm's names) renames VISSL's ViT keys instead
    if getattr(type(trunk), "VISSL_KEY_PREFIX", "") is None and is_vissl_vit_trunk(state["trunk"]):
        state["trunk"] = vit_trunk_from_vissl(state["trunk"])
    model.set_classy_state({"model": state})
