"""data2vec 2.0 and DINOv3's Gram anchoring against their papers' equations, written out here
as plain loops (no oracle library has them): data2vec's targets (instance norm per block,
average of the top K, layer norm), its masked regression (values and gradients), the copies'
order, its momentum schedule and its teacher's top-K feed-forward outputs; the Gram term on a
case computed by hand and on random features (values and gradients), its switch-on
iteration, the Gram teacher's refresh and its place in the loss's state."""
import math
import types

import pytest
import torch

from ssl_engine.config import load_config
from ssl_engine.losses import Data2VecLoss, DINOv3Loss, StepContext, build_loss
from ssl_engine.losses.data2vec_loss import data2vec_targets, masked_regression
from ssl_engine.losses.gram_anchoring import gram_loss
from ssl_engine.models import build_model
from ssl_engine.models.heads.data2vec_decoder import Data2VecDecoder

EPS = 1e-5  # the norms' epsilon (torch's instance_norm and layer_norm default)


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- data2vec: the equations
def paper_targets(layers):
    """y = LN(1/K sum_k IN(a_k)): IN over the patches of each image and channel, LN over the
    channels of each patch, both with biased variances, written as loops."""
    batch, length, dim = layers[0].shape
    average = torch.zeros(batch, length, dim, dtype=torch.float64)
    for layer in layers:
        layer = layer.double()
        for b in range(batch):
            for d in range(dim):
                values = [layer[b, t, d] for t in range(length)]
                mean = sum(values) / length
                var = sum((v - mean) ** 2 for v in values) / length
                for t in range(length):
                    average[b, t, d] += (values[t] - mean) / math.sqrt(var + EPS) / len(layers)
    target = torch.zeros_like(average)
    for b in range(batch):
        for t in range(length):
            values = [average[b, t, d] for d in range(dim)]
            mean = sum(values) / dim
            var = sum((v - mean) ** 2 for v in values) / dim
            for d in range(dim):
                target[b, t, d] = (values[d] - mean) / math.sqrt(var + EPS)
    return target


def paper_regression(prediction, target, mask):
    """1/|masked| sum over masked (n, t) of sum_d (p - y)^2 / sqrt(D)."""
    total, count = 0.0, 0
    for n in range(prediction.shape[0]):
        for t in range(prediction.shape[1]):
            if mask[n, t]:
                total = total + ((prediction[n, t] - target[n, t]) ** 2).sum()
                count += 1
    return total / math.sqrt(prediction.shape[-1]) / count


def test_data2vec_targets_by_hand_and_against_the_loops():
    # one block, one channel, two patches 1 and 3: IN gives -1, +1 (up to eps); LN over a
    # single channel gives 0, so look at IN alone; two channels (1, 3) and (5, 1) by hand:
    layer = torch.tensor([[[1.0], [3.0]]])
    expected = torch.tensor([[[-1.0], [1.0]]]) / math.sqrt(1 + EPS)
    assert_same(data2vec_targets([layer], layer_norm=False), expected)
    layers = [randn(2, 5, 4, seed=1) * 3 + 1, randn(2, 5, 4, seed=2), randn(2, 5, 4, seed=3)]
    assert_same(data2vec_targets(layers), paper_targets(layers))
    top2 = data2vec_targets(layers[1:])
    assert_same(top2, paper_targets(layers[1:]))


def test_data2vec_regression_values_and_gradients():
    prediction = randn(4, 6, 8, seed=4).requires_grad_(True)
    target = randn(4, 6, 8, seed=5)
    mask = torch.rand(4, 6, generator=torch.Generator().manual_seed(6)) < 0.5
    loss = masked_regression(prediction, target, mask, 1 / math.sqrt(8))
    want = paper_regression(prediction.detach(), target, mask)
    assert_same(loss, want)
    loss.backward()
    # d/dp of 1/|M| sum (p - y)^2 / sqrt(D): 2 (p - y) / (sqrt(D) |M|) on masked patches, 0 else
    grad = 2 * (prediction.detach() - target) / math.sqrt(8) / mask.sum() * mask[..., None]
    assert_same(prediction.grad, grad)


def test_data2vec_loss_compares_every_masked_copy_with_its_images_target():
    copies, batch, length, dim = 3, 2, 4, 8
    loss = Data2VecLoss(num_copies=copies)
    teacher = randn(batch, length, dim, seed=7)
    prediction = randn(copies * batch, length, dim, seed=8).requires_grad_(True)
    mask = torch.rand(copies * batch, 2, 2, generator=torch.Generator().manual_seed(9)) < 0.5
    loss.target_output = teacher
    value = loss(prediction, mask)
    total, count = 0.0, 0
    for m in range(copies):  # copy-major rows: row m * B + b is copy m of image b
        for b in range(batch):
            for t in range(length):
                if mask[m * batch + b].flatten()[t]:
                    total += float(((prediction[m * batch + b, t].detach() - teacher[b, t]) ** 2).sum())
                    count += 1
    assert value.item() == pytest.approx(total / math.sqrt(dim) / count, rel=1e-5)
    assert set(loss.loss_terms) == {"regression"}
    assert set(loss.collapse_statistics()) == {"target_std", "prediction_std"}


def test_data2vec_momentum_rises_linearly_then_stays():
    loss = Data2VecLoss(momentum=0.9998, momentum_end=0.99999, momentum_anneal_iters=100)
    assert loss.momentum_at(0, 1000) == pytest.approx(0.9998)
    assert loss.momentum_at(50, 1000) == pytest.approx((0.9998 + 0.99999) / 2)
    assert loss.momentum_at(100, 1000) == loss.momentum_at(500, 1000) == pytest.approx(0.99999)


def tiny(name: str):
    _, cfg = load_config([f"config=test/quick_{name}_synthetic"])
    torch.manual_seed(0)
    model = build_model(cfg.MODEL)
    loss = build_loss(cfg.LOSS)
    loss.bind_model(model)
    return model, loss


def test_data2vec_teacher_targets_are_its_top_k_feed_forward_outputs():
    model, loss = tiny("data2vec")  # 3 blocks, top 2, a class token
    images = randn(2, 3, 16, 16, seed=10)
    got = loss.run_target({"global_views": images}, None)
    vit = loss.target_network.trunk.vit
    with torch.no_grad():  # x <- x + attn(norm1(x)); f = mlp(norm2(x)); x <- x + f
        x = vit.norm_pre(vit._pos_embed(vit.patch_embed(images)))
        feed_forward = []
        for block in vit.blocks:
            x = x + block.attn(block.norm1(x))
            f = block.mlp(block.norm2(x))
            feed_forward.append(f[:, 1:])  # the patches (the class token is no target)
            x = x + f
    assert got.shape == (2, 16, 32)
    assert_same(got, paper_targets(feed_forward[-2:]))


def test_data2vec_decoder_puts_the_visible_tokens_back_on_the_grid():
    decoder = Data2VecDecoder(in_dim=4, out_dim=6, decoder_dim=8, depth=2, groups=2,
                              mask_noise_std=0.0, prefix_tokens=1)
    mask = torch.tensor([[[True, False], [False, True]], [[False, False], [True, True]]])
    tokens = randn(2, 3, 4, seed=11)  # a class token and 2 visible patches per image
    grid = decoder.on_grid(tokens[:, 1:], mask).flatten(2).transpose(1, 2)  # [N, 4, 4]
    for n in range(2):
        visible = [p for p in range(4) if not mask[n].flatten()[p]]
        for slot, position in enumerate(visible):  # grid order
            assert torch.equal(grid[n, position], tokens[n, 1 + slot])
        for position in set(range(4)) - set(visible):
            assert torch.equal(grid[n, position], torch.zeros(4))
    assert decoder(tokens, mask=mask).shape == (2, 4, 6)


# ---------------------------------------------------------------- Gram anchoring
def paper_gram(student, anchor):
    """1/N sum_n 1/P^2 sum_ij (<s_i, s_j> - <a_i, a_j>)^2, rows L2-normalised, as loops."""
    images, patches = student.shape[:2]
    total = 0.0
    for n in range(images):
        s = [student[n, i] / student[n, i].norm() for i in range(patches)]
        a = [anchor[n, i] / anchor[n, i].norm() for i in range(patches)]
        for i in range(patches):
            for j in range(patches):
                total = total + (torch.dot(s[i], s[j]) - torch.dot(a[i], a[j])) ** 2
    return total / (images * patches ** 2)


def test_gram_loss_by_hand():
    # student patches (1, 0), (0, 2): Gram I; anchor patches (1, 0), (3, 0): Gram all ones;
    # the difference [[0, -1], [-1, 0]]: squared Frobenius norm 2, over P^2 = 4 entries: 0.5
    student = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]])
    anchor = torch.tensor([[[1.0, 0.0], [3.0, 0.0]]])
    assert gram_loss(student, anchor).item() == pytest.approx(0.5)
    assert gram_loss(anchor, anchor).item() == 0.0


def test_gram_loss_values_and_gradients_match_the_loops():
    student = randn(3, 5, 6, seed=12)
    anchor = randn(3, 5, 6, seed=13)
    ours, theirs = student.clone().requires_grad_(True), student.clone().requires_grad_(True)
    loss = gram_loss(ours, anchor)
    want = paper_gram(theirs, anchor)
    assert_same(loss, want)
    loss.backward()
    want.backward()
    assert_same(ours.grad, theirs.grad)


def fake_task(iteration: int, inputs, train: bool = True):
    return types.SimpleNamespace(schedule_iteration=iteration, train=train,
                                 last_batch={"input": inputs})


def test_gram_term_switches_on_at_its_iteration_and_its_teacher_refreshes_every_n():
    model, loss = tiny("dinov3")
    loss.gram_start_iteration, loss.gram_update_frequency = 3, 2
    assert [loss.gram_active(i) for i in range(6)] == [False] * 3 + [True] * 3
    assert [i for i in range(12) if loss.gram_refresh_due(i)] == [3, 5, 7, 9, 11]
    inputs = {"global_views": randn(8, 3, 16, 16, seed=14),
              "local_views": randn(8, 3, 8, 8, seed=15)}
    teacher = dict(loss.target_network.trunk.named_parameters())
    anchor = dict(loss.gram_teacher.trunk.named_parameters())
    name = "vit.blocks.0.mlp.fc1.weight"
    initial = anchor[name].detach().clone()
    snapshots = {}
    for iteration in range(7):
        with torch.no_grad():  # the teacher moves at every update (as the EMA moves it)
            teacher[name].add_(0.01)
        loss.compute_target(fake_task(iteration, inputs))
        snapshots[iteration] = anchor[name].detach().clone()
        loss.begin_step(StepContext(iteration=iteration, train=True))
        value = loss(model(inputs))
        gram = loss.loss_terms["gram"]
        if iteration < 3:
            assert gram.item() == 0.0 and torch.equal(snapshots[iteration], initial)
        else:
            assert gram.item() > 0.0
        assert value.item() == pytest.approx(sum(t.item() for t in loss.loss_terms.values()),
                                             rel=1e-6)
    # refreshed before iterations 3 and 5 (to the teacher of that moment), kept in between
    assert torch.allclose(snapshots[3], initial + 0.04) and torch.equal(snapshots[4], snapshots[3])
    assert torch.allclose(snapshots[5], initial + 0.06) and torch.equal(snapshots[6], snapshots[5])
    # an evaluation step at a refresh iteration leaves the Gram teacher alone
    loss.compute_target(fake_task(7, inputs, train=False))
    assert torch.equal(anchor[name], snapshots[6])

    # the Gram teacher's weights are the loss's state: a new loss resumes with them
    _, resumed = tiny("dinov3")
    assert not torch.equal(resumed.gram_teacher.trunk.vit.blocks[0].mlp.fc1.weight, anchor[name])
    resumed.set_classy_state(loss.get_classy_state())
    assert torch.equal(resumed.gram_teacher.trunk.vit.blocks[0].mlp.fc1.weight, anchor[name])
    assert any(key.startswith("gram_teacher.") for key in loss.get_classy_state())


def test_gram_term_is_off_with_weight_zero():
    loss = DINOv3Loss(gram_loss_weight=0.0, gram_start_iteration=0)
    assert not loss.gram_active(10) and not loss.gram_refresh_due(0)
