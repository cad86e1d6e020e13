"""The losses of MoCo v2, MoCo v3, BYOL, SimSiam, Barlow Twins and VICReg against independent
implementations (lightly's losses, or the paper's formula written out with numpy), and the
distributed ones on 2 gloo processes against 1 process on the same global batch, gradients
included."""
import numpy as np
import pytest
import torch
import torch.distributed as dist
from gloo_utils import spawn_ranks
from lightly.loss import BarlowTwinsLoss as LightlyBarlowTwins
from lightly.loss import NegativeCosineSimilarity
from lightly.loss import VICRegLoss as LightlyVICReg

from ssl_engine.losses import (BarlowTwinsLoss, BYOLLoss, MoCoLoss, MoCoV3Loss, SimSiamLoss,
                               VICRegLoss)
from ssl_engine.losses.momentum_target import cosine_momentum

DIM = 8


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def halves(z: torch.Tensor):
    return z[: len(z) // 2], z[len(z) // 2:]


def numpy_info_nce(q: np.ndarray, positives: np.ndarray, negatives_per_row, t: float) -> float:
    """Mean over rows of -log softmax of the positive among [positive, negatives...]."""
    norm = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    losses = []
    for row in range(len(q)):
        logits = [norm(q[row]) @ norm(positives[row]) / t] + [
            norm(q[row]) @ norm(n) / t for n in negatives_per_row(row)]
        logits = np.array(logits, dtype=np.float64)
        losses.append(-(logits[0] - np.log(np.exp(logits).sum())))
    return float(np.mean(losses))


# ---------------------------------------------------------------- one process, oracles
def test_barlow_twins_matches_lightly_times_scale():
    z = randn(32, DIM, seed=0)
    ours = BarlowTwinsLoss(lambda_=0.0051, scale_loss=0.024, embedding_dim=DIM)
    theirs = LightlyBarlowTwins(lambda_param=0.0051)(*halves(z)) * 0.024
    assert ours([z], None).item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-6)
    assert sum(ours.loss_terms.values()).item() == pytest.approx(theirs.item(), rel=1e-5)
    assert set(ours.loss_terms) == {"on_diagonal", "off_diagonal"}


def test_vicreg_matches_lightly_and_terms_add_up():
    z = randn(40, DIM, seed=1) * 0.7
    ours = VICRegLoss(embedding_dim=DIM)
    theirs = LightlyVICReg(lambda_param=25.0, mu_param=25.0, nu_param=1.0, eps=1e-4)(*halves(z))
    assert ours([z], None).item() == pytest.approx(theirs.item(), rel=1e-5)
    terms = ours.loss_terms
    assert set(terms) == {"invariance", "variance", "covariance"}
    first, second = halves(z)
    assert terms["invariance"].item() == pytest.approx(
        25.0 * float(((first - second) ** 2).mean()), rel=1e-5)


def test_simsiam_matches_lightly_negative_cosine_and_stops_gradients():
    projection = randn(12, DIM, seed=2).requires_grad_(True)
    prediction = randn(12, DIM, seed=3).requires_grad_(True)
    loss = SimSiamLoss(embedding_dim=DIM)([projection, prediction], None)
    criterion = NegativeCosineSimilarity()
    (z0, z1), (p0, p1) = halves(projection.detach()), halves(prediction.detach())
    expected = 0.5 * (criterion(p0, z1) + criterion(p1, z0))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    loss.backward()
    assert projection.grad is None and prediction.grad.abs().sum() > 0


def test_byol_is_the_symmetric_normalised_mse():
    prediction, projection = randn(10, DIM, seed=4), randn(10, DIM, seed=5)
    loss_fn = BYOLLoss(embedding_dim=DIM)
    loss_fn.target_output = projection
    loss = loss_fn([prediction], None)
    p, z = prediction.numpy().astype(np.float64), projection.numpy().astype(np.float64)
    p, z = p / np.linalg.norm(p, axis=1, keepdims=True), z / np.linalg.norm(z, axis=1,
                                                                               keepdims=True)
    expected = ((p[:5] - z[5:]) ** 2).sum(1).mean() + ((p[5:] - z[:5]) ** 2).sum(1).mean()
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert set(loss_fn.loss_terms) == {"view0_to_view1", "view1_to_view0"}


def test_moco_v2_is_info_nce_against_key_and_queue_then_enqueues():
    query, key = randn(4, DIM, seed=6), randn(4, DIM, seed=7)
    loss_fn = MoCoLoss(embedding_dim=DIM, queue_size=6, temperature=0.2)
    queue = loss_fn.queue.clone().numpy()
    loss_fn.target_output = key
    loss = loss_fn([query], None)
    expected = numpy_info_nce(query.numpy(), key.numpy(), lambda row: queue, 0.2)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    # the update enqueues the normalised keys at the pointer, wrapping around the queue
    loss_fn.target_network = torch.nn.Linear(1, 1)
    loss_fn.update_target(torch.nn.Linear(1, 1), step=0, total=10)
    keys = torch.nn.functional.normalize(key, dim=1)
    torch.testing.assert_close(loss_fn.queue[:4], keys)
    torch.testing.assert_close(loss_fn.queue[4:], torch.from_numpy(queue[4:]))
    assert int(loss_fn.queue_ptr) == 4
    loss_fn.target_output = key
    loss_fn([query], None)
    loss_fn.update_target(torch.nn.Linear(1, 1), step=1, total=10)
    torch.testing.assert_close(loss_fn.queue[[4, 5, 0, 1]], keys)
    assert int(loss_fn.queue_ptr) == 2


def test_moco_v2_refuses_a_batch_without_the_keys_view():
    """simclr_collator puts both views in "input": the keys would be the queries' own view."""
    loss_fn = MoCoLoss(embedding_dim=DIM, queue_size=6)
    views = randn(4, DIM, seed=8)
    assert loss_fn.target_input({"input": views[:2], "input_momentum": views[2:]}) is not None
    with pytest.raises(ValueError, match="COLLATE_FUNCTION=moco_collator"):
        loss_fn.target_input({"input": views})


def test_moco_v3_is_the_scaled_symmetric_info_nce():
    query, key, t = randn(8, DIM, seed=8), randn(8, DIM, seed=9), 0.2
    loss_fn = MoCoV3Loss(embedding_dim=DIM, temperature=t)
    loss_fn.target_output = key
    loss = loss_fn([query], None)
    q0, q1 = halves(query.numpy())
    k0, k1 = halves(key.numpy())
    one_way = lambda q, k: numpy_info_nce(  # noqa: E731
        q, k, lambda row: np.delete(k, row, axis=0), t)
    expected = 2 * t * (one_way(q0, k1) + one_way(q1, k0))
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_cosine_momentum_schedule_and_ema_update():
    base, total = 0.99, 100
    for step in (0, 25, 50, 100):
        expected = 1 - (1 - base) * (np.cos(np.pi * step / total) + 1) / 2
        assert cosine_momentum(base, step, total) == pytest.approx(expected, abs=1e-12)
    assert cosine_momentum(base, 0, total) == base and cosine_momentum(base, total, total) == 1
    online, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    loss_fn = BYOLLoss(embedding_dim=2, momentum=0.9, momentum_schedule="constant")
    loss_fn.target_network = target
    before = target.weight.detach().clone()
    loss_fn.update_target(online, step=5, total=10)
    torch.testing.assert_close(target.weight, 0.9 * before + 0.1 * online.weight.detach())


def test_wrong_embedding_size_and_missing_outputs_are_named():
    with pytest.raises(ValueError, match=r"LOSS.barlow_twins_loss.embedding_dim"):
        BarlowTwinsLoss(embedding_dim=16)([torch.zeros(4, 8)], None)
    with pytest.raises(ValueError, match="MODEL.HEAD.OUTPUT_HEADS"):
        SimSiamLoss(embedding_dim=8)([torch.zeros(4, 8)], None)
    with pytest.raises(ValueError, match="two views per sample"):
        VICRegLoss(embedding_dim=8)([torch.zeros(5, 8)], None)


# ---------------------------------------------------------------- two processes vs one
WORLD_SIZE, LOCAL = 2, 6


def rank_rows(rank: int) -> torch.Tensor:
    """Rows of a global view-major batch (2 views of WORLD_SIZE * LOCAL samples) that ``rank``
    holds, in its own view-major order."""
    total = WORLD_SIZE * LOCAL
    return torch.tensor([view * total + rank * LOCAL + s for view in range(2)
                         for s in range(LOCAL)])


def make_cases():
    """name -> (loss factory, [inputs]); every input is a global view-major batch."""
    return {
        "barlow_twins": (lambda: BarlowTwinsLoss(embedding_dim=DIM), [randn(24, DIM, seed=10)]),
        "vicreg": (lambda: VICRegLoss(embedding_dim=DIM), [randn(24, DIM, seed=11)]),
        "moco_v3": (lambda: MoCoV3Loss(embedding_dim=DIM), [randn(24, DIM, seed=12),
                                                             randn(24, DIM, seed=13)]),
    }


def loss_and_grad(name, factory, inputs):
    """The loss of ``inputs`` (the first requires grad; a second is the momentum target's
    output), and the gradient of the first."""
    main = inputs[0].clone().requires_grad_(True)
    loss_fn = factory()
    if len(inputs) > 1:
        loss_fn.target_output = inputs[1]
    loss = loss_fn([main], None)
    loss.backward()
    return loss.detach(), main.grad


def run_rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD_SIZE)
    try:
        results = {}
        for name, (factory, inputs) in make_cases().items():
            local = [x[rank_rows(rank)] for x in inputs]
            loss, grad = loss_and_grad(name, factory, local)
            results[name] = (loss, grad / WORLD_SIZE)  # DDP averages gradients over ranks
        bn_input = randn(WORLD_SIZE * LOCAL, 4, 3, 3, seed=14)[rank * LOCAL:(rank + 1) * LOCAL]
        results["global_bn"] = global_bn_output_and_grads(bn_input)
        torch.save(results, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def batch_norm_2d() -> torch.nn.BatchNorm2d:
    """The batch norm both sides of the comparison start from (non-trivial affine weights)."""
    bn = torch.nn.BatchNorm2d(4)
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 2.0, 4))
        bn.bias.copy_(torch.linspace(-1.0, 1.0, 4))
    return bn


def output_weights(out: torch.Tensor) -> torch.Tensor:
    """Fixed weights that turn a batch's output into a scalar loss, ``(out * weights).sum()``."""
    return torch.arange(out.numel(), dtype=out.dtype).reshape(out.shape).sin()


def global_bn_output_and_grads(x: torch.Tensor):
    from ssl_engine.models.sync_bn import convert_to_global_bn

    bn = convert_to_global_bn(torch.nn.Sequential(batch_norm_2d()))
    x = x.clone().requires_grad_(True)
    out = bn(x)
    (out * output_weights(out)).sum().backward()
    return (out.detach(), x.grad, bn[0].weight.grad, bn[0].running_mean.clone(),
            bn[0].running_var.clone())


def test_two_processes_match_one_process(tmp_path):
    spawn_ranks(run_rank, WORLD_SIZE, tmp_path, lambda init: (init, str(tmp_path)))
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD_SIZE)]
    for name, (factory, inputs) in make_cases().items():
        full_loss, full_grad = loss_and_grad(name, factory, inputs)
        mean_loss = sum(results[name][0] for results in per_rank) / WORLD_SIZE
        assert mean_loss.item() == pytest.approx(full_loss.item(), rel=1e-5), name
        for rank, results in enumerate(per_rank):
            torch.testing.assert_close(results[name][1], full_grad[rank_rows(rank)],
                                       rtol=1e-4, atol=1e-6, msg=name)

    # global batch norm on 2 x LOCAL samples == torch's BatchNorm2d on the whole batch; each
    # rank's loss is the sum over its own samples, so the weight gradients add up over ranks
    bn = batch_norm_2d()
    x = randn(WORLD_SIZE * LOCAL, 4, 3, 3, seed=14).requires_grad_(True)
    out = bn(x)
    # the weights that multiply each rank's slice of the output, as each rank made them
    weights = torch.cat([output_weights(o) for o in torch.chunk(out, WORLD_SIZE)])
    (out * weights).sum().backward()
    outputs = torch.cat([r["global_bn"][0] for r in per_rank])
    grads = torch.cat([r["global_bn"][1] for r in per_rank])
    torch.testing.assert_close(outputs, out.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads, x.grad, rtol=1e-4, atol=1e-5)
    weight_grad = sum(r["global_bn"][2] for r in per_rank)  # each rank: its own samples' part
    torch.testing.assert_close(weight_grad, bn.weight.grad, rtol=1e-4, atol=1e-5)
    for r in per_rank:
        torch.testing.assert_close(r["global_bn"][3], bn.running_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["global_bn"][4], bn.running_var, rtol=1e-5, atol=1e-6)
