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
from ssl_engine.data.device_ops import ErasingOp, FlipOp, MultiCropOp, ResizedCropOp, device_ops
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


MULTICROP = ("config.DATA.TRAIN.TRANSFORMS=[{name: Resize, size: 16}, "
             "{name: ImgPilToMultiCrop, total_num_crops: 5, num_crops: [2, 1, 2], "
             "size_crops: [16, 10, 10], crop_scales: [[0.5, 1.0], [0.3, 0.5], [0.1, 0.3]]}, "
             "{name: RandomHorizontalFlip}, {name: ToTensor}]")
MULTICROP_SETTINGS = (MULTICROP, "config.DATA.TRAIN.DEVICE_CROPS=true",
                      "config.DATA.TRAIN.COLLATE_FUNCTION=multicrop_collator")


def test_device_multicrop_crops_each_groups_views_from_the_one_shipped_image():
    cfg = quickstart(*MULTICROP_SETTINGS)
    dataset = build_dataset(cfg, "TRAIN", device_augmentation=True)
    # the resize stays in the workers; the multi-crop starts the device's tail
    assert [type(t).__name__ for t in dataset.transform.transforms] == ["Resize"]
    assert [type(op) for op in dataset.device_augmentation.ops] == [MultiCropOp, FlipOp]
    loader = build_dataloader(dataset, cfg.DATA.TRAIN, num_workers=2, pin_memory=False,
                              epoch=1, start_sample=0, seed=cfg.SEED_VALUE)
    batch = next(iter(loader))
    [whole] = [view.clone() for view in batch["input"]]  # each image once, not 5 copies
    assert whole.dtype == torch.uint8 and whole.shape == (16, 3, 16, 16)
    groups = [params for params, _ in batch["device_params"]]
    assert [len(params) for params in groups] == [32, 16, 32]
    target, data_idx = batch["target"].clone(), batch["data_idx"].clone()
    out = batch_to_device(batch, dataset, torch.device("cpu"))
    # the two groups of 10 x 10 crops are joined, as multicrop_collator joins such views
    assert [tuple(t.shape) for t in out["input"]] == [(32, 3, 16, 16), (48, 3, 10, 10)]
    assert torch.equal(out["target"], target) and len(data_idx) == 80
    # each group's boxes come from its own scale range (torchvision rounds the sides)
    for params, (low, high) in zip(groups, ((0.5, 1.0), (0.3, 0.5), (0.1, 0.3))):
        area = params[:, 2] * params[:, 3] / 16 ** 2
        assert low - 0.06 <= area.min() and area.max() <= high + 0.06
    # each row: torchvision's resize of its box of the shipped image, flipped if drawn
    rows = torch.cat(groups)
    for output, first, size in ((out["input"][0], 0, 16), (out["input"][1], 32, 10)):
        expected = []
        for row, (top, left, height, width, flip) in enumerate(
                rows[first:first + len(output)].tolist(), start=first):
            image = whole[row % 16].float() / 255  # view-major rows: row r shows image r % 16
            view = F.resized_crop(image, int(top), int(left), int(height), int(width),
                                  [size, size], antialias=True)
            expected.append(F.hflip(view) if flip else view)
        difference = (output - torch.stack(expected)).abs()
        enlarged = (rows[first:first + len(output), 2:4] <= size).all(dim=1)
        assert difference[enlarged][..., 2:-2, 2:-2].max() < 1e-4
        assert difference.mean() < 0.03


def test_device_multicrop_batched_reads_draw_each_view_by_its_group(tmp_path):
    from test_batched_reads import fashion_cfg, loader_batches, write_fashion

    write_fashion(tmp_path)
    cfg = fashion_cfg(tmp_path, MULTICROP.replace("{name: Resize, size: 16}, ", ""),
                      "config.DATA.TRAIN.COLLATE_FUNCTION=multicrop_collator")
    dataset, whole = loader_batches(cfg, workers=0)
    _, with_workers = loader_batches(cfg, workers=2)
    first = whole[0]
    assert [len(params) for params, _ in first["device_params"]] == [16, 8, 16]
    for a, b in zip(whole, with_workers):
        for (pa, _), (pb, _) in zip(a["device_params"], b["device_params"]):
            assert torch.equal(pa, pb)
    # a sample's views: its group's box sizes; the draws differ view to view
    alone = dataset.__getitems__([int(first["data_idx"][0])])[0]["device_params"]
    params = torch.cat([params for params, _ in first["device_params"]])
    assert all(torch.equal(alone[v], params[8 * v]) for v in range(5))
    area = params[:, 2] * params[:, 3] / 28 ** 2
    assert area[:16].min() >= 0.45 and area[24:].max() <= 0.35
    out = batch_to_device(first, dataset, torch.device("cpu"), channels_last=True)["input"]
    assert [tuple(t.shape) for t in out] == [(16, 3, 16, 16), (24, 3, 10, 10)]


def test_device_multicrop_refusals_name_the_setting(tmp_path):
    with pytest.raises(ValueError, match="ImgPilToMultiCrop works with .*multicrop_collator"):
        build_dataset(quickstart(MULTICROP, "config.DATA.TRAIN.DEVICE_CROPS=true"), "TRAIN",
                      device_augmentation=True)
    augmentation = build_dataset(quickstart(*MULTICROP_SETTINGS), "TRAIN",
                                 device_augmentation=True).device_augmentation
    view = torch.zeros(3, 16, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="makes the views of one image.*made 2 views"):
        augmentation.draw([view, view])
    with pytest.raises(TypeError, match="planned by resolution group"):
        augmentation.plan(torch.zeros(4, augmentation.size))
    with pytest.raises(TypeError, match="augmented group by group"):
        augmentation(torch.zeros(4, 3, 16, 16, dtype=torch.uint8), torch.zeros(4, 5))
    from test_batched_reads import fashion_cfg, write_fashion

    write_fashion(tmp_path)
    with pytest.raises(ValueError, match="BATCHED_READS=true needs every transform before the "
                                         "device tail.*Resize runs in the loader"):
        build_dataset(fashion_cfg(tmp_path, MULTICROP,
                                  "config.DATA.TRAIN.COLLATE_FUNCTION=multicrop_collator"),
                      "TRAIN", device_augmentation=True)


def test_dino_recipe_trains_on_device_multicrop_views(tmp_path):
    """Fashion-MNIST's DINO recipe with 2 global and 3 local views cropped on the device: the
    loss takes its 5 crops from the transforms and sees both groups (a term per teacher crop,
    each against the student's 4 other views)."""
    from engine_utils import metrics, run_engine
    from test_benchmarks import write_fashion_idx

    write_fashion_idx(tmp_path, "train", 48, seed=0)
    write_fashion_idx(tmp_path, "t10k", 16, seed=1)
    transforms = ("config.DATA.TRAIN.TRANSFORMS=[{name: ImgPilToMultiCrop, total_num_crops: 5, "
                  "num_crops: [2, 3], size_crops: [28, 12], "
                  "crop_scales: [[0.3, 1.0], [0.05, 0.3]]}, {name: RandomHorizontalFlip}, "
                  "{name: ColorJitter, brightness: 0.8, contrast: 0.8}, {name: ToTensor}, "
                  "{name: Normalize, mean: [0.3, 0.3, 0.3], std: [0.35, 0.35, 0.35]}]")
    cfg = run_engine(tmp_path / "run", [
        transforms, f"config.DATA.TRAIN.DATA_PATHS=[{tmp_path}]",
        f"config.DATA.TEST.DATA_PATHS=[{tmp_path}]", "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16",
        "config.OPTIMIZER.num_epochs=2", "config.LOG_FREQUENCY=1"],
        config="config=benchmark/fashion_mnist/dino")
    assert cfg.LOSS.dino_loss.num_crops == 5
    steps = [m for m in metrics(tmp_path / "run") if m.get("phase") == "train"]
    assert [m["iteration"] for m in steps] == list(range(1, 7))
    for step in steps:
        assert set(step["loss_terms"]) == {"teacher_crop0", "teacher_crop1"}
        assert all(0 < term < 10 for term in step["loss_terms"].values()), step
        assert step["views_per_sec"] == pytest.approx(5 * step["images_per_sec"], rel=1e-3)
