"""The vision_transformer trunk: named outputs checked against timm's own forward, crops of
other sizes, one pass through the blocks, refused settings, training and linear evaluation."""
import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from timm.models.vision_transformer import VisionTransformer

from ssl_engine.config import compose_config
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.models import build_model

with open(Path(__file__).resolve().parents[1] / "configs/config/defaults.yaml") as f:
    DEFAULT_MODEL_CFG = AttrDict(yaml.safe_load(f)["config"]["MODEL"])

KEY = "config.MODEL.TRUNK.VISION_TRANSFORMERS"
D = 32
TINY = dict(IMAGE_SIZE=16, PATCH_SIZE=4, HIDDEN_DIM=D, NUM_LAYERS=4, NUM_HEADS=2, MLP_DIM=64,
            QKV_BIAS=True)
OUTPUT_DIMS = {"lastCLS": D, "concatCLS4": 4 * D, "lastPOOL": D, "concatPOOL4": 4 * D, "norm": D}


def vit_cfg(heads=(), **vit_overrides):
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = "vision_transformer"
    cfg.TRUNK.VISION_TRANSFORMERS.update(TINY, **vit_overrides)
    cfg.HEAD.PARAMS = [list(head) for head in heads]
    return cfg


def make_model(seed=0, heads=(), **vit_overrides):
    torch.manual_seed(seed)
    return build_model(vit_cfg(heads, **vit_overrides))


def images(n=3, size=16, seed=1):
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def timm_copy(trunk) -> VisionTransformer:
    """A ViT built directly with timm for the tiny geometry, holding the trunk's weights."""
    reference = VisionTransformer(img_size=16, patch_size=4, embed_dim=D, depth=4, num_heads=2,
                                  mlp_ratio=2.0, qkv_bias=True, num_classes=0,
                                  dynamic_img_size=True)
    reference.load_state_dict(trunk.vit.state_dict())
    return reference.eval()


def normed_tokens_per_block(reference: VisionTransformer, x: torch.Tensor):
    """Every block's tokens after the final norm, computed step by step from timm's modules
    (16x16 input: the position embeddings are used as they are)."""
    patches = reference.patch_embed(x).flatten(1, 2)  # [N, H, W, D] -> [N, L, D]
    cls = reference.cls_token.expand(len(x), -1, -1)
    tokens = torch.cat([cls, patches], dim=1) + reference.pos_embed
    normed = []
    for block in reference.blocks:
        tokens = block(tokens)
        normed.append(reference.norm(tokens))
    return normed


def test_every_named_output_has_its_shape():
    trunk = make_model().trunk.eval()
    assert trunk.stage_dims == OUTPUT_DIMS
    assert trunk.default_out_feat_key == "lastCLS" and trunk.output_dim == D
    with torch.no_grad():
        outputs = trunk(images(), list(OUTPUT_DIMS))
        (default,) = trunk(images())
    assert [tuple(o.shape) for o in outputs] == [(3, dim) for dim in OUTPUT_DIMS.values()]
    torch.testing.assert_close(default, outputs[0], rtol=0, atol=0)


def test_outputs_equal_timm_computed_independently():
    trunk = make_model().trunk.eval()
    reference = timm_copy(trunk)
    x = images()
    with torch.no_grad():
        last_cls, concat_cls, last_pool, concat_pool, norm = trunk(x, list(OUTPUT_DIMS))
        normed = normed_tokens_per_block(reference, x)
        timm_features = reference.forward_features(x)
        timm_pooled = reference(x)  # timm's own class-token pooling, no classifier
    torch.testing.assert_close(last_cls, timm_features[:, 0])
    torch.testing.assert_close(last_cls, timm_pooled)
    torch.testing.assert_close(norm, last_cls, rtol=0, atol=0)  # VISSL's DINO extraction name
    torch.testing.assert_close(last_pool, timm_features[:, 1:].mean(dim=1))
    torch.testing.assert_close(concat_cls, torch.cat([t[:, 0] for t in normed], dim=1))
    torch.testing.assert_close(concat_pool, torch.cat([t[:, 1:].mean(1) for t in normed], dim=1))
    torch.testing.assert_close(concat_cls[:, -D:], last_cls)
    # the blocks differ, so the concatenation is not one block repeated
    assert not torch.allclose(concat_cls[:, :D], concat_cls[:, -D:], atol=1e-3)


def test_crop_of_another_size_interpolates_position_embeddings():
    model = make_model().eval()
    reference = timm_copy(model.trunk)
    small, large = images(2, 8, seed=2), images(3, 16, seed=3)
    with torch.no_grad():
        outputs = model.trunk(small, list(OUTPUT_DIMS))
        expected_small = reference(small)
        (both,) = model([large, small])  # multi-crop: the crops' features are concatenated
    assert [tuple(o.shape) for o in outputs] == [(2, dim) for dim in OUTPUT_DIMS.values()]
    torch.testing.assert_close(outputs[0], expected_small)
    assert tuple(both.shape) == (5, D)
    torch.testing.assert_close(both[3:], outputs[0])


def count_calls(modules):
    """Per module, how many times its forward ran (the list fills as they run).  The forward
    is wrapped rather than hooked: hooks do not fire when checkpointing recomputes a block."""
    counts = [0] * len(modules)
    for index, module in enumerate(modules):
        def counted(*args, index=index, forward=module.forward, **kwargs):
            counts[index] += 1
            return forward(*args, **kwargs)
        module.forward = counted
    return counts


@pytest.mark.parametrize("keys, norm_calls", [
    (["lastCLS"], 1),
    (["lastCLS", "lastPOOL"], 1),
    (["concatPOOL4", "lastCLS", "concatCLS4", "lastPOOL"], 4),
])
def test_blocks_run_once_and_only_needed_blocks_are_normed(keys, norm_calls):
    trunk = make_model().trunk.eval()
    block_calls = count_calls(list(trunk.vit.blocks))
    (norms,) = [count_calls([trunk.vit.norm])]
    with torch.no_grad():
        trunk(images(), keys)
    assert block_calls == [1, 1, 1, 1]
    assert norms == [norm_calls]


def test_unknown_output_names_fail():
    trunk = make_model().trunk
    with pytest.raises(ValueError, match=r"no stage\(s\) \['res5'\]; its stages are: "
                                         r"lastCLS, concatCLS4, lastPOOL, concatPOOL4"):
        trunk(images(), ["lastCLS", "res5"])


def test_concat4_outputs_need_four_blocks():
    trunk = make_model(NUM_LAYERS=2).trunk
    assert trunk.stage_dims == {"lastCLS": D, "lastPOOL": D, "norm": D}
    with pytest.raises(ValueError, match=r"no stage\(s\) \['concatCLS4'\]"):
        trunk(images(), ["concatCLS4"])


@pytest.mark.parametrize("key, value", [
    ("QK_SCALE", 0.125),
    ("QK_SCALE", True),
    ("CHECKPOINT_MLP", True),
    ("CLASSIFIER", "gap"),
    ("MASKED_IMAGE_MODELING.NAME", "beit"),
])
def test_unsupported_settings_are_refused_naming_the_key(key, value):
    cfg = vit_cfg()
    *sections, name = key.split(".")
    node = cfg.TRUNK.VISION_TRANSFORMERS
    for section in sections:
        node = node[section]
    node[name] = value
    with pytest.raises(ValueError, match=rf"{KEY}\.{key}={value!r} is not supported"):
        build_model(cfg)


@pytest.mark.parametrize("overrides, message", [
    (dict(HIDDEN_DIM=56, MLP_DIM=61), rf"{KEY}\.MLP_DIM=61 cannot be expressed"),
    (dict(NUM_HEADS=3), rf"{KEY}\.NUM_HEADS=3 must divide HIDDEN_DIM=32"),
    (dict(name="vit_x_99"), rf"{KEY}\.name='vit_x_99' is not one of vit_b_32"),
    (dict(IMAGE_SIZE=2), rf"{KEY}\.IMAGE_SIZE=2 is smaller than the patch size 4"),
])
def test_inconsistent_sizes_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        make_model(**overrides)


def test_mlp_dim_sets_the_block_mlp_width():
    trunk = make_model(HIDDEN_DIM=24, NUM_HEADS=3, MLP_DIM=40).trunk
    assert {block.mlp.fc1.out_features for block in trunk.vit.blocks} == {40}


def vit_b16_parameters(qkv_bias: bool) -> int:
    """ViT-B/16 at 224 without classifier, counted from its shapes."""
    d, mlp, layers, patches = 768, 3072, 12, (224 // 16) ** 2
    embed = 3 * 16 * 16 * d + d + d + (patches + 1) * d  # patch conv, class token, positions
    attention = 3 * d * d + (3 * d if qkv_bias else 0) + d * d + d
    block = 2 * 2 * d + attention + d * mlp + mlp + mlp * d + d
    return embed + layers * block + 2 * d


@pytest.mark.parametrize("vit_overrides, qkv_bias", [
    ({}, False),  # the defaults: ViT-B/16 without qkv bias, as VISSL
    ({"name": "vit_b_16", "PATCH_SIZE": 8, "NUM_LAYERS": 2, "QKV_BIAS": True}, True),
])
def test_defaults_and_named_size_build_vit_b16(vit_overrides, qkv_bias):
    cfg = copy.deepcopy(DEFAULT_MODEL_CFG)
    cfg.TRUNK.NAME = "vision_transformer"
    cfg.TRUNK.VISION_TRANSFORMERS.update(vit_overrides)
    with torch.device("meta"):  # shapes only: nothing allocated or initialised
        trunk = build_model(cfg).trunk
    assert sum(p.numel() for p in trunk.parameters()) == vit_b16_parameters(qkv_bias)
    assert len(trunk.vit.blocks) == 12 and trunk.stage_dims["concatCLS4"] == 4 * 768


def test_one_sgd_step_with_an_mlp_head():
    model = make_model(heads=[["mlp", {"dims": [D, 16, 4], "use_relu": True}]]).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, target = images(8), torch.arange(8) % 4

    def loss_value():
        (logits,) = model(x)
        assert logits.shape == (8, 4)
        return F.cross_entropy(logits, target)

    loss = loss_value()
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name
    optimizer.step()
    with torch.no_grad():
        assert loss_value() < loss.detach()


def test_checkpoint_block_recomputes_blocks_with_the_same_gradients():
    x = images(4)
    gradients, block_calls = [], []
    for checkpointed in (False, True):
        trunk = make_model(CHECKPOINT_BLOCK=checkpointed).trunk.train()
        calls = count_calls(list(trunk.vit.blocks))
        trunk(x, ["concatCLS4"])[0].square().sum().backward()
        gradients.append({n: p.grad for n, p in trunk.named_parameters()})
        block_calls.append(calls)
    assert block_calls == [[1, 1, 1, 1], [2, 2, 2, 2]]  # forward, then again in backward
    for name, grad in gradients[0].items():
        torch.testing.assert_close(gradients[1][name], grad, msg=name)


def test_linear_eval_head_on_concat_cls4():
    pool_map = [["concatCLS4", ["Identity", []]]]
    cfg = vit_cfg(heads=[["eval_mlp", {"in_channels": 4 * D, "dims": [4 * D, 10]}]])
    cfg.FEATURE_EVAL_SETTINGS.update(EVAL_MODE_ON=True, FREEZE_TRUNK_ONLY=True,
                                     LINEAR_EVAL_FEAT_POOL_OPS_MAP=pool_map)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    assert not any(p.requires_grad for p in model.trunk.parameters())
    x = images(4)
    (logits,) = model(x)
    assert logits.shape == (4, 10)
    model.eval()
    with torch.no_grad():
        (features,) = model.trunk(x, ["concatCLS4"])
        torch.testing.assert_close(model(x)[0], model.heads[0](features))
    cfg.FEATURE_EVAL_SETTINGS.update(EXTRACT_TRUNK_FEATURES_ONLY=True, FREEZE_TRUNK_AND_HEAD=True)
    extractor = build_model(cfg).eval()
    assert len(extractor.heads) == 0  # a trunk feature extractor builds no head
    extractor.trunk.load_state_dict(model.trunk.state_dict())
    with torch.no_grad():
        layers = extractor.extract_layers(x)
    assert list(layers) == ["concatCLS4"]
    torch.testing.assert_close(layers["concatCLS4"], features)


def test_digits_linear_eval_config_builds_a_tiny_vit():
    _, cfg = compose_config(["config=benchmark/linear_image_classification/digits/eval_vit_linear"])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL).eval()
    assert model.eval_settings.stages == ["concatCLS4"]
    with torch.no_grad():
        (logits,) = model(images(2))
    assert logits.shape == (2, 10)


def test_without_class_token_outputs_are_means_of_the_patch_tokens():
    trunk = make_model(USE_CLASS_TOKEN=False).trunk.eval()
    vit = trunk.vit
    assert vit.cls_token is None and vit.pos_embed.shape == (1, 16, D)  # 4x4 patches only
    assert trunk.stage_dims == {"lastPOOL": D, "concatPOOL4": 4 * D}
    assert trunk.default_out_feat_key == "lastPOOL" and trunk.output_dim == D
    x = images()
    with torch.no_grad():
        last_pool, concat_pool = trunk(x, ["lastPOOL", "concatPOOL4"])
        (default,) = trunk(x)
        tokens = vit.patch_embed(x).flatten(1, 2) + vit.pos_embed  # step by step, no prefix
        means = []
        for block in vit.blocks:
            tokens = block(tokens)
            means.append(vit.norm(tokens).mean(dim=1))
    torch.testing.assert_close(last_pool, means[-1])
    torch.testing.assert_close(concat_pool, torch.cat(means, dim=1))
    torch.testing.assert_close(default, last_pool, rtol=0, atol=0)


def test_without_class_token_the_final_norm_is_applied_and_every_parameter_is_used():
    """The tokens go through a LayerNorm before the mean (no norm left unused after it, which
    would stop a multi-process run: DDP finds a parameter without a gradient)."""
    trunk = make_model(USE_CLASS_TOKEN=False).trunk.train()
    assert isinstance(trunk.vit.norm, torch.nn.LayerNorm)
    (tokens,) = trunk(images(), ["lastBLK"])
    # LayerNorm at its initial weight 1 and bias 0: each token has mean 0 and variance 1
    torch.testing.assert_close(tokens.mean(-1), torch.zeros(tokens.shape[:2]), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(tokens.var(-1, unbiased=False), torch.ones(tokens.shape[:2]),
                               atol=1e-3, rtol=0)
    trunk(images(), ["lastPOOL"])[0].square().sum().backward()
    unused = [name for name, p in trunk.named_parameters() if p.grad is None]
    assert not unused, unused


@pytest.mark.parametrize("layer", ["lastCLS", "concatCLS4"])
def test_without_class_token_cls_outputs_are_refused(layer):
    trunk = make_model(USE_CLASS_TOKEN=False).trunk
    with pytest.raises(ValueError, match=rf"\['{layer}'\] read the class token, and {KEY}."
                                         r"USE_CLASS_TOKEN=false builds none: use lastPOOL, "
                                         r"concatPOOL4"):
        trunk(images(), [layer])


def test_without_class_token_linear_eval_on_named_pool_layer():
    pool_map = [["concatPOOL4", ["Identity", []]], ["lastPOOL", ["Identity", []]]]
    cfg = vit_cfg(heads=[["eval_mlp", {"in_channels": 4 * D, "dims": [4 * D, 10]}],
                         ["eval_mlp", {"in_channels": D, "dims": [D, 10]}]],
                  USE_CLASS_TOKEN=False)
    cfg.FEATURE_EVAL_SETTINGS.update(EVAL_MODE_ON=True, FREEZE_TRUNK_ONLY=True,
                                     EXTRACT_TRUNK_FEATURES_ONLY=True,
                                     LINEAR_EVAL_FEAT_POOL_OPS_MAP=pool_map)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    x = images(4)
    with torch.no_grad():
        layers = model.extract_layers(x)
        expected = model.trunk(x, ["concatPOOL4", "lastPOOL"])
    assert list(layers) == ["concatPOOL4", "lastPOOL"]
    torch.testing.assert_close(layers["concatPOOL4"], expected[0])
    torch.testing.assert_close(layers["lastPOOL"], expected[1])


def test_conv_stem_replaces_the_patchify_layer():
    """HYBRID.CONV_STEM [8, 16, 16] with 4x4 patches: two stride-2 and one stride-1 3x3
    conv-BN-ReLU layers and a 1x1 conv to D, then the ViT as before (computed by hand)."""
    trunk = make_model(HYBRID={"CONV_STEM": [8, 16, 16]}).trunk.eval()
    convs = [m for m in trunk.vit.patch_embed.proj if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in trunk.vit.patch_embed.proj if isinstance(m, torch.nn.BatchNorm2d)]
    x = images()
    h = x
    for conv, norm, stride in zip(convs, norms, (2, 2, 1)):
        h = F.conv2d(h, conv.weight, None, stride=stride, padding=1)
        h = F.relu(F.batch_norm(h, norm.running_mean, norm.running_var, norm.weight, norm.bias,
                                False, 0.0, norm.eps))
    h = F.conv2d(h, convs[-1].weight, convs[-1].bias)
    assert h.shape == (3, D, 4, 4) and len(convs) == 4
    vit = trunk.vit
    tokens = torch.cat([vit.cls_token.expand(3, -1, -1), h.flatten(2).transpose(1, 2)], dim=1)
    tokens = tokens + vit.pos_embed
    for block in vit.blocks:
        tokens = block(tokens)
    with torch.no_grad():
        (cls,) = trunk(x, ["lastCLS"])
    torch.testing.assert_close(cls, vit.norm(tokens)[:, 0])


@pytest.mark.parametrize("overrides, message", [
    (dict(PATCH_SIZE=3, IMAGE_SIZE=15), "power of 2"),
    (dict(HYBRID={"CONV_STEM": [8]}), "at least log2"),
])
def test_conv_stem_refuses_a_stride_it_cannot_reach(overrides, message):
    overrides.setdefault("HYBRID", {"CONV_STEM": [8, 16]})
    with pytest.raises(ValueError, match=message):
        make_model(**overrides)


def test_attention_runs_through_torchs_fused_kernel():
    # timm's Attention is replaced by the trunks' shared one, which always calls
    # torch.nn.functional.scaled_dot_product_attention (tests/test_fused_attention.py counts the
    # calls), whatever TIMM_FUSED_ATTN says; timm's parameter names stay
    from ssl_engine.models.trunks.transformer_parts import Attention

    trunk = make_model().trunk
    assert all(type(block.attn) is Attention for block in trunk.vit.blocks)
    assert {"vit.blocks.0.attn.qkv.weight", "vit.blocks.0.attn.proj.bias"} <= set(
        trunk.state_dict())
