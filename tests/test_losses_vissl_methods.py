"""Multi-crop SimCLR, SwAV with a momentum network, NPID's NCE with a memory bank,
DeepCluster v2 and the multi-label BCE against independent computations (lightly's losses, or
the formulas written out with numpy loops), and PIRL's views, collator and two-input model.
Their engine runs (exact resume, 2 processes against 1) are in test_methods_engine.py."""
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_utils import spawn_ranks
from lightly.loss import NTXentLoss
from lightly.loss.swav_loss import sinkhorn
from PIL import Image

from ssl_engine.config import load_defaults
from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.data.collators.patch_and_image import patch_and_image_collator
from ssl_engine.data.transforms.patches_and_image import ImgPilToPatchesAndImage
from ssl_engine.losses import (BCELogitsMultipleOutputSingleTargetLoss, DeepClusterV2Loss,
                               MultiCropSimclrInfoNCELoss, NCELossWithMemory, StepContext,
                               SwAVMomentumLoss)
from ssl_engine.losses.deepclusterv2_loss import spherical_kmeans
from ssl_engine.losses.memory_bank import hashed_indices
from ssl_engine.models import build_model


def randn(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


# ---------------------------------------------------------------- multi-crop SimCLR
def test_multicrop_simclr_with_two_crops_is_lightlys_nt_xent():
    z = randn(12, 8, seed=0)
    loss = MultiCropSimclrInfoNCELoss(temperature=0.2, embedding_dim=8, num_crops=2)(z)
    expected = NTXentLoss(temperature=0.2)(z[:6], z[6:])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_multicrop_simclr_leaves_the_other_positives_out_of_each_denominator():
    batch, crops, t = 3, 4, 0.3
    z = randn(batch * crops, 8, seed=1)
    loss = MultiCropSimclrInfoNCELoss(temperature=t, embedding_dim=8, num_crops=crops)(z)
    e = unit(z.double().numpy())
    terms = []
    for a in range(batch * crops):
        sample = a % batch
        negatives = [n for n in range(batch * crops) if n % batch != sample]
        negative_mass = sum(np.exp(e[a] @ e[n] / t) for n in negatives)
        for p in range(batch * crops):
            if p != a and p % batch == sample:
                positive = np.exp(e[a] @ e[p] / t)
                terms.append(-np.log(positive / (positive + negative_mass)))
    assert len(terms) == batch * crops * (crops - 1)
    assert loss.item() == pytest.approx(float(np.mean(terms)), rel=1e-5)
    with pytest.raises(ValueError, match="not a multiple of num_crops=4"):
        MultiCropSimclrInfoNCELoss(embedding_dim=8, num_crops=4)(z[:10])


# ---------------------------------------------------------------- BCE, multi-label
def test_bce_averages_each_class_over_its_labelled_samples_and_sums_outputs():
    target = torch.tensor([[1, 0, -1], [0, -1, -1], [1, 1, -1], [-1, 0, -1]])
    outputs = [randn(4, 3, seed=2), randn(4, 3, seed=3)]
    loss_fn = BCELogitsMultipleOutputSingleTargetLoss(normalize_output=True)
    loss = loss_fn(outputs, target)
    expected = 0.0
    for logits in outputs:
        x = unit(logits.double().numpy())
        for c in range(3):
            rows = [n for n in range(4) if target[n, c] != -1]
            per_sample = [np.log1p(np.exp(-x[n, c])) if target[n, c] == 1
                          else np.log1p(np.exp(x[n, c])) for n in rows]
            expected += np.mean(per_sample) if rows else 0.0
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    with pytest.raises(ValueError, match="only reduction 'none'"):
        BCELogitsMultipleOutputSingleTargetLoss(reduction="mean")


# ---------------------------------------------------------------- SwAV with momentum
class _Prototypes(torch.nn.Module):
    def __init__(self, weight):
        super().__init__()
        self.prototypes0 = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
        self.prototypes0.weight.data.copy_(weight)

    def prototype_layers(self):
        return [self.prototypes0]


def test_swav_momentum_assigns_with_the_momentum_networks_scores():
    batch, crops, k, t = 4, 4, 6, 0.1
    online = [randn(batch, k, seed=10 + c).tanh() for c in range(crops)]
    target = [randn(batch, k, seed=20 + c).tanh() for c in range(2)]  # crops_for_assign [0, 1]
    embedding = F.normalize(randn(batch * crops, 5, seed=4), dim=1)
    loss_fn = SwAVMomentumLoss(embedding_dim=5, num_crops=crops, num_prototypes=[k],
                               temperature=t, epsilon=0.05, num_iters=3)
    loss_fn.target_output = [F.normalize(randn(batch * 2, 5, seed=5), dim=1), torch.cat(target)]
    loss = loss_fn([embedding, torch.cat(online)], None)
    expected = 0.0
    for crop in (0, 1):
        q = sinkhorn(target[crop], iterations=3, epsilon=0.05)
        for view in range(crops):
            if view != crop:
                log_p = F.log_softmax(online[view] / t, dim=1)
                expected += -(q * log_p).sum(dim=1).mean() / (2 * (crops - 1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert loss_fn.target_output is None  # taken: the next step needs the hook's new output


def test_swav_momentum_queue_holds_the_momentum_networks_embeddings():
    batch, k = 4, 6
    loss_fn = SwAVMomentumLoss(embedding_dim=5, num_crops=2, num_prototypes=[k],
                               queue_length=8)
    loss_fn.target_network = torch.nn.Module()
    loss_fn.target_network.heads = torch.nn.ModuleList([_Prototypes(randn(k, 5, seed=6))])
    loss_fn._head = [_Prototypes(randn(k, 5, seed=7))]
    target_embedding = F.normalize(randn(batch * 2, 5, seed=8), dim=1)
    for step in range(2):
        loss_fn.begin_step(StepContext(iteration=step))
        loss_fn.target_output = [target_embedding, randn(batch * 2, k, seed=9)]
        loss_fn([F.normalize(randn(batch * 2, 5, seed=11), dim=1), randn(batch * 2, k, seed=12)],
                None)
    for slot in (0, 1):  # newest first: the same rows twice
        rows = target_embedding[slot * batch:(slot + 1) * batch]
        torch.testing.assert_close(loss_fn.queue[slot], torch.cat([rows, rows]))
    # the full queue is scored by the momentum network's prototypes
    assert loss_fn.queue_prototypes(0) is loss_fn.target_network.heads[-1].prototypes0.weight


# ---------------------------------------------------------------- NCE with a memory bank
def test_negative_draws_depend_on_sample_and_iteration_only_and_cover_the_memory():
    keys = torch.arange(500)
    draws = hashed_indices(keys, 40, 37, salt=3)
    assert draws.min() >= 0 and draws.max() < 37
    # a sample draws the same wherever it sits in the batch (and on whichever rank)
    torch.testing.assert_close(hashed_indices(keys[[7, 3]], 40, 37, salt=3), draws[[7, 3]])
    assert not torch.equal(hashed_indices(keys, 40, 37, salt=4), draws)
    counts = torch.bincount(draws.flatten(), minlength=37).double()
    expected = draws.numel() / 37
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 80  # 36 degrees of freedom: p < 1e-4 above ~75


@pytest.mark.parametrize("loss_type", ["nce", "cross_entropy"])
def test_nce_loss_against_the_formula_and_memory_moves_towards_the_embeddings(loss_type):
    size, dim, k, t, m = 10, 4, 3, 0.5, 0.25
    loss_fn = NCELossWithMemory(loss_type=loss_type, temperature=t, num_negatives=k,
                                embedding_dim=dim, momentum=m, num_train_samples=size)
    loss_fn.begin_step(StepContext(iteration=5))
    memory = loss_fn.memory.clone().double().numpy()
    z = randn(3, dim, seed=13)
    index = torch.tensor([4, 0, 9])
    loss = loss_fn(z, index)
    e = unit(z.double().numpy())
    negatives = hashed_indices(index, k, size, salt=5).numpy()
    scores = np.array([[memory[j] @ e[b] / t for j in [int(index[b]), *negatives[b]]]
                       for b in range(3)])
    if loss_type == "nce":
        z_constant = np.exp(scores).mean() * size
        assert float(loss_fn.norm_constant) == pytest.approx(z_constant, rel=1e-5)
        p = np.exp(scores) / z_constant
        noise = k / size
        per_sample = -(np.log(p[:, 0] / (p[:, 0] + noise))
                       + np.log(noise / (p[:, 1:] + noise)).sum(axis=1))
    else:
        per_sample = -(scores[:, 0] - np.log(np.exp(scores).sum(axis=1)))
    assert loss.item() == pytest.approx(float(per_sample.mean()), rel=1e-4)
    for b, row in enumerate(index.tolist()):
        moved = unit(m * memory[row] + (1 - m) * e[b])
        np.testing.assert_allclose(loss_fn.memory[row].numpy(), moved, rtol=1e-5, atol=1e-6)
    untouched = [r for r in range(size) if r not in index.tolist()]
    np.testing.assert_array_equal(loss_fn.memory[untouched].numpy(),
                                  memory[untouched].astype(np.float32))
    # evaluation steps leave the memory alone
    loss_fn.begin_step(StepContext(iteration=5, train=False))
    before = loss_fn.memory.clone()
    loss_fn(z, index)
    assert torch.equal(loss_fn.memory, before)
    with pytest.raises(ValueError, match="sample_index"):
        loss_fn(z, torch.tensor([4, 0, 10]))


def test_nce_loss_updates_the_memory_from_the_chosen_output_only():
    loss_fn = NCELossWithMemory(num_negatives=3, embedding_dim=4, num_train_samples=10,
                                loss_weights=[0.5, 0.5], update_mem_on_forward=False,
                                update_mem_with_emb_index=1, momentum=0.0)
    z0, z1 = randn(2, 4, seed=14), randn(2, 4, seed=15)
    loss_fn([z0, z1], torch.tensor([2, 3]))
    torch.testing.assert_close(loss_fn.memory[[2, 3]], F.normalize(z1, dim=1))
    assert set(loss_fn.loss_terms) == {"output0", "output1"}


# ---------------------------------------------------------------- DeepCluster v2
def test_spherical_kmeans_matches_a_plain_loop():
    points = F.normalize(randn(40, 3, seed=16), dim=1)
    centroids, assigned = spherical_kmeans(points, 4, iterations=5, seed=2)
    start = torch.randperm(40, generator=torch.Generator().manual_seed(2))[:4]
    x = points.double().numpy()
    c = x[start.numpy()].copy()
    for _ in range(5):
        a = (x @ c.T).argmax(axis=1)
        for j in range(4):
            if (a == j).any():
                c[j] = x[a == j].mean(axis=0)
        c = unit(c)
    np.testing.assert_allclose(centroids.numpy(), c, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(assigned.numpy(), (x @ c.T).argmax(axis=1))


def test_deepclusterv2_predicts_each_crops_cluster_and_keeps_the_memory():
    batch, crops, dim, t = 3, 2, 4, 0.1
    loss_fn = DeepClusterV2Loss(num_clusters=[2, 3], kmeans_iters=2, temperature=t,
                                num_crops=crops, crops_for_mb=[0, 1], embedding_dim=dim,
                                num_train_samples=6)
    index = torch.tensor([5, 1, 3]).repeat(crops)
    z = randn(batch * crops, dim, seed=17)
    # nothing assigned yet: no loss, the memory takes the rows
    assert loss_fn(z, index).item() == 0
    e = F.normalize(z, dim=1)
    for bank in (0, 1):
        torch.testing.assert_close(loss_fn.memory[bank, [5, 1, 3]], e[bank * batch:(bank + 1) * batch])
    assert loss_fn.in_memory.tolist() == [False, True, False, True, False, True]
    loss_fn.cluster_memory(epoch=0)
    assert (loss_fn.assignments[:, [0, 2, 4]] == -100).all()  # not in the memory
    z2 = randn(batch * crops, dim, seed=18)
    loss = loss_fn(z2, index)
    e2 = unit(z2.double().numpy())
    expected = 0.0
    for head in (0, 1):
        c = loss_fn.centroids(head).double().numpy()
        labels = loss_fn.assignments[head][index].numpy()
        logits = e2 @ c.T / t
        ce = [-(logits[r, labels[r]] - np.log(np.exp(logits[r]).sum())) for r in range(6)]
        expected += np.mean(ce) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert set(loss_fn.loss_terms) == {"clustering0", "clustering1"}
    with pytest.raises(ValueError, match="reduce num_clusters"):
        DeepClusterV2Loss(num_clusters=[4], num_crops=2, embedding_dim=dim,
                          num_train_samples=6).cluster_memory(0)


# ---------------------------------------------------------------- two processes (gloo)
BCE_TARGET = torch.tensor([[1, -1], [0, -1], [-1, 1], [1, 0], [0, 1], [-1, -1]])  # uneven


def _bce_rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        logits = randn(6, 2, seed=19)[rank * 3:(rank + 1) * 3].clone().requires_grad_(True)
        loss = BCELogitsMultipleOutputSingleTargetLoss()(logits, BCE_TARGET[rank * 3:(rank + 1) * 3])
        loss.backward()
        torch.save((loss.detach(), logits.grad / 2), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_bce_on_two_processes_is_the_loss_of_the_global_batch(tmp_path):
    spawn_ranks(_bce_rank, 2, tmp_path, lambda init: (init, str(tmp_path)))
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    logits = randn(6, 2, seed=19).requires_grad_(True)
    loss = BCELogitsMultipleOutputSingleTargetLoss()(logits, BCE_TARGET)
    loss.backward()
    # data-parallel training averages the processes' gradients (and the logged losses)
    assert (per_rank[0][0] + per_rank[1][0]).item() / 2 == pytest.approx(loss.item(), rel=1e-6)
    torch.testing.assert_close(torch.cat([per_rank[0][1], per_rank[1][1]]), logits.grad)


# ---------------------------------------------------------------- PIRL's inputs and model
def test_pirl_views_collator_and_multi_input_model():
    torch.manual_seed(0)
    image = Image.fromarray((np.random.default_rng(0).random((40, 40, 3)) * 255).astype(np.uint8))
    views = ImgPilToPatchesAndImage(crop_size_image=16, crop_size_patches=21, num_patches=9,
                                    patch_jitter=2)(image)
    assert len(views) == 10 and views[0].size == (16, 16)
    assert all(view.size == (5, 5) for view in views[1:])  # cells of 7 pixels, less the jitter
    samples = [{"data": [torch.full((3, 4, 4), float(s))] + [torch.full((3, 2, 2), s + p / 10)
                                                            for p in range(3)],
                "label": [s + 10] * 4, "data_idx": s, "data_valid": True} for s in range(2)]
    batch = patch_and_image_collator(samples)
    assert batch["input"]["images"].shape == (2, 3, 4, 4)
    patches = batch["input"]["patches"]
    assert patches.shape == (6, 3, 2, 2)  # sample-major: sample 0's 3 patches first
    assert patches[:, 0, 0, 0].tolist() == pytest.approx([0, 0.1, 0.2, 1, 1.1, 1.2])
    assert batch["target"].tolist() == [10, 11] and batch["data_idx"].tolist() == [0, 1]

    model_cfg = AttrDict(load_defaults()["config"]["MODEL"])
    model_cfg.TRUNK.RESNETS.update({"DEPTH": 18, "WIDTH_MULTIPLIER": 0.125,
                                    "SMALL_IMAGE_STEM": True})
    model_cfg.MULTI_INPUT_HEAD_MAPPING = [["patches", ["flatten"]], ["images", ["flatten"]]]
    model_cfg.HEAD.PARAMS = [[["mlp", {"dims": [64, 8]}], ["siamese_concat_view", {"num_towers": 3}],
                              ["mlp", {"dims": [24, 4]}]],
                             [["mlp", {"dims": [64, 4]}]]]
    model = build_model(model_cfg).eval()
    x = {"patches": torch.randn(6, 3, 8, 8), "images": torch.randn(2, 3, 8, 8)}
    out_patches, out_images = model(x)
    with torch.no_grad():
        tiles = model.trunk(x["patches"], ["res5avg"])[0].flatten(1)
        expected = model.heads[0][2](model.heads[0][0](tiles).reshape(2, 24))
        torch.testing.assert_close(out_patches, expected)
        torch.testing.assert_close(
            out_images, model.heads[1][0](model.trunk(x["images"], ["res5avg"])[0].flatten(1)))
    with pytest.raises(TypeError, match="needs the inputs"):
        model(x["images"])
