"""I-JEPA and AIM against lightly 1.6 on the same inputs and weights (values and gradients to
1e-5): I-JEPA's predictor and its smooth-L1 loss on the layer-normalised target blocks
(lightly's IJEPAPredictorTIMM, apply_masks), AIM's prefix-causal ViT (lightly's
MaskedCausalVisionTransformer), its prediction head (AIMPredictionHead) and its next-patch loss
(lightly's patchify and normalize_mean_var under an MSE); then the masks of the data pipeline,
the ijepa_collator and the ViT's context path."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from lightly.models import utils as lightly_utils
from lightly.models.modules import AIMPredictionHead as LightlyAIMHead
from lightly.models.modules import MaskedCausalVisionTransformer
from lightly.models.modules.ijepa_timm import IJEPAPredictorTIMM

from ssl_engine.data import build_collator
from ssl_engine.data.transforms.ijepa_aim_masking import MultiBlockMasking, RandomPrefixMasking
from ssl_engine.losses import AIMLoss, IJEPALoss
from ssl_engine.models.heads.aim_head import AIMPredictionHead
from ssl_engine.models.heads.ijepa_predictor import IJEPAPredictor
from test_models_vit import D, images, make_model

DIM, GRID = 16, 4  # the encoder's width; a 4x4 patch grid


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-5)


def max_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max())


def grads(module: torch.nn.Module):
    return {name: param.grad for name, param in module.named_parameters() if param.grad is not None}


# ---------------------------------------------------------------- I-JEPA
def predictor_pair():
    torch.manual_seed(0)
    ours = IJEPAPredictor(in_dim=DIM, num_patches=GRID * GRID, predictor_dim=12, depth=2,
                          num_heads=3)
    theirs = IJEPAPredictorTIMM(num_patches=GRID * GRID, depth=2, mlp_dim=DIM,
                                predictor_embed_dim=12, num_heads=3)
    with torch.no_grad():
        ours.mask_token.normal_()  # not zero: its gradient and use are compared too
    state = {("decoder." + key if key.startswith(("blocks.", "norm.")) else key): value
             for key, value in ours.state_dict().items()}
    state = {key.replace("embed.", "predictor_embed.").replace("proj.", "predictor_proj.")
             if key.startswith(("embed.", "proj.")) else key: value
             for key, value in state.items()}
    state["decoder.mask_token"] = state.pop("mask_token").view(1, 1, -1)
    state["decoder.pos_embed"] = ours.position.unsqueeze(0)
    theirs.load_state_dict(state)
    return ours, theirs


def ijepa_inputs(batch=3):
    context = torch.stack([torch.randperm(GRID * GRID, generator=torch.Generator().manual_seed(s))
                           [:7].sort().values for s in range(batch)])
    targets = torch.stack([torch.stack([
        torch.randperm(GRID * GRID, generator=torch.Generator().manual_seed(100 + 4 * s + m))[:5]
        for m in range(2)]) for s in range(batch)])  # [B, M=2, Kt=5]
    return context, targets


def test_ijepa_predictor_and_loss_match_lightly():
    ours, theirs = predictor_pair()
    context, targets = ijepa_inputs()
    batch, blocks, count = targets.shape
    tokens = randn(batch, 1 + context.shape[1], DIM, seed=1)  # a class token first: dropped
    full = randn(batch, GRID * GRID, DIM, seed=2)  # the target encoder's last block
    mine, theirs_in = tokens.clone().requires_grad_(True), tokens[:, 1:].clone().requires_grad_(True)

    prediction = ours(mine, context_index=context, target_index=targets)
    loss_fn = IJEPALoss(patch_size=4)
    loss_fn.target_network = SimpleNamespace(trunk=lambda x, keys: [torch.cat(
        [torch.zeros(batch, 1, DIM), full], dim=1)])
    loss_fn.target_output = loss_fn.run_target(
        {"images": torch.zeros(batch, 3, 16, 16), "target_index": targets}, None)
    loss = loss_fn(prediction)

    masks = [targets[:, m] for m in range(blocks)]
    expected_prediction = theirs(theirs_in, [context], masks)  # [M * B, Kt, D], block-major
    normed = F.layer_norm(full, (DIM,))
    expected = F.smooth_l1_loss(expected_prediction, lightly_utils.apply_masks(normed, masks))
    assert_same(prediction.transpose(0, 1).reshape(blocks * batch, count, DIM),
                expected_prediction)
    assert_same(loss, expected)
    loss.backward()
    expected.backward()
    assert_same(mine.grad[:, 1:], theirs_in.grad)
    assert not mine.grad[:, 0].any()
    theirs_grads = grads(theirs)
    for name, grad in grads(ours).items():
        key = {"mask_token": "decoder.mask_token"}.get(name, name)
        if key.startswith(("blocks.", "norm.")):
            key = "decoder." + key
        elif key.startswith(("embed.", "proj.")):
            key = "predictor_" + key
        assert_same(grad, theirs_grads[key].view_as(grad))


def test_ijepa_momentum_rises_linearly_to_its_end():
    loss = IJEPALoss(momentum=0.996, momentum_end=1.0)
    assert [loss.momentum_at(k, 4) for k in (0, 2, 4, 8)] == pytest.approx(
        [0.996, 0.998, 1.0, 1.0])


# ---------------------------------------------------------------- AIM
def test_aim_prefix_causal_vit_matches_lightly():
    model = make_model(USE_CLASS_TOKEN=False, MASKED_IMAGE_MODELING={"NAME": "aim"})
    trunk = model.trunk
    reference = MaskedCausalVisionTransformer(
        img_size=16, patch_size=4, embed_dim=D, depth=4, num_heads=2, mlp_ratio=2.0,
        qkv_bias=True, num_classes=0, class_token=False, global_pool="avg", fc_norm=False,
        dynamic_img_size=True)  # fc_norm=False: the final norm on the tokens, as the trunk
    reference.load_state_dict(trunk.vit.state_dict())
    x = images()
    prefix = torch.tensor([[1], [7], [15]])
    causal = torch.arange(16).expand(3, 16) >= prefix  # True: after the prefix
    mine, theirs = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    (got,) = trunk(mine, ["lastBLK"], mask=causal.view(3, 4, 4))
    want = reference.forward_features(theirs, mask=causal)
    assert_same(got, want)
    weights = randn(*got.shape, seed=3)
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    assert_same(mine.grad, theirs.grad)
    # a later patch never changes an earlier causal token's output
    changed = x.clone()
    changed[2, :, 12:, 12:] += 1.0  # the last patch of image 2 (prefix 15: it is causal)
    (again,) = trunk(changed, ["lastBLK"], mask=causal.view(3, 4, 4))
    assert torch.allclose(again[2, :15], got[2, :15].detach(), atol=1e-6)
    assert not torch.allclose(again[2, 15], got[2, 15].detach())


def test_aim_head_and_loss_match_lightly():
    torch.manual_seed(0)
    ours = AIMPredictionHead(in_dim=DIM, output_dim=48, hidden_dim=24, num_blocks=2)
    theirs = LightlyAIMHead(input_dim=DIM, output_dim=48, hidden_dim=24, num_blocks=2)
    theirs.load_state_dict({key.replace(".fc", ".mlp.fc"): value
                            for key, value in ours.state_dict().items()})
    tokens = randn(3, GRID * GRID, DIM, seed=4)
    pixels = randn(3, 3, 16, 16, seed=5)
    prefix = torch.tensor([[1], [5], [15]])
    causal = torch.arange(16).expand(3, 16) >= prefix
    mine, theirs_in = tokens.clone().requires_grad_(True), tokens.clone().requires_grad_(True)
    prediction = ours(mine, mask=causal.view(3, 4, 4))
    loss = AIMLoss(norm_pix_loss=True, patch_size=4)(
        prediction, {"global_views": pixels, "mask": causal.view(3, 4, 4)})
    expected_prediction = theirs(theirs_in)
    patches = lightly_utils.normalize_mean_var(lightly_utils.patchify(pixels, 4), dim=-1)
    predicted = causal[:, 1:]  # the next patch of every token, after the prefix
    expected = F.mse_loss(expected_prediction[:, :-1][predicted], patches[:, 1:][predicted])
    assert_same(prediction, expected_prediction)
    assert_same(loss, expected)
    loss.backward()
    expected.backward()
    assert_same(mine.grad, theirs_in.grad)
    theirs_grads = grads(theirs)
    for name, grad in grads(ours).items():
        assert_same(grad, theirs_grads[name.replace(".fc", ".mlp.fc")])


# ---------------------------------------------------------------- masks and the collator
def test_prefix_masks_keep_a_prefix_and_a_predicted_patch():
    torch.manual_seed(0)
    masks = RandomPrefixMasking(patch_size=4)([torch.zeros(3, 16, 16)] * 200).masks
    prefixes = [int((~mask.flatten()).sum()) for mask in masks]
    assert min(prefixes) == 1 and max(prefixes) == 15
    assert all(not mask.flatten()[:p].any() and mask.flatten()[p:].all()
               for mask, p in zip(masks, prefixes))


def test_multi_block_masks_and_the_collator():
    torch.manual_seed(0)
    transform = MultiBlockMasking(patch_size=4, num_targets=4, min_keep=3)
    views = [torch.randn(3, 56, 56) for _ in range(5)]  # a 14x14 grid
    masks = transform(views).masks
    for mask in masks:
        assert mask.shape == (5, 14, 14)
        assert not (mask[0] & mask[1:].any(dim=0)).any()  # no target patch in the context
        assert int(mask[0].sum()) > 3
        for block in mask[1:]:  # a whole rectangle of 15-20% of the patches (rounded)
            rows, cols = block.any(dim=1).sum(), block.any(dim=0).sum()
            assert int(block.sum()) == int(rows * cols) and 20 <= int(block.sum()) <= 50
    samples = [{"data": [view], "label": [i], "data_idx": i, "data_valid": True, "mask": [mask]}
               for i, (view, mask) in enumerate(zip(views, masks))]
    batch = build_collator("ijepa_collator")(samples)
    inputs = batch["input"]
    context, targets = inputs["context_index"], inputs["target_index"]
    assert inputs["images"].shape == (5, 3, 56, 56)
    assert context.shape[1] == min(int(m[0].sum()) for m in masks)
    assert targets.shape[:2] == (5, 4)
    assert targets.shape[2] == min(int(m[1:].flatten(1).sum(dim=1).min()) for m in masks)
    for mask, keep, blocks in zip(masks, context, targets):
        assert mask[0].flatten()[keep].all() and bool((keep.diff() > 0).all())
        assert all(block_mask.flatten()[b].all() for block_mask, b in zip(mask[1:], blocks))


def test_the_vit_context_path_encodes_the_listed_patches_only():
    model = make_model(USE_CLASS_TOKEN=False).eval()
    x = images()
    (whole,) = model.trunk(x, ["lastBLK"])
    order = torch.arange(16).expand(3, 16)
    (same,) = model.trunk(x, ["lastBLK"], context_index=order)
    assert_same(same, whole)
    shuffled = torch.stack([torch.randperm(16) for _ in range(3)])
    (permuted,) = model.trunk(x, ["lastBLK"], context_index=shuffled)  # attention is a set op
    assert_same(permuted, whole.gather(1, shuffled.unsqueeze(-1).expand(-1, -1, D)))
    part = order[:, :6]
    (context,) = model.trunk(x, ["lastBLK"], context_index=part)
    changed = x.clone()
    changed[:, :, 12:, :] += 1.0  # the last row of patches: outside the context
    (again,) = model.trunk(changed, ["lastBLK"], context_index=part)
    assert context.shape == (3, 6, D) and torch.allclose(again, context, atol=1e-6)
