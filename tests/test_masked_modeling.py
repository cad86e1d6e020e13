"""Masked image modelling's pieces below the loss: the masks of the data pipeline (ratio,
replay by sample and epoch), the masking collator, the ViT's iBOT mask token and MAE's
visible-only encoder (against timm's own forward), the model fed named inputs
(MULTI_INPUT_HEAD_MAPPING), ibot_head and mae_decoder."""
import copy

import pytest
import torch

import ssl_engine.losses  # noqa: F401  (the losses derive their settings: derive_config)
from ssl_engine.config import load_config
from ssl_engine.data import build_collator, build_dataset
from ssl_engine.data.transforms.masking import MaskedImageModeling, RandomPatchMasking
from ssl_engine.models import build_model
from test_data_sources import make_cfg
from test_models_vit import D, images, timm_copy, vit_cfg

MAE_TRANSFORMS = [{"name": "RandomResizedCrop", "size": 16}, {"name": "ToTensor"},
                  {"name": "RandomPatchMasking", "mask_ratio": 0.75, "patch_size": 4}]
IBOT_TRANSFORMS = [
    {"name": "ImgPilToMultiCrop", "total_num_crops": 3, "num_crops": [2, 1],
     "size_crops": [16, 8], "crop_scales": [[0.3, 1.0], [0.1, 0.3]]},
    {"name": "ToTensor"},
    {"name": "MaskedImageModeling", "pred_ratio_mean": [0.0, 0.3],
     "pred_ratio_var": [0.0, 0.2], "patch_size": 4},
]


def dataset(transforms, num_samples=8, seed=7):
    cfg = make_cfg(DATA_SOURCES=["synthetic"], TRANSFORMS=transforms,
                   SYNTHETIC={"NUM_SAMPLES": num_samples, "IMAGE_SIZE": 20, "NUM_CLASSES": 3})
    cfg.SEED_VALUE = seed
    return build_dataset(cfg, "TRAIN")


# ---------------------------------------------------------------- masks of the data pipeline
def test_mae_masks_hide_the_ratio_and_replay_by_sample_and_epoch():
    data = dataset(MAE_TRANSFORMS)
    masks = [data[i]["mask"][0] for i in range(len(data))]
    assert all(m.shape == (4, 4) and m.dtype == torch.bool and int(m.sum()) == 12 for m in masks)
    assert len({tuple(m.flatten().tolist()) for m in masks}) > 4  # each image its own
    # the same sample in the same epoch, read again (as a resumed run does): the same mask
    assert torch.equal(dataset(MAE_TRANSFORMS)[3]["mask"][0], masks[3])
    data.set_epoch(1)
    assert not torch.equal(data[3]["mask"][0], masks[3])
    assert torch.equal(data[(0, 3)]["mask"][0], masks[3])  # (epoch, index) from the sampler


def test_ibot_masks_choose_a_ratio_per_view_and_keep_patches_whole_in_blocks():
    torch.manual_seed(0)
    transform = MaskedImageModeling([0.0, 0.3], [0.0, 0.2], patch_size=4)
    views = [torch.zeros(3, 32, 32) for _ in range(200)]
    counts = [int(m.sum()) for m in transform(views).masks]  # 64 patches per view
    unmasked = sum(c == 0 for c in counts)
    assert 60 < unmasked < 140  # ratio 0 is one of the two choices
    assert all(c <= int(0.5 * 64) for c in counts)
    assert sum(c > 0 for c in counts) > 60 and max(counts) > 20
    # patch by patch: exactly the drawn share
    exact = MaskedImageModeling(0.5, 0.0, patch_size=4, pred_shape="rand")
    assert [int(m.sum()) for m in exact(views[:3]).masks] == [32, 32, 32]
    with pytest.raises(ValueError, match="leaves"):
        MaskedImageModeling(0.9, 0.2)


def test_masking_collator_names_the_inputs_and_the_target():
    data = dataset(IBOT_TRANSFORMS)
    samples = [data[i] for i in range(4)]
    collate = build_collator("ibot_multicrop_masking_collator", {})
    batch = collate(samples)
    inputs = batch["input"]
    assert set(inputs) == {"global_views", "local_views", "mask"}
    assert inputs["global_views"].shape == (8, 3, 16, 16)
    assert inputs["local_views"].shape == (4, 3, 8, 8)
    # view-major: rows 0-3 are view 0 of the 4 samples, rows 4-7 their view 1
    assert torch.equal(inputs["mask"][5], samples[1]["mask"][1])
    assert torch.equal(batch["target"], inputs["mask"])
    assert batch["data_idx"].tolist() == [0, 1, 2, 3] * 3
    mae = build_collator("ibot_multicrop_masking_collator",
                         {"input_keys": ["global_views", "mask"],
                          "target_keys": ["global_views", "mask"]})([data[0], data[1]])
    assert set(mae["target"]) == {"global_views", "mask"}
    assert set(mae["input"]) == {"global_views", "mask"}


# ---------------------------------------------------------------- the ViT with a mask
def grid_mask(rows, seed, count=12):
    generator = torch.Generator().manual_seed(seed)
    order = torch.stack([torch.randperm(16, generator=generator) for _ in range(rows)])
    return torch.zeros(rows, 16, dtype=torch.bool).scatter(1, order[:, :count], True).view(
        rows, 4, 4)


def test_ibot_mask_token_replaces_the_embedding_of_masked_patches():
    torch.manual_seed(0)
    trunk = build_model(vit_cfg(MASKED_IMAGE_MODELING={"NAME": "ibot"})).trunk.eval()
    torch.nn.init.normal_(trunk.mask_token)
    reference = timm_copy(trunk)
    x, mask = images(), grid_mask(3, seed=4, count=5)

    def masked_embedding(module, args, output):  # timm's forward, the embeddings replaced
        return torch.where(mask.unsqueeze(-1), trunk.mask_token.view(1, 1, 1, D), output)

    reference.patch_embed.register_forward_hook(masked_embedding)
    with torch.no_grad():
        tokens, cls = trunk(x, ["lastBLK", "lastCLS"], mask=mask)
        expected = reference.forward_features(x)
        plain = trunk(x, ["lastCLS"])[0]
    torch.testing.assert_close(tokens, expected)
    torch.testing.assert_close(cls, expected[:, 0])
    assert not torch.allclose(cls, plain, atol=1e-3)
    with torch.no_grad():  # no mask: every token of timm's plain forward
        torch.testing.assert_close(trunk(x, ["lastBLK"])[0], timm_copy(trunk).forward_features(x))


def test_mae_encoder_sees_only_the_visible_patches():
    torch.manual_seed(0)
    trunk = build_model(vit_cfg(MASKED_IMAGE_MODELING={"NAME": "mae"})).trunk.eval()
    reference = timm_copy(trunk)
    x, mask = images(), grid_mask(3, seed=5)
    with torch.no_grad():
        (tokens,) = trunk(x, ["lastBLK"], mask=mask)
        # timm's pieces: embeddings with positions, the visible ones gathered by index
        full = reference._pos_embed(reference.patch_embed(x))
        keep = (~mask.flatten(1)).nonzero()[:, 1].view(3, 4) + 1
        index = torch.cat([torch.zeros(3, 1, dtype=torch.long), keep], dim=1)
        gathered = full.gather(1, index.unsqueeze(-1).expand(-1, -1, D))
        expected = reference.norm(reference.blocks(gathered))
        # the pixels of masked patches do not matter
        hidden = x.clone()
        pixels = mask.repeat_interleave(4, 1).repeat_interleave(4, 2).unsqueeze(1).expand_as(x)
        hidden[pixels] = 100.0
        (again,) = trunk(hidden, ["lastBLK"], mask=mask)
    assert tokens.shape == (3, 1 + 4, D)
    torch.testing.assert_close(tokens, expected)
    torch.testing.assert_close(again, tokens)
    with pytest.raises(ValueError, match="as many masked patches"):
        uneven = mask.clone()
        uneven[0, 0, 0] = ~uneven[0, 0, 0]
        trunk(x, ["lastBLK"], mask=uneven)


def test_a_mask_needs_masked_image_modeling_on():
    trunk = build_model(vit_cfg()).trunk
    with pytest.raises(ValueError, match="MASKED_IMAGE_MODELING.NAME is empty"):
        trunk(images(), ["lastBLK"], mask=grid_mask(3, seed=1))


# ---------------------------------------------------------------- the model, the heads
IBOT_HEAD = ("ibot_head", {"in_dim": D, "out_dim": 16, "patch_out_dim": 8, "shared_head": False,
                           "hidden_dim": 32, "bottleneck_dim": 8})
MAPPING = [["global_views", {"feat_names": ["lastBLK"], "additional_keys": ["mask"]}],
           ["local_views", {"feat_names": ["lastCLS"]}]]


def ibot_model(**head):
    cfg = vit_cfg([(IBOT_HEAD[0], {**IBOT_HEAD[1], **head})],
                  MASKED_IMAGE_MODELING={"NAME": "ibot"})
    cfg.MULTI_INPUT_HEAD_MAPPING = copy.deepcopy(MAPPING)
    torch.manual_seed(0)
    return build_model(cfg).eval()


def masked_multicrop_scores(model):
    """4 masked global views (6 of 16 patches each) and 2 local views of 8 pixels, and the
    model's outputs on them (no gradients)."""
    glob, local, mask = images(4), images(2, size=8, seed=3), grid_mask(4, seed=2, count=6)
    with torch.no_grad():
        outputs = model({"global_views": glob, "local_views": local, "mask": mask})
    return glob, local, mask, outputs


def test_named_inputs_run_the_trunk_per_mapping_entry_then_ibot_head():
    model = ibot_model()
    glob, local, mask, (cls_scores, patch_scores) = masked_multicrop_scores(model)
    with torch.no_grad():
        tokens = model.trunk(glob, ["lastBLK"], mask=mask)[0]
        local_cls = model.trunk(local, ["lastCLS"])[0]
        head = model.heads[0]
        expected_cls = head.prototypes0(head.bottleneck(torch.cat([tokens[:, 0], local_cls])))
        expected_patch = head.prototypes1(head.bottleneck(tokens[:, 1:].reshape(-1, D)))
        # the teacher's input: the global views alone, no mask
        teacher_cls, _ = model({"global_views": glob})
    assert cls_scores.shape == (6, 16) and patch_scores.shape == (4, 16, 8)
    torch.testing.assert_close(cls_scores, expected_cls)
    torch.testing.assert_close(patch_scores, expected_patch.view(4, 16, 8))
    with torch.no_grad():
        plain = head.prototypes0(head.bottleneck(model.trunk(glob, ["lastCLS"])[0]))
    torch.testing.assert_close(teacher_cls, plain)
    shared = ibot_model(shared_head=True, patch_out_dim=16)
    assert shared.heads[0].prototypes1 is shared.heads[0].prototypes0
    names = [name for name, _ in shared.named_parameters(remove_duplicate=False)]
    assert "heads.0.prototypes1.weight_v" in names  # VISSL's configs freeze it by that name
    with pytest.raises(ValueError, match="patch_out_dim=8 must equal out_dim=16"):
        ibot_model(shared_head=True)


def test_ibot_head_without_a_class_token_scores_the_mean_of_the_patches():
    cfg = vit_cfg([(IBOT_HEAD[0], {**IBOT_HEAD[1], "pool_patches": True})],
                  MASKED_IMAGE_MODELING={"NAME": "ibot"}, USE_CLASS_TOKEN=False)
    cfg.MULTI_INPUT_HEAD_MAPPING = [MAPPING[0], ["local_views", {"feat_names": ["lastPOOL"]}]]
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    glob, local, mask, (cls_scores, patch_scores) = masked_multicrop_scores(model)
    with torch.no_grad():
        tokens = model.trunk(glob, ["lastBLK"], mask=mask)[0]  # [4, 16, D]: patches only
        local_pool = model.trunk(local, ["lastPOOL"])[0]
        head = model.heads[0]
        rows = torch.cat([tokens.mean(dim=1), local_pool])
        expected_cls = head.prototypes0(head.bottleneck(rows))
        expected_patch = head.prototypes1(head.bottleneck(tokens.reshape(-1, D)))
        # the teacher's unmasked global views: the scores of the evaluated lastPOOL
        teacher_cls, _ = model({"global_views": glob})
        plain = head.prototypes0(head.bottleneck(model.trunk(glob, ["lastPOOL"])[0]))
    assert tokens.shape == (4, 16, D) and patch_scores.shape == (4, 16, 8)
    torch.testing.assert_close(cls_scores, expected_cls)
    torch.testing.assert_close(patch_scores, expected_patch.view(4, 16, 8))
    torch.testing.assert_close(teacher_cls, plain)


def test_ibot_separate_head_gives_the_patches_a_head_of_their_own():
    model = ibot_model(separate_head=True)
    head = model.heads[0]
    glob, local, mask, (cls_scores, patch_scores) = masked_multicrop_scores(model)
    with torch.no_grad():
        tokens = model.trunk(glob, ["lastBLK"], mask=mask)[0]
        local_cls = model.trunk(local, ["lastCLS"])[0]
        expected_cls = head.prototypes0(head.bottleneck(torch.cat([tokens[:, 0], local_cls])))
        patch_head = head.patch_head
        expected_patch = patch_head.prototypes0(patch_head.bottleneck(tokens[:, 1:].reshape(-1, D)))
    torch.testing.assert_close(cls_scores, expected_cls)
    torch.testing.assert_close(patch_scores, expected_patch.view(4, 16, 8))
    assert head.prototypes1 is patch_head.prototypes0
    # the patch loss reaches the patch head only, the class loss the class head only
    model.train()
    cls_scores, patch_scores = model({"global_views": glob, "mask": mask})
    patch_scores.sum().backward()
    assert all(p.grad is None for p in head.mlp.parameters())
    assert all(p.grad is not None for p in patch_head.mlp.parameters())
    with pytest.raises(ValueError, match="exclude each other"):
        ibot_model(separate_head=True, shared_head=True, patch_out_dim=16)


def test_ibot_head_on_a_vit_without_a_class_token_must_pool_the_patches():
    # else the first patch token would silently be read as the class token
    no_class_token = "config.MODEL.TRUNK.VISION_TRANSFORMERS.USE_CLASS_TOKEN=false"
    with pytest.raises(ValueError, match="pool_patches"):
        load_config(["config=test/quick_ibot_synthetic", no_class_token])


def test_mapping_entries_are_checked_when_the_model_is_built():
    cfg = vit_cfg([IBOT_HEAD])
    # PIRL's form pairs each input with a chain of heads: HEAD.PARAMS must hold chains
    cfg.MULTI_INPUT_HEAD_MAPPING = [["global_views", ["lastCLS"]]]
    with pytest.raises(ValueError, match=r"HEAD.PARAMS\[0\] must be a list of heads"):
        build_model(cfg)
    cfg.MULTI_INPUT_HEAD_MAPPING = [["global_views", "lastCLS"]]
    with pytest.raises(ValueError, match=r"MULTI_INPUT_HEAD_MAPPING\[0\] must be"):
        build_model(cfg)
    cfg.MULTI_INPUT_HEAD_MAPPING = [["global_views", {"feat_names": ["res5"]}]]
    with pytest.raises(ValueError, match=r"MULTI_INPUT_HEAD_MAPPING\[0\]: .*no stage"):
        build_model(cfg)


def test_mae_decoder_puts_visible_tokens_back_in_grid_order():
    torch.manual_seed(0)
    cfg = vit_cfg([("mae_decoder", {"in_dim": D, "patch_size": 4, "decoder_dim": 16,
                                    "depth": 1, "num_heads": 2})],
                  MASKED_IMAGE_MODELING={"NAME": "mae"})
    cfg.MULTI_INPUT_HEAD_MAPPING = [MAPPING[0]]
    model = build_model(cfg).eval()
    x, mask = images(), grid_mask(3, seed=6)
    with torch.no_grad():
        (prediction,) = model({"global_views": x, "mask": mask})
    assert prediction.shape == (3, 16, 4 * 4 * 3)
    # the decoder is a transformer without attention masks: permuting the visible tokens of
    # an image (as a wrong scatter would) changes every prediction; checking the scatter
    # directly: the decoder's input sequence holds each visible token at its grid position
    decoder = model.heads[0]
    seen = {}
    decoder.blocks[0].register_forward_pre_hook(lambda m, a: seen.setdefault("x", a[0]))
    with torch.no_grad():
        tokens = model.trunk(x, ["lastBLK"], mask=mask)[0]
        decoder(tokens, mask=mask)
    embedded = decoder.embed(tokens)
    from ssl_engine.models.heads.mae_decoder import sincos_position_embedding
    position = sincos_position_embedding(4, 4, 16)
    for row in range(3):
        visible = (~mask[row].flatten()).nonzero()[:, 0]
        torch.testing.assert_close(seen["x"][row, 1 + visible] - position[visible],
                                   embedded[row, 1:], atol=1e-5, rtol=1e-5)
        hidden = mask[row].flatten().nonzero()[:, 0]
        torch.testing.assert_close(seen["x"][row, 1 + hidden] - position[hidden],
                                   decoder.mask_token[0].expand(len(hidden), -1))


def test_mae_linear_probe_head_is_a_batch_norm_without_scale_and_shift():
    from ssl_engine.models.heads.eval_mlp import EvalMLP

    torch.manual_seed(0)
    head = EvalMLP(8, [8, 3], affine=False, eps=1e-6)
    assert [name for name, _ in head.named_parameters()] == ["mlp.clf.0.weight",
                                                             "mlp.clf.0.bias"]
    features = torch.randn(16, 8) * 5 + 2
    linear = head.mlp.clf[0]
    standardised = (features - features.mean(0)) / (features.var(0, unbiased=False)
                                                     + 1e-6).sqrt()
    torch.testing.assert_close(head(features), standardised @ linear.weight.T + linear.bias)
