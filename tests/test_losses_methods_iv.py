"""NNCLR, DCL, DCLW, MMCR, PMSN and LeJEPA: each loss against lightly 1.6's on the same inputs
(values and gradients to 1e-5), the heads built from ``mlp`` against lightly's heads of these
methods with the same weights, NNCLR's support set against lightly's nearest-neighbour memory
bank over several steps, and LeJEPA's slices drawn as a function of the iteration."""
import pytest
import torch
import torch.nn.functional as F
from lightly.loss import DCLLoss as LightlyDCL
from lightly.loss import DCLWLoss as LightlyDCLW
from lightly.loss import LeJEPALoss as LightlyLeJEPA
from lightly.loss import MMCRLoss as LightlyMMCR
from lightly.loss import NTXentLoss
from lightly.loss import PMSNLoss as LightlyPMSN
from lightly.models.modules import heads as lightly_heads
from lightly.models.modules import NNMemoryBankModule

from ssl_engine.losses import (DCLLoss, DCLWLoss, LeJEPALoss, MMCRLoss, NNCLRLoss, PMSNLoss,
                               StepContext)
from ssl_engine.losses import lejepa_loss as lejepa_module
from ssl_engine.models.heads.mlp import MLP

DIM = 8


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def leaf(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.clone().requires_grad_(True)


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- NNCLR
def test_nnclr_loss_gradients_and_support_set_match_lightly():
    batch, size = 6, 12  # the support set wraps around every second step
    ours = NNCLRLoss(embedding_dim=DIM, temperature=0.2, support_set_size=size)
    bank = NNMemoryBankModule(size=(size, DIM))
    bank.bank = ours.queue.clone()
    bank.bank_ptr.zero_()
    criterion = NTXentLoss(temperature=0.2)
    for step in range(3):
        ours.begin_step(StepContext(iteration=step, train=True))
        projection = randn(2 * batch, DIM, seed=10 + step)
        prediction = randn(2 * batch, DIM, seed=20 + step)
        mine, theirs = leaf(prediction), leaf(prediction)
        loss = ours([projection, mine])
        z0, z1 = projection[:batch], projection[batch:]
        nn0 = bank(z0, update=False)
        nn1 = bank(z1, update=True)
        expected = 0.5 * (criterion(nn0, theirs[batch:]) + criterion(nn1, theirs[:batch]))
        assert_same(loss, expected)
        loss.backward()
        expected.backward()
        assert_same(mine.grad, theirs.grad)
        assert_same(ours.queue, bank.bank)
    assert int(ours.queue_ptr) == int(bank.bank_ptr) == 6
    assert sum(ours.loss_terms.values()).item() == pytest.approx(loss.item(), rel=1e-6)


def test_nnclr_positive_is_the_nearest_support_row_and_evaluation_leaves_it():
    ours = NNCLRLoss(embedding_dim=DIM, support_set_size=5)
    before = ours.queue.clone()
    queries = before[[3, 1]] * 2.5 + 1e-3  # nearest rows: 3 and 1 (scale does not matter)
    assert torch.equal(ours.nearest_neighbours(queries), before[[3, 1]])
    ours.begin_step(StepContext(train=False))
    ours([randn(4, DIM, seed=1), randn(4, DIM, seed=2)])
    assert torch.equal(ours.queue, before) and int(ours.queue_ptr) == 0
    ours.begin_step(StepContext(train=True))
    ours([randn(4, DIM, seed=1), randn(4, DIM, seed=2)])
    assert torch.equal(ours.queue[:2], randn(4, DIM, seed=1)[2:])
    assert set(ours.state_dict()) == {"queue", "queue_ptr"}  # in every checkpoint


def copy_lightly_head(ours: MLP, theirs: torch.nn.Module) -> None:
    """Our mlp given lightly's weights, layer by layer (zero biases where lightly has none)."""
    mine = [m for m in ours.modules() if isinstance(m, (torch.nn.Linear, torch.nn.BatchNorm1d))]
    other = [m for m in theirs.modules()
             if isinstance(m, (torch.nn.Linear, torch.nn.BatchNorm1d))]
    assert [type(m) for m in mine] == [type(m) for m in other]
    with torch.no_grad():
        for a, b in zip(mine, other):
            a.weight.copy_(b.weight)
            if a.bias is not None:
                a.bias.copy_(b.bias if b.bias is not None else torch.zeros_like(a.bias))


@pytest.mark.parametrize("name, theirs, ours", [
    ("nnclr_projection", lambda: lightly_heads.NNCLRProjectionHead(16, 12, DIM),
     dict(dims=[16, 12, 12, DIM], use_bn=True, use_relu=True, last_layer_bn=True)),
    ("nnclr_prediction", lambda: lightly_heads.NNCLRPredictionHead(DIM, 12, DIM),
     dict(dims=[DIM, 12, DIM], use_bn=True, use_relu=True)),
    ("mmcr_projection", lambda: lightly_heads.MMCRProjectionHead(16, 12, DIM, num_layers=2),
     dict(dims=[16, 12, 12, DIM], use_bn=True, use_relu=True)),
    ("lejepa_projection", lambda: lightly_heads.LeJEPAProjectionHead(16, 12, DIM),
     dict(dims=[16, 12, 12, DIM], use_bn=True, use_relu=True)),
])
def test_mlp_heads_equal_lightlys_heads_of_these_methods(name, theirs, ours):
    torch.manual_seed(0)
    reference, head = theirs(), MLP(**ours)
    copy_lightly_head(head, reference)
    x = randn(10, ours["dims"][0], seed=3)
    a, b = leaf(x), leaf(x)
    out, expected = head(a), reference(b)
    assert_same(out, expected)
    (out * randn(*out.shape, seed=4)).sum().backward()
    (expected * randn(*out.shape, seed=4)).sum().backward()
    assert_same(a.grad, b.grad)


# ---------------------------------------------------------------- DCL, DCLW
@pytest.mark.parametrize("weighted, temperature", [(False, 0.1), (False, 0.5), (True, 0.1),
                                                   (True, 0.3)])
def test_dcl_and_dclw_match_lightly(weighted, temperature):
    z = randn(20, DIM, seed=5) * 3
    if weighted:
        ours = DCLWLoss(embedding_dim=DIM, temperature=temperature, sigma=0.4)
        theirs = LightlyDCLW(temperature=temperature, sigma=0.4)
    else:
        ours = DCLLoss(embedding_dim=DIM, temperature=temperature)
        theirs = LightlyDCL(temperature=temperature)
    mine, reference = leaf(z), leaf(z)
    loss = ours([mine])
    expected = theirs(reference[:10], reference[10:])
    assert_same(loss, expected)
    loss.backward()
    expected.backward()
    assert_same(mine.grad, reference.grad)
    assert set(ours.loss_terms) == {"view0_to_view1", "view1_to_view0"}


# ---------------------------------------------------------------- MMCR
@pytest.mark.parametrize("views, lmda", [(2, 0.005), (4, 0.005), (4, 0.0), (2, 0.5)])
def test_mmcr_matches_lightly_on_normalised_views(views, lmda):
    batch = 7
    z = randn(views * batch, DIM, seed=6)
    ours = MMCRLoss(embedding_dim=DIM, num_views=views, lmda=lmda)
    mine, reference = leaf(z), leaf(z)
    loss = ours([mine])
    per_sample = F.normalize(reference, dim=1).view(views, batch, DIM).transpose(0, 1)
    half = views // 2
    expected = LightlyMMCR(lmda=lmda)(per_sample[:, :half], per_sample[:, half:])
    assert_same(loss, expected)
    loss.backward()
    expected.backward()
    assert_same(mine.grad, reference.grad)


# ---------------------------------------------------------------- PMSN
@pytest.mark.parametrize("sinkhorn, weight, exponent", [(0, 1.0, 0.25), (3, 1.0, 0.25),
                                                         (3, 0.5, 1.0)])
def test_pmsn_matches_lightly(sinkhorn, weight, exponent):
    protos, batch, crops = 12, 6, 3
    ours = PMSNLoss(output_dim=protos, num_crops=crops, temperature=0.2,
                    target_sharpen_temperature=0.3, prior_weight=weight,
                    sinkhorn_iterations=sinkhorn, power_law_exponent=exponent)
    theirs = LightlyPMSN(temperature=0.2, sinkhorn_iterations=sinkhorn,
                         regularization_weight=weight, power_law_exponent=exponent)
    student, target = randn(crops * batch, DIM, seed=7), randn(batch, DIM, seed=8) * 2
    prototypes = randn(protos, DIM, seed=9)
    mine = [leaf(student), leaf(prototypes)]
    reference = [leaf(student), leaf(prototypes)]
    cosines = lambda a, b: F.normalize(a, dim=1) @ F.normalize(b, dim=1).t()  # noqa: E731
    ours.begin_step(StepContext(iteration=0))
    ours.target_output = cosines(target, mine[1]).detach()
    loss = ours([cosines(*mine)])
    expected = theirs(reference[0][batch:], target, reference[1], target_sharpen_temperature=0.3)
    assert_same(loss, expected)
    loss.backward()
    expected.backward()
    for got, want in zip(mine, reference):
        assert_same(got.grad, want.grad)
    assert set(ours.loss_terms) == {"cross_entropy", "power_law_prior"}


# ---------------------------------------------------------------- LeJEPA
@pytest.mark.parametrize("global_crops, local_crops, lambda_", [(2, 0, 0.05), (2, 3, 0.05),
                                                                (1, 2, 0.5)])
def test_lejepa_matches_lightly_with_the_same_slices(monkeypatch, global_crops, local_crops,
                                                     lambda_):
    batch, slices = 9, 32
    crops = global_crops + local_crops
    torch.manual_seed(11)
    directions = torch.randn(DIM, slices)
    directions = directions / directions.norm(dim=0)
    monkeypatch.setattr(lejepa_module, "random_directions", lambda *args: directions)
    ours = LeJEPALoss(embedding_dim=DIM, num_crops=crops, num_global_crops=global_crops,
                      lambda_=lambda_, num_slices=slices)
    z = randn(crops * batch, DIM, seed=12)
    mine, reference = leaf(z), leaf(z)
    loss = ours([mine])
    theirs = LightlyLeJEPA(lambda_param=lambda_, sigreg_num_vectors=slices)
    views = reference.view(crops, batch, DIM)
    if local_crops:
        torch.manual_seed(11)  # lightly draws its slices from the global generator
        expected = theirs(local_proj=views[global_crops:], global_proj=views[:global_crops])
    else:  # lightly wants a local view: the loss of global views alone, written out
        torch.manual_seed(11)
        expected = lambda_ * theirs.sigreg(views) + (1 - lambda_) * (
            views - views.mean(0)).square().mean()
    assert_same(loss, expected)
    loss.backward()
    expected.backward()
    assert_same(mine.grad, reference.grad)
    assert set(ours.loss_terms) == {"sigreg", "prediction"}


def test_lejepa_slices_are_a_function_of_the_iteration():
    first = lejepa_module.random_directions(DIM, 16, 3)
    assert torch.equal(first, lejepa_module.random_directions(DIM, 16, 3))
    assert not torch.equal(first, lejepa_module.random_directions(DIM, 16, 4))
    torch.testing.assert_close(first.norm(dim=0), torch.ones(16))
