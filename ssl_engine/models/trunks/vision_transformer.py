"""Vision Transformer (ViT / DeiT) trunk built on timm's VisionTransformer.

Configured by MODEL.TRUNK.VISION_TRANSFORMERS with VISSL's keys and defaults.  The network is
timm's ``VisionTransformer`` (class token, learned position embeddings, pre-norm blocks, a
final LayerNorm, timm's truncated-normal initialisation) without its classifier, built with
``dynamic_img_size`` so crops of any size run: the position embeddings are interpolated to
the crop's patch grid (multi-crop, small test images).  It is held as ``vit``, so a timm or
DINO state dict loads with MODEL.WEIGHTS_INIT.APPEND_PREFIX "trunk.vit.".

Outputs, named as in VISSL (all [N, dim]):

- ``lastCLS``: class token of the last block after the final norm (D, the default);
- ``concatCLS4``: class tokens of the last 4 blocks after the final norm, concatenated (4D;
  DINO's linear-evaluation feature);
- ``lastPOOL``: mean of the last block's patch tokens after the final norm (D);
- ``concatPOOL4``: the same mean for each of the last 4 blocks, concatenated (4D);
- ``norm``: ``lastCLS`` under the name of the final norm, which VISSL's DINO trunk-only
  extraction config (feature_extraction/extract_dino_vit_trunk_only) asks for.

- ``lastBLK``: every token of the last block after the final norm ([N, 1 + L, D] with the
  class token first; VISSL's name), the input of iBOT's and MAE's heads.

The ``concat*4`` outputs exist when the trunk has at least 4 blocks.

Masked image modelling (MASKED_IMAGE_MODELING.NAME), with ``forward(x, keys, mask=...)``, a
boolean mask [N, h, w] over the patch grid (True: masked; from the data pipeline's
MaskedImageModeling / RandomPatchMasking transforms):

- ``ibot``: the embedding of every masked patch is replaced by a learned mask token before the
  position embeddings are added (Zhou et al. 2022); all tokens go through the blocks.
- ``mae``: the encoder runs on the visible patches only (He et al. 2022): position embeddings
  are added to every patch, then the visible ones are gathered (in grid order) before the
  blocks; ``lastBLK`` is then [N, 1 + visible, D].  Every image must mask as many patches:
  ``int(L * mask_ratio)`` of its ``L``, RandomPatchMasking's count, with ``mask_ratio`` from
  MASKED_IMAGE_MODELING.PARAMS (derived from DATA.TRAIN.TRANSFORMS' RandomPatchMasking). The
  count known on the host, the visible tokens are gathered by index and the GPU is never
  waited for (a device-side assert checks the counts); without ``mask_ratio`` the count is
  read back from the mask, one wait per forward.

- ``aim``: prefix-causal attention (El-Nouby et al. 2024, ``trunks/prefix_causal.py``): the
  mask's True patches (after each image's prefix, RandomPrefixMasking) attend causally, the
  prefix bidirectionally; every patch is kept.

``forward(x, keys, context_index=...)``, [N, K] grid positions: the blocks see those patches
only (with their position embeddings), in that order: I-JEPA's context encoder
(Assran et al. 2023; the ijepa_collator gives the positions). ``lastBLK`` is then
[N, prefix + K, D].

Without a mask (evaluation, the teacher, the local crops) the trunk is the plain ViT.

``USE_CLASS_TOKEN: false`` (VISSL's ViT without a class token): the tokens are the patches
only (position embeddings for the patches alone, as timm's ``class_token=False``); the
outputs are then ``lastPOOL`` (the default) and ``concatPOOL4``, the CLS ones being refused.

``MASKED_IMAGE_MODELING: {NAME: msn, PARAMS: {drop_ratio}}``: MSN's random patch drop while
training, put in timm's patch-dropout slot (``trunks/msn_patch_drop.py``).
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ssl_engine.models.activation_checkpointing import checkpointing_splits
from ssl_engine.models.registry import register_model_trunk
from ssl_engine.models.trunks.conv_stem import conv_stem
from ssl_engine.models.trunks.base import StagedTrunk
from ssl_engine.models.trunks.msn_patch_drop import msn_patch_drop
from ssl_engine.models.trunks.prefix_causal import prefix_causal_bias
from ssl_engine.models.trunks.token_gather import assert_on_device, visible_positions
from ssl_engine.models.trunks.transformer_parts import use_shared_attention
from ssl_engine.utils.derivations import register_config_derivation
from ssl_engine.utils.key_rules import accept_number_or_false

CONFIG = "config.MODEL.TRUNK.VISION_TRANSFORMERS"
# VISION_TRANSFORMERS.name -> (PATCH_SIZE, NUM_LAYERS, NUM_HEADS, HIDDEN_DIM, MLP_DIM); the
# other keys (image size, dropout, ...) still come from the config.
NAMED_SIZES = {
    "vit_b_32": (32, 12, 12, 768, 3072),
    "vit_b_16": (16, 12, 12, 768, 3072),
    "vit_l_32": (32, 24, 16, 1024, 4096),
    "vit_l_16": (16, 24, 16, 1024, 4096),
    "vit_h_14": (14, 32, 16, 1280, 5120),
}
CONCAT_BLOCKS = 4
# output name -> (number of last blocks it reads, "CLS": class token | "POOL": patch mean)
OUTPUTS: Dict[str, Tuple[int, str]] = {
    "lastCLS": (1, "CLS"),
    f"concatCLS{CONCAT_BLOCKS}": (CONCAT_BLOCKS, "CLS"),
    "lastPOOL": (1, "POOL"),
    f"concatPOOL{CONCAT_BLOCKS}": (CONCAT_BLOCKS, "POOL"),
    "norm": (1, "CLS"),  # VISSL's DINO extraction config's name: lastCLS under another name
}


ALL_TOKENS = "lastBLK"
MASKINGS = ("ibot", "mae", "msn", "aim")


def _masking(cfg) -> str:
    """MASKED_IMAGE_MODELING.NAME, "" for none (VISSL's 'none' too)."""
    name = (cfg.get("MASKED_IMAGE_MODELING") or {}).get("NAME", "") or ""
    return "" if name == "none" else str(name)


def _not_supported(key: str, value, why: str) -> ValueError:
    return ValueError(f"{CONFIG}.{key}={value!r} is not supported: {why}")


def _check_unsupported(cfg) -> None:
    """Refuse the values of VISSL's keys whose feature this trunk does not have."""
    if cfg.get("CLASSIFIER", "token") != "token":
        raise _not_supported("CLASSIFIER", cfg.CLASSIFIER,
                             "only 'token' (the class token); use the lastPOOL output for the "
                             "mean of the patch tokens")
    qk_scale = cfg.get("QK_SCALE", False)
    if qk_scale not in (None, False):
        raise _not_supported("QK_SCALE", qk_scale,
                             "attention is scaled by 1/sqrt(head dim); set it to false")
    if cfg.get("CHECKPOINT_MLP", False):
        raise _not_supported("CHECKPOINT_MLP", cfg.CHECKPOINT_MLP,
                             "use CHECKPOINT_BLOCK=true to recompute whole blocks instead")
    masking = _masking(cfg)
    if masking and masking not in MASKINGS:
        raise _not_supported("MASKED_IMAGE_MODELING.NAME", masking,
                             f"the trunk's patch masking is one of {', '.join(MASKINGS)} "
                             "(or empty: none)")


def _sizes(cfg) -> Tuple[int, int, int, int, int]:
    """(patch size, layers, heads, hidden dim, MLP dim) from ``name`` or the config keys."""
    name = cfg.get("name")
    if name:
        if name not in NAMED_SIZES:
            raise ValueError(f"{CONFIG}.name={name!r} is not one of {', '.join(NAMED_SIZES)} "
                             "(or null to use PATCH_SIZE, NUM_LAYERS, NUM_HEADS, HIDDEN_DIM "
                             "and MLP_DIM)")
        return NAMED_SIZES[name]
    keys = ("PATCH_SIZE", "NUM_LAYERS", "NUM_HEADS", "HIDDEN_DIM", "MLP_DIM")
    sizes = tuple(int(cfg[key]) for key in keys)
    for key, size in zip(keys, sizes):
        if size < 1:
            raise ValueError(f"{CONFIG}.{key} must be at least 1, got {size}")
    return sizes


def _mlp_ratio(hidden_dim: int, mlp_dim: int) -> float:
    """timm's ``mlp_ratio``, checked to give back exactly ``mlp_dim`` as timm rounds it."""
    ratio = mlp_dim / hidden_dim
    if int(hidden_dim * ratio) != mlp_dim:
        raise ValueError(f"{CONFIG}.MLP_DIM={mlp_dim} cannot be expressed as HIDDEN_DIM="
                         f"{hidden_dim} x a ratio; choose e.g. MLP_DIM={4 * hidden_dim}")
    return ratio


def seed_msn_patch_drop(cfg) -> None:
    """MSN's patch drop (MASKED_IMAGE_MODELING.NAME=msn) is seeded with SEED_VALUE unless its
    PARAMS give a seed; in every config, whatever MODEL.TRUNK.NAME (the section is the
    schema's, and VISSL's configs give it beside other trunks too)."""
    masking = cfg.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING
    if masking.NAME == "msn" and "seed" not in (masking.PARAMS or {}):
        masking.PARAMS = {**(masking.PARAMS or {}), "seed": int(cfg.SEED_VALUE)}


register_config_derivation("vision_transformer_masking", seed_msn_patch_drop)


def derive_mae_mask_ratio(cfg) -> None:
    """MASKED_IMAGE_MODELING.NAME=mae: PARAMS.mask_ratio from the RandomPatchMasking of
    DATA.TRAIN.TRANSFORMS (unless PARAMS gives it), so that the trunk knows how many patches
    each image masks without reading the mask back from the device."""
    masking = cfg.MODEL.TRUNK.VISION_TRANSFORMERS.MASKED_IMAGE_MODELING
    if masking.NAME != "mae" or "mask_ratio" in (masking.PARAMS or {}):
        return
    for transform in cfg.DATA.TRAIN.get("TRANSFORMS") or ():
        if transform.get("name") == "RandomPatchMasking":
            ratio = float(transform.get("mask_ratio", 0.75))  # the transform's default
            masking.PARAMS = {**(masking.PARAMS or {}), "mask_ratio": ratio}
            return


register_config_derivation("vision_transformer_mae_mask_ratio", derive_mae_mask_ratio)


accept_number_or_false("config.MODEL.TRUNK.VISION_TRANSFORMERS.QK_SCALE")

@register_model_trunk("vision_transformer")
class VisionTransformerTrunk(StagedTrunk):
    """Stages: lastCLS (default), concatCLS4, lastPOOL, concatPOOL4; see the module docstring.

    One forward runs the patch embedding and every block once, whatever outputs are asked
    for, and applies the final norm only to the blocks those outputs read.
    """

    VISSL_KEY_PREFIX = None  # timm's names, not VISSL's: no conversion to VISSL's layout

    default_out_feat_key = "lastCLS"

    def __init__(self, model_cfg):
        super().__init__(model_cfg)
        # imported here: timm adds about half a second to every process that imports the
        # models, which only runs with a ViT need
        from timm.models.vision_transformer import VisionTransformer

        cfg = model_cfg.TRUNK.VISION_TRANSFORMERS
        _check_unsupported(cfg)
        patch_size, num_layers, num_heads, hidden_dim, mlp_dim = _sizes(cfg)
        if hidden_dim % num_heads:
            raise ValueError(f"{CONFIG}.NUM_HEADS={num_heads} must divide HIDDEN_DIM="
                             f"{hidden_dim}")
        image_size = int(cfg.IMAGE_SIZE)
        if image_size < patch_size:
            raise ValueError(f"{CONFIG}.IMAGE_SIZE={image_size} is smaller than the patch "
                             f"size {patch_size}")
        dropout = float(cfg.DROPOUT_RATE)
        self.use_class_token = bool(cfg.get("USE_CLASS_TOKEN", True))
        self.masking = _masking(cfg)
        self.vit = VisionTransformer(
            img_size=image_size,
            patch_size=patch_size,
            in_chans=3,
            num_classes=0,
            class_token=self.use_class_token,
            global_pool="token" if self.use_class_token else "avg",
            fc_norm=False,  # the final norm on every token (timm's avg pool would move it
            # to a norm after the mean that no output here reads: unused in DDP, no final norm)
            embed_dim=hidden_dim,
            depth=num_layers,
            num_heads=num_heads,
            mlp_ratio=_mlp_ratio(hidden_dim, mlp_dim),
            qkv_bias=bool(cfg.QKV_BIAS),
            dynamic_img_size=True,
            pos_drop_rate=dropout,
            proj_drop_rate=dropout,
            attn_drop_rate=float(cfg.ATTENTION_DROPOUT_RATE),
            drop_path_rate=float(cfg.DROP_PATH_RATE),
        )
        use_shared_attention(self.vit.blocks)  # fused attention, timm's parameter names
        stem = (cfg.get("HYBRID") or {}).get("CONV_STEM") or []
        if stem:  # a convolutional stem instead of the patchify convolution (conv_stem.py)
            self.vit.patch_embed.proj = conv_stem(stem, patch_size, hidden_dim)
        masking = cfg.get("MASKED_IMAGE_MODELING") or {}
        if masking.get("NAME") == "msn":  # timm's patch-dropout slot: after the positions
            self.vit.patch_drop = msn_patch_drop(masking.get("PARAMS"), self.vit.num_prefix_tokens)
        # MODEL.ACTIVATION_CHECKPOINTING recomputes every block too (timm checkpoints per block)
        self.vit.set_grad_checkpointing(bool(cfg.get("CHECKPOINT_BLOCK", False))
                                        or bool(checkpointing_splits(model_cfg)))
        self.stage_dims = {
            name: hidden_dim * num_blocks
            for name, (num_blocks, token) in OUTPUTS.items()
            if num_blocks <= num_layers and (self.use_class_token or token == "POOL")
        }
        if not self.use_class_token:
            self.default_out_feat_key = "lastPOOL"
        # MAE: the share of the patches every image masks, when known (derive_mae_mask_ratio)
        ratio = (masking.get("PARAMS") or {}).get("mask_ratio")
        self.mae_mask_ratio = None if ratio is None else float(ratio)
        if self.masking == "ibot":  # iBOT's learned embedding of a masked patch
            self.mask_token = torch.nn.Parameter(torch.zeros(1, 1, 1, hidden_dim))

    def check_out_feat_keys(self, out_feat_keys: Optional[Sequence[str]]) -> List[str]:
        if not self.use_class_token:
            cls = [key for key in out_feat_keys or () if OUTPUTS.get(key, (0, ""))[1] == "CLS"]
            if cls:
                raise ValueError(f"the ViT output(s) {cls} read the class token, and "
                                 f"{CONFIG}.USE_CLASS_TOKEN=false builds none: use "
                                 f"{', '.join(self.stage_names)} (means of the patch tokens)")
        # lastBLK is a token sequence, not a feature vector: not one of stage_dims
        super().check_out_feat_keys([key for key in out_feat_keys or () if key != ALL_TOKENS])
        return [self.default_out_feat_key] if not out_feat_keys else list(out_feat_keys)

    def fsdp_units(self) -> List[torch.nn.Module]:
        """The modules FSDP shards one by one (self_supervision_fsdp_task): the blocks."""
        return list(self.vit.blocks)

    def stages(self):
        raise NotImplementedError("the ViT outputs share one pass through the blocks: "
                                  "call forward(x, out_feat_keys)")

    def forward(
        self, x: torch.Tensor, out_feat_keys: Optional[Sequence[str]] = None,
        mask: Optional[torch.Tensor] = None, context_index: Optional[torch.Tensor] = None,
    ) -> List[torch.Tensor]:
        """The outputs named in ``out_feat_keys`` (default: lastCLS), in that order; with
        ``mask`` or ``context_index``, those of the masked input (see the module docstring)."""
        keys = self.check_out_feat_keys(out_feat_keys)
        if mask is not None or context_index is not None or ALL_TOKENS in keys:
            return self._last_block_outputs(x, keys, mask, context_index)
        num_blocks = max(OUTPUTS[key][0] for key in keys)
        # (patch tokens [N, L, D], class token [N, 1, D] or None) of each of the last
        # num_blocks blocks, final norm applied, oldest first
        blocks = self.vit.forward_intermediates(
            x, indices=num_blocks, return_prefix_tokens=self.use_class_token, norm=True,
            output_fmt="NLC", intermediates_only=True,
        )
        if not self.use_class_token:  # patch tokens only (CLS outputs are refused)
            blocks = [(patches, None) for patches in blocks]
        found: Dict[str, torch.Tensor] = {}
        for key in keys:
            if key in found:
                continue
            count, token = OUTPUTS[key]
            parts = [
                prefix[:, 0] if token == "CLS" else patches.mean(dim=1)
                for patches, prefix in blocks[-count:]
            ]
            found[key] = torch.cat(parts, dim=1) if count > 1 else parts[0]
        return [found[key] for key in keys]

    # ------------------------------------------------------------------ masked inputs
    def _last_block_outputs(self, x: torch.Tensor, keys: Sequence[str],
                            mask: Optional[torch.Tensor],
                            context_index: Optional[torch.Tensor] = None) -> List[torch.Tensor]:
        """lastBLK, lastCLS and lastPOOL of one pass, the input masked when ``mask`` is given."""
        deep = [key for key in keys if key != ALL_TOKENS and OUTPUTS[key][0] > 1]
        if deep:
            raise ValueError(f"the ViT outputs {deep} are not computed with {ALL_TOKENS} or a "
                             "mask: ask for lastCLS, lastPOOL or lastBLK")
        vit = self.vit
        tokens = vit.patch_embed(x)  # [N, h, w, D] (dynamic_img_size)
        if mask is not None:
            mask = self._check_mask(mask, tokens)
            if self.masking == "ibot":
                tokens = torch.where(mask.unsqueeze(-1), self.mask_token.to(tokens.dtype),
                                     tokens)
        tokens = vit._pos_embed(tokens)  # [N, prefix + h*w, D]
        prefix = vit.num_prefix_tokens
        if mask is not None and self.masking == "mae":
            patches = tokens[:, prefix:]
            index = visible_positions(mask, self._masked_count(mask))
            visible = patches.gather(1, index.unsqueeze(-1).expand(-1, -1, patches.shape[-1]))
            tokens = torch.cat([tokens[:, :prefix], visible], dim=1)
        if context_index is not None:  # I-JEPA's context: the listed patches only
            index = context_index.long().unsqueeze(-1).expand(-1, -1, tokens.shape[-1])
            tokens = torch.cat([tokens[:, :prefix], tokens[:, prefix:].gather(1, index)], dim=1)
        bias = (prefix_causal_bias(mask, prefix, tokens.dtype)
                if mask is not None and self.masking == "aim" else None)
        tokens = vit.norm_pre(vit.patch_drop(tokens))
        for block in vit.blocks:
            if vit.grad_checkpointing and torch.is_grad_enabled():
                tokens = torch.utils.checkpoint.checkpoint(block, tokens, bias,
                                                           use_reentrant=False)
            else:
                tokens = block(tokens, bias)
        tokens = vit.norm(tokens)
        found = {ALL_TOKENS: tokens, "lastCLS": tokens[:, 0] if prefix else None,
                 "lastPOOL": tokens[:, prefix:].mean(dim=1)}
        found["norm"] = found["lastCLS"]
        return [found[key] for key in keys]

    def _check_mask(self, mask: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """``mask`` as booleans [N, h, w] matching the patch grid (ValueError otherwise)."""
        if not self.masking:
            raise ValueError(f"the ViT got a patch mask but {CONFIG}.MASKED_IMAGE_MODELING.NAME "
                             f"is empty: set it to one of {', '.join(MASKINGS)}")
        if tuple(mask.shape) != tuple(tokens.shape[:3]):
            raise ValueError(f"the patch mask has shape {tuple(mask.shape)}, the patch grid of "
                             f"the batch is {tuple(tokens.shape[:3])}")
        if self.masking == "msn":
            raise ValueError("the ViT got a patch mask but MASKED_IMAGE_MODELING.NAME=msn drops "
                             "patches itself while training: feed the images without a mask")
        return mask.bool()

    def _masked_count(self, mask: torch.Tensor) -> int:
        """The patches each image of ``mask`` masks: ``int(L * mask_ratio)`` when the ratio is
        known, checked on the device (no wait); else read back from the first image."""
        if self.mae_mask_ratio is None:
            count = int(mask[0].sum())  # one wait for the device: no ratio configured
        else:
            count = int(mask[0].numel() * self.mae_mask_ratio)
        assert_on_device(mask.flatten(1).sum(dim=1) == count,
                         f"MAE masking needs as many masked patches in every image: {count} "
                         f"of {mask[0].numel()} (the first image's or mask_ratio's count)")
        return count
