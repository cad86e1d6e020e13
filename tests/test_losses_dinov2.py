"""DINOv2's options of the DINO loss: the KoLeo term against lightly's KoLeoLoss, Sinkhorn-Knopp
centering of the teacher against the iterations written out here, and the identity head that
gives the loss the trunk's features."""
import math

import pytest
import torch
import torch.nn.functional as F

from ssl_engine.losses import DINOLoss, StepContext
from ssl_engine.losses.dinov2_terms import koleo_loss
from ssl_engine.models.heads.identity import IdentityHead

K = 16


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_koleo_matches_lightly_in_value_and_gradient():
    from lightly.loss import KoLeoLoss

    features = randn(9, 5, seed=1) * 3
    mine, reference = (features.clone().requires_grad_(True) for _ in range(2))
    ours, theirs = koleo_loss(mine), KoLeoLoss()(reference)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    ours.backward()
    theirs.backward()
    torch.testing.assert_close(mine.grad, reference.grad, rtol=1e-5, atol=1e-7)
    # the closer the nearest neighbours, the larger the term
    assert koleo_loss(features * 0 + randn(9, 5, seed=2) * 1e-3 + 1) > ours
    with pytest.raises(ValueError, match="at least 2 rows"):
        koleo_loss(features[:1])


def plain_sinkhorn(scores: torch.Tensor, temperature: float, iterations: int) -> torch.Tensor:
    """DINOv2's teacher Sinkhorn-Knopp, one process: Q = exp(s / t)^T [K, B], normalised to a
    total of 1, then each prototype to 1/K and each sample to 1/B, and rows summing to 1."""
    q = torch.exp(scores.double() / temperature).t()
    num_prototypes, rows = q.shape
    q = q / q.sum()
    for _ in range(iterations):
        q = q / q.sum(dim=1, keepdim=True) / num_prototypes
        q = q / q.sum(dim=0, keepdim=True) / rows
    return (q * rows).t().float()


def dino_step(loss_fn, outputs, teacher, iteration=0):
    loss_fn.begin_step(StepContext(iteration=iteration, train=True))
    loss_fn.target_output = teacher
    return loss_fn(outputs)


def test_sinkhorn_knopp_centering_gives_the_written_out_targets_and_leaves_the_center():
    batch, crops, temperature = 6, 3, 0.07
    loss_fn = DINOLoss(output_dim=K, num_crops=crops, crops_for_teacher=[0, 1],
                       teacher_temp_min=temperature, teacher_temp_max=temperature,
                       teacher_temp_warmup_iters=0, centering="sinkhorn_knopp",
                       sinkhorn_iterations=4)
    student = randn(crops * batch, K, seed=3).requires_grad_(True)
    teacher = randn(2 * batch, K, seed=4)
    loss = dino_step(loss_fn, [student], teacher)
    targets = plain_sinkhorn(teacher, temperature, 4).view(2, batch, K)
    log_probs = F.log_softmax(student / 0.1, dim=1).view(crops, batch, K)
    expected = sum(-(targets[t] * log_probs[s]).sum(dim=1).mean()
                   for t in range(2) for s in range(crops) if s != t) / (2 * (crops - 1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # more balanced over the prototypes than the plain softmax of the same scores
    spread = lambda q: (q.reshape(-1, K).mean(dim=0) - 1 / K).abs().max()  # noqa: E731
    assert spread(targets) < 0.5 * spread(F.softmax(teacher / temperature, dim=1))
    assert loss_fn.center.abs().sum() == 0
    with pytest.raises(ValueError, match="centering must be one of centering, sinkhorn_knopp"):
        DINOLoss(centering="center")


def test_koleo_term_reads_the_trunk_features_of_the_teachers_crops():
    batch, crops, weight = 5, 4, 0.1
    loss_fn = DINOLoss(output_dim=K, num_crops=crops, koleo_loss_weight=weight)
    features = randn(crops * batch, 8, seed=5)
    scores, teacher = randn(crops * batch, K, seed=6), randn(2 * batch, K, seed=7)
    plain = DINOLoss(output_dim=K, num_crops=crops)
    without = dino_step(plain, [scores], teacher)
    total = dino_step(loss_fn, [IdentityHead()(features), scores], teacher)
    koleo = koleo_loss(features[:batch]) + koleo_loss(features[batch:2 * batch])
    assert loss_fn.loss_terms["koleo"].item() == pytest.approx(weight * koleo.item(), rel=1e-6)
    assert total.item() == pytest.approx(without.item() + weight * koleo.item(), rel=1e-6)
    assert math.isfinite(total.item())
    with pytest.raises(ValueError, match=r"OUTPUT_HEADS \[0, 1\]"):
        dino_step(loss_fn, [scores], teacher)


def test_dinov2_quickstart_builds_a_model_whose_outputs_the_loss_takes():
    from ssl_engine.config import load_config
    from ssl_engine.losses import build_loss
    from ssl_engine.models import build_model

    _, cfg = load_config(["config=quickstart/dinov2_vit_digits"])
    assert cfg.LOSS.dino_loss.centering == "sinkhorn_knopp"
    assert cfg.LOSS.dino_loss.koleo_loss_weight > 0
    torch.manual_seed(0)
    model = build_model(cfg.MODEL)
    loss_fn = build_loss(cfg.LOSS)
    loss_fn.bind_model(model)
    assert cfg.LOSS.dino_loss.num_crops == 2  # the two 16-pixel crops: local crops cost here
    crops = [randn(2 * 4, 3, 16, 16, seed=8)]
    outputs = model(crops)
    features, scores = outputs
    assert features.shape == (cfg.LOSS.dino_loss.num_crops * 4, 128)
    loss = dino_step(loss_fn, outputs, loss_fn.target_network(crops[0])[0].detach())
    loss.backward()
    assert set(loss_fn.loss_terms) == {"teacher_crop0", "teacher_crop1", "koleo"}
    assert model.trunk.vit.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
