"""cutmixup_collator (VISSL's name): mixup and cutmix of each view with soft targets, the view
layouts of the SSL methods, seeded by the batch; the cross-entropy loss on soft targets."""
import pytest
import torch
import torch.nn.functional as F

from ssl_engine.data.collators import build_collator
from ssl_engine.losses import LOSS_REGISTRY

N, C = 6, 5


def samples(views=1, seed=0):
    generator = torch.Generator().manual_seed(seed)
    labels = [0, 1, 2, 3, 4, 1]
    return [{"data": [torch.rand(3, 8, 8, generator=generator) for _ in range(views)],
             "label": [labels[i]] * views, "data_idx": 10 + i, "data_valid": True}
            for i in range(N)]


def test_mixup_blends_images_and_one_hot_targets_with_the_same_weight():
    batch = samples()
    collate = build_collator("cutmixup_collator", {"mixup_alpha": 1.0, "cutmix_alpha": 0.0,
                                                   "label_smoothing": 0.0, "num_classes": C})
    out = collate(batch)
    images = torch.stack([s["data"][0] for s in batch])
    onehot = F.one_hot(torch.tensor([s["label"][0] for s in batch]), C).float()
    lam = out["target"][0, 0].item()  # sample 0 is class 0, its partner (the last) class 1
    assert 0.0 < lam < 1.0
    torch.testing.assert_close(out["input"], lam * images + (1 - lam) * images.flip(0))
    torch.testing.assert_close(out["target"], lam * onehot + (1 - lam) * onehot.flip(0))
    assert out["data_idx"].tolist() == list(range(10, 10 + N))
    again = collate(samples())  # the same batch mixes the same way (worker, resume)
    torch.testing.assert_close(again["input"], out["input"], rtol=0, atol=0)


def test_cutmix_pastes_a_box_and_weighs_targets_by_its_area():
    batch = samples()
    out = build_collator("cutmixup_collator", {"mixup_alpha": 0.0, "cutmix_alpha": 1.0,
                                               "label_smoothing": 0.0, "num_classes": C})(batch)
    images = torch.stack([s["data"][0] for s in batch])
    pasted = (out["input"] != images).any(dim=1)[0]  # pixels of sample 0 taken from its partner
    torch.testing.assert_close(out["input"][0][:, pasted], images.flip(0)[0][:, pasted])
    lam = 1.0 - pasted.float().mean().item()  # the share of sample 0 left
    assert out["target"][0, 0].item() == pytest.approx(lam, abs=1e-6)


def test_ssl_layouts_and_refusals():
    params = {"mixup_alpha": 1.0, "num_classes": C}
    out = build_collator("cutmixup_collator", {**params, "ssl_method": "simclr"})(samples(views=2))
    assert out["input"].shape == (2 * N, 3, 8, 8) and out["target"].shape == (2 * N, C)
    out = build_collator("cutmixup_collator", {**params, "ssl_method": "moco"})(samples(views=2))
    assert out["input"].shape == out["input_momentum"].shape == (N, 3, 8, 8)
    # swav: multicrop_collator's layout, each view mixed as on its own (VISSL's per-view mix)
    crops = samples(views=3)
    for sample in crops:  # two 8x8 views, then a 4x4 one
        sample["data"][2] = sample["data"][2][:, :4, :4]
    out = build_collator("cutmixup_collator", {**params, "ssl_method": "swav",
                                               "label_smoothing": 0.0})(crops)
    assert [tuple(x.shape) for x in out["input"]] == [(2 * N, 3, 8, 8), (N, 3, 4, 4)]
    assert out["target"].shape == (3 * N, C)
    assert out["data_idx"].tolist() == list(range(10, 10 + N)) * 3
    small = torch.stack([s["data"][2] for s in crops])
    lam = out["target"][2 * N, 0].item()  # sample 0 (class 0) of view 2, mixed with the last
    torch.testing.assert_close(out["input"][1], lam * small + (1 - lam) * small.flip(0))
    with pytest.raises(ValueError, match="needs an even batch"):
        build_collator("cutmixup_collator", params)(samples()[:5])
    with pytest.raises(ValueError, match="ssl_method='byol' is not one of"):
        build_collator("cutmixup_collator", {**params, "ssl_method": "byol"})(samples())


def test_cross_entropy_takes_class_probabilities():
    loss = LOSS_REGISTRY["cross_entropy_multiple_output_single_target"].from_config({})
    logits = torch.randn(4, C, generator=torch.Generator().manual_seed(1))
    probs = torch.softmax(torch.randn(4, C, generator=torch.Generator().manual_seed(2)), 1)
    expected = -(probs * torch.log_softmax(logits, 1)).sum(1).mean()
    torch.testing.assert_close(loss([logits, logits], probs), 2 * expected)
