"""DATA.<split>.DEVICE_CROPS: RandomResizedCrop and RandomHorizontalFlip drawn in the workers and
applied batched (data/device_ops.py) against an independent resampling and torchvision."""
import pytest
import torch
import torch.nn.functional as nnf
import torchvision.transforms as T
import torchvision.transforms.functional as F

import ssl_engine.losses  # noqa: F401  (derived settings of the config)
import ssl_engine.models  # noqa: F401
from ssl_engine.config import load_config
from ssl_engine.data import build_dataloader, build_dataset
from ssl_engine.data.device_augmentation import (DeviceAugmentation, DeviceParamsCollator,
                                                 batch_to_device)
from ssl_engine.data.device_ops import ErasingOp, FlipOp, ResizedCropOp, device_ops
from ssl_engine.data.collators.simclr import simclr_collator


def sampled_bilinear(image, row, size):
    """The crop box ``row`` (top, left, height, width) resampled to ``size`` x ``size`` at its
    bins' centres with grid_sample (borders repeated): the reference for enlarged boxes."""
    top, left, height, width = row.tolist()
    centres = torch.arange(size) + 0.5
    ys, xs = top - 0.5 + centres * height / size, left - 0.5 + centres * width / size
    gy, gx = (ys + 0.5) * 2 / image.shape[-2] - 1, (xs + 0.5) * 2 / image.shape[-1] - 1
    grid = torch.stack(torch.meshgrid(gy, gx, indexing="ij")[::-1], dim=-1)[None]
    return nnf.grid_sample(image[None], grid, mode="bilinear", padding_mode="border",
                           align_corners=False)[0]


def test_crop_matches_bilinear_resampling_and_torchvision_inside_the_box():
    torch.manual_seed(0)
    batch = torch.rand(32, 3, 28, 28)
    op = ResizedCropOp(T.RandomResizedCrop(28, scale=(0.3, 1.0)))
    params = torch.tensor([op.draw(view) for view in batch])
    area = params[:, 2] * params[:, 3] / 28 ** 2
    assert 0.3 <= area.min() and area.max() <= 1.0 and area.max() - area.min() > 0.4
    out = op.apply(batch, params)
    assert out.shape == (32, 3, 28, 28)
    expected = torch.stack([sampled_bilinear(i, r, 28) for i, r in zip(batch, params)])
    assert (out - expected).abs().max() < 1e-4
    # torchvision's resize of the cut box agrees away from the box's edges (it repeats the
    # box's edge pixels where the resampling reads the pixels just outside)
    resized = torch.stack([F.resized_crop(i, *r.long().tolist(), [28, 28], antialias=True)
                           for i, r in zip(batch, params)])
    assert (out - resized)[..., 2:-2, 2:-2].abs().max() < 1e-4
    # a shrunk box is averaged, close to torchvision's antialiased resize
    small = ResizedCropOp(T.RandomResizedCrop(12, scale=(0.5, 1.0)))
    params = torch.tensor([small.draw(view) for view in batch])
    shrunk = torch.stack([F.resized_crop(i, *r.long().tolist(), [12, 12], antialias=True)
                          for i, r in zip(batch, params)])
    assert (small.apply(batch, params) - shrunk).abs().mean() < 0.05  # random pixels: ~0.27


def test_flip_matches_torchvision_and_ops_after_a_crop_draw_for_its_size():
    torch.manual_seed(1)
    batch = torch.rand(16, 3, 10, 10)
    params = torch.tensor([FlipOp(0.5).draw(view) for view in batch])
    assert 0 < params.sum() < 16
    out = FlipOp(0.5).apply(batch, params)
    expected = torch.stack([F.hflip(i) if r[0] else i for i, r in zip(batch, params)])
    assert torch.equal(out, expected)
    # an erasing box drawn after a crop to 6x6 fits in 6x6, not in the 40x40 input
    augmentation = DeviceAugmentation([ResizedCropOp(T.RandomResizedCrop(6)),
                                       ErasingOp(1.0, (0.5, 0.9))])
    view = torch.zeros(3, 40, 40, dtype=torch.uint8)
    draws = torch.tensor([augmentation.draw_view(view)[4:] for _ in range(40)])
    assert draws[:, 0].sum() >= 10  # most draws find a box
    for applied, top, left, height, width in draws.tolist():
        if applied:
            assert top + height <= 6 and left + width <= 6 and height * width >= 0.5 * 36 - 6
        else:  # no box in torchvision's 10 tries: the image is left as it is, as there
            assert top == left == height == width == 0


def quickstart(*overrides):
    _, cfg = load_config(["config=quickstart/simclr_device_aug_digits",
                          "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16", *overrides])
    return cfg


CROP_AND_FLIP = ("config.DATA.TRAIN.TRANSFORMS=[{name: ImgReplicatePil, num_times: 2}, "
                 "{name: Resize, size: 16}, "
                 "{name: RandomResizedCrop, size: 16, scale: [0.3, 1.0]}, "
                 "{name: RandomHorizontalFlip}, {name: ToTensor}]")


def test_device_crops_apply_each_rows_drawn_box_and_flip():
    cfg = quickstart(CROP_AND_FLIP, "config.DATA.TRAIN.DEVICE_CROPS=true")
    dataset = build_dataset(cfg, "TRAIN", device_augmentation=True)
    assert [type(t).__name__ for t in dataset.transform.transforms] == [
        "ImgReplicatePil", "Resize"]
    assert [type(op) for op in dataset.device_augmentation.ops] == [ResizedCropOp, FlipOp]
    loader = build_dataloader(dataset, cfg.DATA.TRAIN, num_workers=2, pin_memory=False,
                              epoch=1, start_sample=0, seed=cfg.SEED_VALUE)
    batch = next(iter(loader))
    whole, (params, _) = batch["input"].clone(), batch["device_params"][0]
    assert whole.dtype == torch.uint8 and whole.shape == (32, 3, 16, 16)
    out = batch_to_device(batch, dataset, torch.device("cpu"))["input"]
    assert out.shape == (32, 3, 16, 16) and out.dtype == torch.float32
    # each row: torchvision's resize of its box of the shipped image, flipped if drawn
    expected = []
    for image, (top, left, height, width, flip) in zip(whole.float() / 255, params.tolist()):
        view = F.resized_crop(image, int(top), int(left), int(height), int(width), [16, 16])
        expected.append(F.hflip(view) if flip else view)
    expected = torch.stack(expected)
    inner = (out - expected)[..., 2:-2, 2:-2].abs()
    assert inner.max() < 1e-4 and (out - expected).abs().mean() < 0.02
    assert 0 < params[:, 4].sum() < 32 and (params[:, 2] < 16).any()  # some flips, some crops
    assert (out - whole.float() / 255).abs().mean() > 0.05


def test_device_crops_refusals_name_the_setting():
    with pytest.raises(ValueError, match="DEVICE_CROPS=true needs .*DEVICE_AUGMENTATION=true"):
        build_dataset(quickstart(CROP_AND_FLIP, "config.DATA.TRAIN.DEVICE_AUGMENTATION=false",
                                 "config.DATA.TRAIN.DEVICE_CROPS=true"), "TRAIN",
                      device_augmentation=True)
    with pytest.raises(ValueError, match="DEVICE_CROPS=true but no RandomResizedCrop.*"
                                         "RandomAffine"):  # the quickstart's affine map
        build_dataset(quickstart("config.DATA.TRAIN.DEVICE_CROPS=true"), "TRAIN",
                      device_augmentation=True)
    with pytest.raises(ValueError, match="resizes bilinearly"):
        device_ops(T.RandomResizedCrop(8, interpolation=T.InterpolationMode.NEAREST), crops=True)
    collate = DeviceParamsCollator(simclr_collator, DeviceAugmentation(
        [ResizedCropOp(T.RandomResizedCrop(8))]))
    samples = [{"data": [torch.zeros(3, side, 12, dtype=torch.uint8)], "label": [0],
                "data_idx": [i], "data_valid": [1], "device_params": [torch.zeros(4)]}
               for i, side in enumerate((12, 14))]
    with pytest.raises(ValueError, match=r"share one size.*\(3, 12, 12\).*\(3, 14, 12\)"):
        collate(samples)
