"""SwAV: Sinkhorn-Knopp and the swapped-prediction loss against lightly's SwaVLoss, the queue,
the head, and 2 gloo processes against 1 process on the same global batch."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_utils import spawn_ranks
from lightly.loss.swav_loss import SwaVLoss, sinkhorn

from ssl_engine.losses.base import StepContext
from ssl_engine.losses.sinkhorn import distributed_sinkhorn
from ssl_engine.losses.swav_loss import SwAVLoss
from ssl_engine.models.heads.swav_head import SwAVPrototypesHead

DIM, K = 8, 12


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def crop_major(crops):
    """Per-crop [B, ...] tensors -> the model's crop-major batch."""
    return torch.cat(crops)


def test_sinkhorn_matches_lightly_and_balances_prototypes():
    scores = F.normalize(randn(16, DIM, seed=0), dim=1) @ F.normalize(randn(K, DIM, seed=1),
                                                                        dim=1).t()
    q = distributed_sinkhorn(scores, epsilon=0.05, num_iters=3)
    torch.testing.assert_close(q, sinkhorn(scores, iterations=3, epsilon=0.05),
                               rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q.sum(dim=1), torch.ones(16))  # rows are distributions
    # many iterations: every prototype gets the same share of the batch
    balanced = distributed_sinkhorn(scores, epsilon=0.05, num_iters=200)
    torch.testing.assert_close(balanced.sum(dim=0), torch.full((K,), 16 / K), rtol=1e-3,
                               atol=1e-4)
    # scores whose exp overflows float32 (unnormalised prototypes): each prototype's scores
    # are shifted by their maximum, which the normalisation cancels (reference: float64)
    large = scores * 6
    assert not torch.isfinite(sinkhorn(large)).all()
    torch.testing.assert_close(distributed_sinkhorn(large), sinkhorn(large.double()).float(),
                               rtol=1e-4, atol=1e-6)
    assert distributed_sinkhorn(scores, use_double_precision=True).dtype == torch.float64


def far_sample_scores() -> torch.Tensor:
    """Cosines of 8 samples near their prototypes and one far from all of them."""
    near = torch.eye(K)[:8] * 1.8 - 0.9 + randn(8, K, seed=5) * 0.01
    return torch.cat([near, torch.full((1, K), -0.2)]).clamp(-1, 1)


def test_sinkhorn_at_a_low_epsilon_survives_a_sample_far_from_every_prototype():
    # DINOv2's centering at a teacher temperature of 0.01: exp((score - best) / 0.01) of the
    # far sample underflows float32 for every prototype, and plain Sinkhorn-Knopp divides 0/0
    scores = far_sample_scores()
    assert torch.isnan(sinkhorn(scores, iterations=3, epsilon=0.01)).all()
    q = distributed_sinkhorn(scores, epsilon=0.01, num_iters=3)
    expected = distributed_sinkhorn(scores.double(), epsilon=0.01, num_iters=3,
                                    use_double_precision=True)  # no underflow in float64
    torch.testing.assert_close(q, expected.float(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q.sum(dim=1), torch.ones(9))


def multicrop_scores(batch: int, high: int, low: int, seed: int):
    return [randn(batch, K, seed=seed + c).tanh() for c in range(high + low)]


def test_loss_and_gradients_match_lightly_with_multicrop():
    batch, high, low = 5, 2, 3
    crops = multicrop_scores(batch, high, low, seed=10)
    ours = [c.clone().requires_grad_(True) for c in crops]
    theirs = [c.clone().requires_grad_(True) for c in crops]
    embedding = F.normalize(randn(batch * (high + low), DIM, seed=3), dim=1)
    loss_fn = SwAVLoss(embedding_dim=DIM, num_crops=high + low, crops_for_assign=[0, 1],
                       num_prototypes=[K], temperature=0.1, epsilon=0.05, num_iters=3)
    loss = loss_fn([embedding, crop_major(ours)], None)
    expected = SwaVLoss(temperature=0.1, sinkhorn_iterations=3, sinkhorn_epsilon=0.05)(
        theirs[:high], theirs[high:])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    expected.backward()
    for mine, reference in zip(ours, theirs):
        torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-5, atol=1e-7)
    # the named terms (one per assigned crop) add up to the total
    assert set(loss_fn.loss_terms) == {"assign_crop0", "assign_crop1"}
    assert sum(loss_fn.loss_terms.values()).item() == pytest.approx(loss.item(), rel=1e-6)


def test_several_prototype_sets_average_their_losses():
    batch = 4
    first, second = (crop_major(multicrop_scores(batch, 2, 0, seed=s)) for s in (20, 30))
    embedding = F.normalize(randn(2 * batch, DIM, seed=4), dim=1)
    both = SwAVLoss(embedding_dim=DIM, num_prototypes=[K, K])([embedding, first, second])
    one = [SwAVLoss(embedding_dim=DIM, num_prototypes=[K])([embedding, s]) for s in (first,
                                                                                      second)]
    assert both.item() == pytest.approx((one[0].item() + one[1].item()) / 2, rel=1e-6)


def bound_loss(queue_length: int, **kwargs):
    head = SwAVPrototypesHead(dims=[6, DIM], num_clusters=[K])
    head.normalize_prototypes()
    loss_fn = SwAVLoss(embedding_dim=DIM, num_prototypes=[K], queue_length=queue_length,
                       **kwargs)
    loss_fn.bind_model(type("Model", (), {"heads": [head]})())
    return loss_fn, head


def test_queue_rows_join_the_sinkhorn_problem_once_full_and_only_from_start_iter():
    batch = 4
    loss_fn, head = bound_loss(queue_length=2 * batch, queue_start_iter=1)
    prototypes = head.prototypes0.weight.detach()
    steps = [F.normalize(randn(2 * batch, DIM, seed=40 + i), dim=1) for i in range(4)]

    def reference(embedding, queue_embeddings):
        scores = embedding @ prototypes.t()
        queued = None if queue_embeddings is None else [q @ prototypes.t()
                                                        for q in queue_embeddings]
        return SwaVLoss()(list(scores.chunk(2)), [], queued).item()

    def step(index, train=True):
        loss_fn.begin_step(StepContext(iteration=index, train=train))
        embedding = steps[index]
        return loss_fn([embedding, embedding @ prototypes.t()]).item()

    assert step(0) == pytest.approx(reference(steps[0], None), rel=1e-5)  # before start_iter
    assert int(loss_fn.queue_filled) == 0
    assert step(1) == pytest.approx(reference(steps[1], None), rel=1e-5)  # filling
    assert step(2) == pytest.approx(reference(steps[2], None), rel=1e-5)  # now full
    queue = [torch.cat([steps[2].chunk(2)[c], steps[1].chunk(2)[c]]) for c in range(2)]
    torch.testing.assert_close(loss_fn.queue, torch.stack(queue))  # newest first
    assert step(3) == pytest.approx(reference(steps[3], queue), rel=1e-5)
    # an evaluation step leaves the queue as it is
    before = loss_fn.queue.clone()
    step(3, train=False)
    assert torch.equal(loss_fn.queue, before)


def test_queue_length_must_hold_whole_batches_and_outputs_are_checked():
    loss_fn, _ = bound_loss(queue_length=10)
    with pytest.raises(ValueError, match="multiple of the global batch"):
        loss_fn([torch.zeros(8, DIM), torch.zeros(8, K)])
    with pytest.raises(ValueError, match="prototype set"):
        SwAVLoss(embedding_dim=DIM, num_prototypes=[K])([torch.zeros(8, DIM)])
    with pytest.raises(ValueError, match="num_crops"):
        SwAVLoss(embedding_dim=DIM, num_prototypes=[K], num_crops=3)(
            [torch.zeros(8, DIM), torch.zeros(8, K)])
    with pytest.raises(ValueError, match="crops_for_assign"):
        SwAVLoss(crops_for_assign=[2])
    with pytest.raises(ValueError, match="num_clusters"):
        SwAVLoss(embedding_dim=DIM, num_prototypes=[7]).bind_model(
            type("Model", (), {"heads": [SwAVPrototypesHead(dims=[6, DIM], num_clusters=[K])]})())


def test_hard_assignments_during_the_first_iterations():
    batch = 4
    scores = crop_major(multicrop_scores(batch, 2, 0, seed=50))
    loss_fn = SwAVLoss(embedding_dim=DIM, num_prototypes=[K], temp_hard_assignment_iters=1)
    q = loss_fn.assignments(scores[:batch], 0, 0)
    assert torch.equal(q.sum(dim=1), torch.ones(batch)) and set(q.unique().tolist()) == {0, 1}
    loss_fn.begin_step(StepContext(iteration=1))
    assert not set(loss_fn.assignments(scores[:batch], 0, 0).unique().tolist()) <= {0, 1}


def test_head_outputs_normalised_embedding_and_scores_per_prototype_set():
    torch.manual_seed(0)
    head = SwAVPrototypesHead(dims=[6, 16, DIM], use_bn=True, num_clusters=[K, 5])
    embedding, first, second = head(torch.randn(10, 6))
    torch.testing.assert_close(embedding.norm(dim=1), torch.ones(10))
    assert first.shape == (10, K) and second.shape == (10, 5)
    assert head.num_outputs == 3
    assert [name for name, _ in head.named_parameters()][-2:] == ["prototypes0.weight",
                                                                  "prototypes1.weight"]
    torch.testing.assert_close(first, embedding @ head.prototypes0.weight.t())
    head.normalize_prototypes()
    torch.testing.assert_close(head.prototypes1.weight.norm(dim=1), torch.ones(5))
    _, scores, _ = head(torch.randn(10, 6))
    assert scores.abs().max() <= 1 + 1e-6  # cosine similarities once normalised


# ---------------------------------------------------------------- two processes vs one
WORLD_SIZE, LOCAL, CROPS = 2, 4, 3


def rank_rows(rank: int) -> torch.Tensor:
    """The rows of a global crop-major batch (CROPS crops of WORLD_SIZE * LOCAL samples) that
    ``rank`` holds, crop-major."""
    total = WORLD_SIZE * LOCAL
    return torch.tensor([c * total + rank * LOCAL + s for c in range(CROPS) for s in range(LOCAL)])


def global_inputs():
    embedding = F.normalize(randn(CROPS * WORLD_SIZE * LOCAL, DIM, seed=60), dim=1)
    prototypes = F.normalize(randn(K, DIM, seed=61), dim=1)
    queue = F.normalize(randn(2, WORLD_SIZE * 2 * LOCAL, DIM, seed=62), dim=2)
    return embedding, prototypes, queue


def swav_loss_and_grad(embedding, prototypes, queue):
    """Loss of ``embedding`` with a full queue, and the gradient of the scores."""
    head = SwAVPrototypesHead(dims=[DIM, DIM], num_clusters=[K])
    with torch.no_grad():
        head.prototypes0.weight.copy_(prototypes)
    world = dist.get_world_size() if dist.is_initialized() else 1
    loss_fn = SwAVLoss(embedding_dim=DIM, num_prototypes=[K], num_crops=CROPS,
                       queue_length=queue.shape[1] * world)
    loss_fn.bind_model(type("Model", (), {"heads": [head]})())
    loss_fn.queue.copy_(queue)
    loss_fn.queue_filled.fill_(queue.shape[1] * world)  # rows of all ranks
    scores = (embedding @ prototypes.t()).requires_grad_(True)
    loss = loss_fn([embedding, scores])
    loss.backward()
    return loss.detach(), scores.grad


def run_rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD_SIZE)
    try:
        embedding, prototypes, queue = global_inputs()
        local_queue = queue.chunk(WORLD_SIZE, dim=1)[rank]
        loss, grad = swav_loss_and_grad(embedding[rank_rows(rank)], prototypes, local_queue)
        scores = embedding[rank_rows(rank)][:LOCAL] @ prototypes.t()
        torch.save({"loss": loss, "grad": grad / WORLD_SIZE,  # DDP averages over ranks
                    "q": distributed_sinkhorn(scores),
                    "q_far": distributed_sinkhorn(far_sample_scores()[rank::WORLD_SIZE],
                                                  epsilon=0.01)}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_processes_match_one_process(tmp_path):
    spawn_ranks(run_rank, WORLD_SIZE, tmp_path, lambda init: (init, str(tmp_path)))
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    embedding, prototypes, queue = global_inputs()
    full_loss, full_grad = swav_loss_and_grad(embedding, prototypes, queue)
    assert sum(r["loss"] for r in per_rank).item() / WORLD_SIZE == pytest.approx(
        full_loss.item(), rel=1e-5)
    for rank, results in enumerate(per_rank):
        torch.testing.assert_close(results["grad"], full_grad[rank_rows(rank)], rtol=1e-4,
                                   atol=1e-7)
    # Sinkhorn's sums run over both ranks: their assignments are the global batch's
    first_crop = embedding[:WORLD_SIZE * LOCAL] @ prototypes.t()
    torch.testing.assert_close(torch.cat([r["q"] for r in per_rank]),
                               distributed_sinkhorn(first_crop), rtol=1e-5, atol=1e-7)
    # the same on the underflow-safe path (the far sample is on rank 0)
    expected = distributed_sinkhorn(far_sample_scores(), epsilon=0.01)
    for rank, results in enumerate(per_rank):
        torch.testing.assert_close(results["q_far"], expected[rank::WORLD_SIZE], rtol=1e-5,
                                   atol=1e-7)


def test_temporarily_frozen_parameters_get_no_update_until_their_iteration():
    from types import SimpleNamespace

    from ssl_engine.hooks.frozen_params_hook import FrozenParamsHook

    torch.manual_seed(0)
    model = torch.nn.Sequential(SwAVPrototypesHead(dims=[6, DIM], num_clusters=[K]))
    hook = FrozenParamsHook([["module.0.prototypes0.weight", 2]])  # VISSL's DDP prefix
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    task = SimpleNamespace(base_model=model, iteration=0)
    hook.on_start(task)
    history = []
    for iteration in range(3):
        task.iteration = iteration
        history.append((model[0].prototypes0.weight.clone(),
                        model[0].projection_head[0].weight.clone()))
        optimizer.zero_grad()
        model(torch.randn(4, 6))[1].sum().backward()
        hook.on_backward(task)
        optimizer.step()
    prototypes = [p for p, _ in history] + [model[0].prototypes0.weight]
    projections = [w for _, w in history] + [model[0].projection_head[0].weight]
    assert torch.equal(prototypes[0], prototypes[2])  # frozen during updates 0 and 1
    assert not torch.equal(prototypes[2], prototypes[3])  # trained from update 2 on
    assert all(not torch.equal(a, b) for a, b in zip(projections, projections[1:]))
    with pytest.raises(ValueError, match="did you mean '0.prototypes0.weight'"):
        FrozenParamsHook([["0.prototype0.weight", 1]]).on_start(task)
