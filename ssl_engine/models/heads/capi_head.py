"""CAPI's student side (Darcet et al. 2025, "Cluster and Predict Latent Patches for Improved
Masked Image Modeling"): a cross-attention predictor and the cluster prototypes, and the
teacher's online clustering layer that ``capi_loss`` trains.

The predictor puts a learned mask token at every masked patch; these queries cross-attend to
the encoder's visible patch tokens (never to each other) in ``depth`` pre-norm blocks, the
queries and the keys rotated by 2-D rotary position embeddings of their grid positions
(RoPE, Su et al. 2021; timm's ``RotaryEmbeddingCat``, axial, no learned position table), each
block ``q = query_norm(queries)``, ``k, v = context_norm(context)``, attention, ``proj``, then
an MLP, both residual; a final LayerNorm.  The prediction of each masked patch is scored
against the prototypes by cosine (the features and the prototypes L2-normalised: CAPI's
weight-normalised linear layer with its scale fixed to 1).

``clustering`` is the teacher's head (CAPI's online clustering): a linear layer with a bias,
weights drawn from N(0, 1), applied to the L2-normalised teacher patch tokens.  It is held
here, in the model, so that the optimizer trains it; the head's own forward does not use it:
``capi_loss`` calls ``cluster_logits`` on the teacher's tokens (no gradient reaches the
teacher, only this layer).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ssl_engine.models.registry import register_model_head
from ssl_engine.models.trunks.token_gather import assert_on_device
from ssl_engine.models.trunks.transformer_parts import Mlp, attend


def masked_positions(mask: torch.Tensor, masked: int) -> torch.Tensor:
    """[N, masked] indices (grid order) of the masked patches of ``mask`` ([N, h, w] or [N, L],
    True: masked), for masks that mask ``masked`` patches in every row: the complement of
    ``token_gather.visible_positions``, without reading the mask back from the device."""
    flat = mask.flatten(1)
    order = torch.argsort(flat.to(torch.uint8), dim=1, stable=True)  # visible first, in order
    return order[:, flat.shape[1] - masked:]


class CrossAttentionBlock(nn.Module):
    """Queries attend to a context; rotary embeddings of the grid positions on both sides."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"capi_head: num_heads={num_heads} must divide in_dim={dim}")
        self.num_heads = int(num_heads)
        self.query_norm = nn.LayerNorm(dim)
        self.context_norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=0.0)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """[N, T, D] -> [N, heads, T, D / heads]."""
        batch, tokens, dim = x.shape
        return x.reshape(batch, tokens, self.num_heads, dim // self.num_heads).transpose(1, 2)

    def forward(self, queries: torch.Tensor, context: torch.Tensor, query_rope: torch.Tensor,
                context_rope: torch.Tensor) -> torch.Tensor:
        from timm.layers import apply_rot_embed_cat

        q = apply_rot_embed_cat(self._split(self.q(self.query_norm(queries))), query_rope)
        k, v = self.kv(self.context_norm(context)).chunk(2, dim=-1)
        k = apply_rot_embed_cat(self._split(k), context_rope)
        out = attend(q, k, self._split(v), None, None, 0.0)
        batch, _, tokens, _ = out.shape
        queries = queries + self.proj(out.transpose(1, 2).reshape(batch, tokens, -1))
        return queries + self.mlp(self.mlp_norm(queries))


class CAPIPredictor(nn.Module):
    """The cross-attention predictor: ``forward(context, context_positions, query_positions,
    grid)`` -> [N, queries, dim], positions row-major indices into the ``grid`` (h, w)."""

    def __init__(self, dim: int, depth: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        from timm.layers import RotaryEmbeddingCat  # timm only where a ViT is used

        # axial 2-D rotary embeddings of the patch grid's indices (not pixels), built per grid
        self.rope = RotaryEmbeddingCat(dim=dim // num_heads, in_pixels=False)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.blocks = nn.ModuleList(CrossAttentionBlock(dim, num_heads, mlp_ratio)
                                    for _ in range(int(depth)))
        self.norm = nn.LayerNorm(dim)
        nn.init.normal_(self.mask_token, std=0.02)

    def forward(self, context: torch.Tensor, context_positions: torch.Tensor,
                query_positions: torch.Tensor, grid) -> torch.Tensor:
        rope = self.rope.get_embed(list(grid)).to(context.device)  # [h * w, 2 * head width]
        context_rope = rope[context_positions].unsqueeze(1)  # [N, 1, T, 2 * head width]
        query_rope = rope[query_positions].unsqueeze(1)
        queries = self.mask_token.to(context.dtype).expand(
            context.shape[0], query_positions.shape[1], -1)
        for block in self.blocks:
            queries = block(queries, context, query_rope, context_rope)
        return self.norm(queries)


@register_model_head("capi_head")
class CAPIHead(nn.Module):
    """Input: the encoder's ``lastBLK`` tokens of the visible patches [N, prefix + V, in_dim]
    (``num_prefix_tokens`` first: the class token; they are not part of the context) and
    ``mask`` [N, h, w] (True: masked; MULTI_INPUT_HEAD_MAPPING's ``additional_keys``), every
    image masking as many patches.  Output: the cosines of the predictions of the masked
    patches (grid order) with the ``num_clusters`` prototypes, [N, masked, num_clusters]."""

    def __init__(self, in_dim: int, num_clusters: int = 16384, depth: int = 12,
                 num_heads: int = 16, mlp_ratio: float = 4.0, num_prefix_tokens: int = 1,
                 clustering_bias: bool = True):
        super().__init__()
        in_dim, self.num_clusters = int(in_dim), int(num_clusters)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.predictor = CAPIPredictor(in_dim, int(depth), int(num_heads), float(mlp_ratio))
        self.prototypes = nn.Linear(in_dim, self.num_clusters, bias=False)
        nn.init.trunc_normal_(self.prototypes.weight, std=0.02)
        self.clustering = nn.Linear(in_dim, self.num_clusters, bias=bool(clustering_bias))
        nn.init.normal_(self.clustering.weight, std=1.0)
        if self.clustering.bias is not None:
            nn.init.zeros_(self.clustering.bias)

    def scores(self, features: torch.Tensor) -> torch.Tensor:
        """Cosines of ``features`` [..., in_dim] with the prototypes [..., num_clusters]."""
        return F.linear(F.normalize(features, dim=-1),
                        F.normalize(self.prototypes.weight, dim=-1))

    def cluster_logits(self, teacher_tokens: torch.Tensor) -> torch.Tensor:
        """The online clustering's logits of the teacher's patch tokens [..., in_dim]."""
        return self.clustering(F.normalize(teacher_tokens, dim=-1, eps=1e-7))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if mask is None:
            raise ValueError("capi_head needs the patch mask: list it in "
                             "MULTI_INPUT_HEAD_MAPPING's additional_keys")
        _, height, width = mask.shape
        patches = height * width
        context = x[:, self.num_prefix_tokens:]
        visible = context.shape[1]  # known from the shape: no wait for the device
        if not 0 < visible < patches:
            raise ValueError(f"capi_head got {visible} visible tokens for {patches} patches: "
                             "the encoder must run on the visible patches only "
                             "(MASKED_IMAGE_MODELING.NAME: mae) and each image mask some")
        flat = mask.flatten(1)
        assert_on_device((~flat).sum(dim=1) == visible,
                         f"capi_head got {visible} visible tokens for a mask leaving another "
                         "number of patches visible")
        order = torch.argsort(flat.to(torch.uint8), dim=1, stable=True)
        prediction = self.predictor(context, order[:, :visible], order[:, visible:],
                                    (height, width))
        return self.scores(prediction)
