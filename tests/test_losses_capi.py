"""CAPI: ``capi_loss`` and ``capi_head`` against lightly 1.6 (``CAPILoss``, its positionwise
Sinkhorn-Knopp, ``CAPIProjectionHead`` and ``CAPIPredictorTIMM``) on the same inputs and
weights, values and gradients to 1e-5."""
import pytest
import torch
from lightly.loss import CAPILoss as LightlyCAPILoss
from lightly.loss.capi_loss import sinkhorn_knopp
from lightly.models.modules import CAPIPredictorTIMM
from lightly.models.modules.heads import CAPIProjectionHead

from ssl_engine.losses import CAPILoss
from ssl_engine.losses.capi_loss import positionwise_assignments
from ssl_engine.models.heads.capi_head import CAPIHead, masked_positions
from ssl_engine.models.trunks.token_gather import visible_positions

DIM, CLUSTERS, GRID, BATCH, MASKED = 32, 16, (4, 4), 6, 10


def randn(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-5)


def random_masks(seed: int) -> torch.Tensor:
    """[BATCH, h, w] masks of MASKED patches each (True: masked)."""
    generator = torch.Generator().manual_seed(seed)
    patches = GRID[0] * GRID[1]
    order = torch.stack([torch.randperm(patches, generator=generator) for _ in range(BATCH)])
    return (order < MASKED).reshape(BATCH, *GRID)


def capi_head(depth: int = 2) -> CAPIHead:
    torch.manual_seed(0)
    return CAPIHead(in_dim=DIM, num_clusters=CLUSTERS, depth=depth, num_heads=4)


def lightly_predictor_like(head: CAPIHead) -> CAPIPredictorTIMM:
    """lightly's predictor holding ``head``'s predictor weights."""
    theirs = CAPIPredictorTIMM(embed_dim=DIM, grid_size=GRID, depth=len(head.predictor.blocks),
                               num_heads=4)
    names = {"q": "to_query", "kv": "to_key_value", "proj": "projection", "mlp.fc1": "mlp.0",
             "mlp.fc2": "mlp.2"}
    state = {}
    for name, value in head.predictor.state_dict().items():
        for ours, lightly in names.items():
            name = name.replace(f".{ours}.", f".{lightly}.")
        state[name] = value
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and all(key.startswith("rope.") for key in missing)
    return theirs


def test_positionwise_sinkhorn_matches_lightly():
    logits = randn(BATCH, 16, CLUSTERS, seed=1, scale=2.0)
    ours = positionwise_assignments(logits, temperature=0.06, iterations=3)
    assert_same(ours, sinkhorn_knopp(logits / 0.06, iterations=3))
    assert_same(ours.sum(dim=-1), torch.ones(BATCH, 16))


def test_masked_positions_are_the_complement_of_the_visible_ones():
    mask = random_masks(2)
    masked = masked_positions(mask, MASKED)
    visible = visible_positions(mask, MASKED)
    assert masked.shape == (BATCH, MASKED)
    assert bool(mask.flatten(1).gather(1, masked).all())
    assert not bool(mask.flatten(1).gather(1, visible).any())
    assert bool((masked.diff(dim=1) > 0).all())  # grid order


def test_predictor_matches_lightly_values_and_gradients():
    # in float64: the mask token's gradient sums every query's (about 170 in size), where
    # float32's rounding in another order of summation alone is 5e-5
    head = capi_head().double()
    theirs = lightly_predictor_like(head).double()
    mask = random_masks(3)
    visible = visible_positions(mask, MASKED)
    masked = masked_positions(mask, MASKED)
    context = randn(BATCH, visible.shape[1], DIM, seed=4).double()
    mine, their_context = context.clone().requires_grad_(), context.clone().requires_grad_()
    got = head.predictor(mine, visible, masked, GRID)
    want = theirs(their_context, visible, masked)
    assert_same(got, want)
    weights = randn(*got.shape, seed=5).double()
    (got * weights).sum().backward()
    (want * weights).sum().backward()
    assert_same(mine.grad, their_context.grad)
    assert_same(head.predictor.mask_token.grad, theirs.mask_token.grad)
    assert_same(head.predictor.blocks[0].kv.weight.grad, theirs.blocks[0].to_key_value.weight.grad)
    assert_same(head.predictor.blocks[1].mlp.fc1.weight.grad, theirs.blocks[1].mlp[0].weight.grad)


def test_head_scores_the_masked_patches_like_lightlys_predictor_and_projection():
    head = capi_head()
    predictor = lightly_predictor_like(head)
    projection = CAPIProjectionHead(input_dim=DIM, num_clusters=CLUSTERS, weight_norm=True)
    with torch.no_grad():
        projection.layer.weight_v.copy_(head.prototypes.weight)
    mask = random_masks(6)
    tokens = randn(BATCH, 1 + 16 - MASKED, DIM, seed=7)  # a class token, then the visible
    got = head(tokens, mask=mask)
    want = projection(predictor(tokens[:, 1:], visible_positions(mask, MASKED),
                                masked_positions(mask, MASKED)))
    assert got.shape == (BATCH, MASKED, CLUSTERS)
    assert_same(got, want)
    got.sum().backward()
    want.sum().backward()
    assert_same(head.prototypes.weight.grad, projection.layer.weight_v.grad)


def bound_loss(head: CAPIHead, teacher_tokens: torch.Tensor) -> CAPILoss:
    """capi_loss bound to ``head`` with ``teacher_tokens`` as its target network's output."""
    loss = CAPILoss(teacher_temperature=0.06, student_temperature=0.12,
                    clustering_temperature=0.12, sinkhorn_iterations=3, output_dim=CLUSTERS)
    loss._head = [head]
    loss.target_output = teacher_tokens
    return loss


def test_loss_matches_lightly_values_and_gradients():
    head = capi_head(depth=1)
    clustering = CAPIProjectionHead(input_dim=DIM, num_clusters=CLUSTERS, bias=True)
    with torch.no_grad():
        clustering.layer.weight.copy_(head.clustering.weight)
        clustering.layer.bias.copy_(randn(CLUSTERS, seed=8, scale=0.1))
        head.clustering.bias.copy_(clustering.layer.bias)
    mask = random_masks(9)
    teacher = randn(BATCH, 1 + 16, DIM, seed=10)  # class token first
    scores = randn(BATCH, MASKED, CLUSTERS, seed=11, scale=0.5)
    mine, their_scores = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    loss = bound_loss(head, teacher)
    got = loss(mine, mask)

    criterion = LightlyCAPILoss(teacher_temperature=0.06, student_temperature=0.12,
                                sinkhorn_iterations=3)
    teacher_logits = clustering(teacher[:, 1:])
    prediction = criterion(teacher_logits, their_scores, masked_positions(mask, MASKED))
    clustering_term = criterion(teacher_logits, teacher_logits)
    assert_same(loss.loss_terms["prediction"], prediction)
    assert_same(loss.loss_terms["clustering"], clustering_term)
    assert_same(got, prediction + clustering_term)
    got.backward()
    (prediction + clustering_term).backward()
    assert_same(mine.grad, their_scores.grad)
    assert_same(head.clustering.weight.grad, clustering.layer.weight.grad)
    assert_same(head.clustering.bias.grad, clustering.layer.bias.grad)
    assert head.prototypes.weight.grad is None  # the loss trains the head's clustering alone
    statistics = loss.collapse_statistics()
    assert 0 < float(statistics["teacher_entropy"]) < 1


def test_loss_refuses_scores_that_do_not_fit_the_masks():
    head = capi_head(depth=1)
    loss = bound_loss(head, randn(BATCH, 17, DIM, seed=12))
    with pytest.raises(ValueError, match="capi_loss expects scores"):
        loss(randn(BATCH, 16, CLUSTERS, seed=13), random_masks(14))
    with pytest.raises(ValueError, match="needs the patch masks"):
        loss(randn(BATCH, MASKED, CLUSTERS, seed=13), None)
