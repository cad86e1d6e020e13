"""Every transformer trunk attends through torch's fused scaled_dot_product_attention, and
gives what the explicit softmax(q k^T * scale + bias) v of the earlier code gave, to 1e-5."""
import math

import pytest
import torch
import torch.nn.functional as F

import test_models_beit as beit_tests
import test_models_classy_vit as classy_vit_tests
import test_models_convit as convit_tests
import test_models_swin_transformer as swin_tests
import test_models_vit as vit_tests
import test_models_xcit as xcit_tests
from ssl_engine.models.heads.mae_decoder import MAEDecoder
from ssl_engine.models.trunks.convit import GPSA
from ssl_engine.models.trunks.xcit import XCA

# trunk -> (the tiny model of its own tests, images)
TRUNKS = {
    "vision_transformer": (vit_tests.make_model, vit_tests.images),
    "beit": (beit_tests.make_model, beit_tests.images),
    "xcit": (xcit_tests.make_model, xcit_tests.images),
    "swin_transformer": (swin_tests.make_model, swin_tests.images),
    "convit": (convit_tests.make_model, convit_tests.images),
    "classy_vit": (classy_vit_tests.make_model, classy_vit_tests.images),
}


def explicit_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                       enable_gqa=False):
    """The scores written out: softmax(q k^T * scale + mask) v (no dropout in these tests)."""
    assert dropout_p == 0.0 and not is_causal
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q * scale) @ k.transpose(-2, -1)
    if attn_mask is not None:
        scores = scores + attn_mask
    return scores.softmax(dim=-1) @ v


def xca_as_before(self, x):
    """XCiT's cross-covariance attention as it was written before the fused call."""
    batch, tokens, dim = x.shape
    q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, -1).permute(2, 0, 3, 4, 1)
    q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    weights = (q @ k.transpose(-2, -1) * self.temperature).softmax(dim=-1)
    out = (weights @ v).permute(0, 3, 1, 2).reshape(batch, tokens, dim)
    return self.proj_drop(self.proj(out))


def gpsa_as_before(self, x):
    """ConViT's gated positional attention as it was written before the fused call."""
    batch, tokens, dim = x.shape
    q, k = self.qk(x).reshape(batch, tokens, 2, self.num_heads, -1).permute(2, 0, 3, 1, 4)
    v = self.v(x).reshape(batch, tokens, self.num_heads, -1).transpose(1, 2)
    positional = self.pos_proj(self.positions(x.device).to(x.dtype)).permute(0, 3, 1, 2)
    positional = (positional / self.locality_dim).softmax(dim=-1)
    content = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
    gate = torch.sigmoid(self.alpha)
    weights = (1.0 - gate) * content + gate * positional
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return self.proj_drop(self.proj((weights @ v).transpose(1, 2).reshape(batch, tokens, dim)))


def attention_layers(model) -> int:
    """The attention modules of ``model`` (each must call the fused attention once a forward)."""
    names = ("Attention", "WindowAttention", "XCA", "ClassAttention", "GPSA", "SelfAttention",
             "MultiheadAttention")
    return sum(type(module).__name__ in names for module in model.modules())


def trunk_forward(name):
    make_model, images = TRUNKS[name]
    model = make_model()
    # training mode with gradients: torch's MultiheadAttention (classy_vit) takes its
    # inference fast path otherwise; no dropout is configured
    model.train()
    x = images()
    return model, (lambda: model.trunk(x)[0])


def mae_decoder_forward():
    torch.manual_seed(0)
    decoder = MAEDecoder(in_dim=16, patch_size=2, decoder_dim=16, depth=2, num_heads=2)
    mask = torch.zeros(3, 4, 4, dtype=torch.bool)
    for row in range(3):
        mask.view(3, -1)[row, torch.randperm(16, generator=torch.Generator().manual_seed(row))[:12]] = True
    tokens = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1))
    return decoder, (lambda: decoder(tokens, mask))


def build(name):
    """(model, its forward) of trunk ``name`` or of MAE's decoder."""
    return mae_decoder_forward() if name == "mae_decoder" else trunk_forward(name)


@pytest.mark.parametrize("name", [*TRUNKS, "mae_decoder"])
def test_every_attention_calls_the_fused_kernel(name, monkeypatch):
    model, forward = build(name)
    calls = []
    fused = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return fused(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    forward()
    layers = attention_layers(model)
    assert layers > 0 and len(calls) == layers, (name, layers, len(calls))


@pytest.mark.parametrize("name", [*TRUNKS, "mae_decoder"])
def test_fused_attention_gives_the_explicit_softmax(name, monkeypatch):
    model, forward = build(name)
    fused = forward().detach()
    monkeypatch.setattr(F, "scaled_dot_product_attention", explicit_attention)
    monkeypatch.setattr(XCA, "forward", xca_as_before)
    monkeypatch.setattr(GPSA, "forward", gpsa_as_before)
    before = forward().detach()
    difference = (fused - before).abs().max().item()
    print(f"{name}: max |fused - explicit| = {difference:.2e}")
    assert before.abs().max() > 0.1  # a real output, not a collapsed one
    assert difference <= 1e-5
