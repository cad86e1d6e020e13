"""DATA.<split>.DEVICE_AUGMENTATION: the photometric ops drawn in the workers and applied batched
(data/device_ops.py, data/device_augmentation.py) against torchvision's per-image transforms."""
import math

import pytest
import torch
import torchvision.transforms as T
import torchvision.transforms.functional as F

import ssl_engine.losses  # noqa: F401  (derived settings of the config)
import ssl_engine.models  # noqa: F401
from ssl_engine.config import load_config
from ssl_engine.data import build_dataloader, build_dataset
from ssl_engine.data.device_augmentation import (DeviceAugmentation, batch_to_device,
                                                 check_device_augmentation)
from ssl_engine.data.device_ops import (BlurOp, ColorJitterOp, ErasingOp, GrayscaleOp,
                                        NormalizeOp, SolarizeOp, device_ops)
from ssl_engine.data.transforms.color_distortion import ImgPilColorDistortion
from ssl_engine.data.transforms.gaussian_blur import ImgPilGaussianBlur
from ssl_engine.data.transforms.solarize import ImgPilRandomSolarize

SIMCLR_JITTER = T.ColorJitter(0.8, 0.8, 0.8, 0.2)


def images(count=12, size=20, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8, generator=generator)


def draws(op, batch, seed=0):
    torch.manual_seed(seed)
    return torch.tensor([op.draw(view) for view in batch], dtype=torch.float32)


def test_colour_jitter_params_fall_in_torchvision_ranges():
    op = ColorJitterOp(SIMCLR_JITTER, p=0.8)
    params = draws(op, images(2000, size=4))
    applied = params[:, 0] > 0
    assert 0.75 < applied.float().mean() < 0.85
    orders = params[applied, 1:5].long()
    assert (orders.sort(dim=1).values == torch.arange(4)).all()  # a permutation per view
    factors = params[applied, 5:9]
    for column, (low, high) in enumerate([(0.2, 1.8), (0.2, 1.8), (0.2, 1.8), (-0.2, 0.2)]):
        values = factors[:, column]
        assert low <= values.min() and values.max() <= high
        assert values.max() - values.min() > 0.9 * (high - low)  # the whole range is used
    assert (params[~applied, 5:9] == torch.tensor([1.0, 1.0, 1.0, 0.0])).all()


def test_other_ops_params_fall_in_their_transforms_ranges():
    batch = images(2000, size=32)
    blur = draws(BlurOp(13, 0.1, 2.0, p=0.5), batch)
    assert 0.45 < (blur[:, 0] > 0).float().mean() < 0.55
    sigmas = blur[blur[:, 0] > 0, 1]
    assert 0.1 <= sigmas.min() and sigmas.max() <= 2.0 and sigmas.max() - sigmas.min() > 1.7
    solar = draws(SolarizeOp(0.2), batch)
    thresholds = solar[solar[:, 0] > 0, 1] * 255
    assert 0.15 < (solar[:, 0] > 0).float().mean() < 0.25
    assert thresholds.min() >= 0 and thresholds.max() <= 256
    assert torch.allclose(thresholds, thresholds.round(), atol=1e-3)  # whole levels
    grey = draws(GrayscaleOp(0.2), batch)
    assert 0.15 < grey[:, 0].mean() < 0.25
    erase = draws(ErasingOp(1.0, (0.02, 0.15), (0.3, 3.3)), batch)
    top, left, height, width = erase[:, 1:].T
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + height <= 32).all() and (left + width <= 32).all()
    area = height * width / 32 ** 2
    assert area.min() >= 0.01 and area.max() <= 0.16  # scale [0.02, 0.15], whole pixels


def per_image_jitter(image, row):
    """torchvision's ColorJitter.forward with the drawn order and factors."""
    if row[0] == 0:
        return image
    adjust = [F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue]
    for which in row[1:5].long().tolist():
        image = adjust[which](image, float(row[5 + which]))
    return image


def per_image(op, image, row):
    """The per-image torchvision transform of ``op`` with the parameters ``row``."""
    if isinstance(op, ColorJitterOp):
        return per_image_jitter(image, row)
    if row.numel() and row[0] == 0:
        return image
    if isinstance(op, GrayscaleOp):
        return F.rgb_to_grayscale(image, 3)
    if isinstance(op, BlurOp):
        return F.gaussian_blur(image, [op.kernel] * 2, [float(row[1])] * 2)
    if isinstance(op, SolarizeOp):
        return F.solarize(image, float(row[1]))
    if isinstance(op, NormalizeOp):
        return F.normalize(image, op.mean.tolist(), op.std.tolist())
    top, left, height, width = row[1:].long().tolist()
    return F.erase(image, top, left, height, width, torch.tensor(op.value, dtype=image.dtype))


@pytest.mark.parametrize("op", [
    ColorJitterOp(SIMCLR_JITTER, p=0.8), ColorJitterOp(T.ColorJitter(0.6, 0.6)),
    GrayscaleOp(0.5), BlurOp(5, 0.1, 2.0), BlurOp(13, 0.1, 2.0, p=0.5), SolarizeOp(0.5),
    SolarizeOp(1.0, threshold=128), NormalizeOp([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ErasingOp(0.7, (0.02, 0.33), (0.3, 3.3), value=0.25)], ids=repr)
def test_batched_op_matches_per_image_transform_with_same_params(op):
    batch = images(16, size=24, seed=1).float() / 255
    params = draws(op, images(16, size=24, seed=1), seed=2)
    out = op.apply(batch.clone(), params)
    expected = torch.stack([per_image(op, image, row) for image, row in zip(batch, params)])
    assert out.shape == expected.shape
    assert (out - expected).abs().max() < 1e-3
    if op.size:  # the op changed something: the comparison is not of two copies of the input
        assert (out - batch).abs().max() > 0.05


def test_recipe_transforms_map_to_device_ops():
    ops = device_ops(ImgPilColorDistortion(1.0))
    assert [type(op) for op in ops] == [ColorJitterOp, GrayscaleOp]
    assert ops[0].p == 0.8 and ops[1].p == 0.2
    blur = device_ops(ImgPilGaussianBlur(0.5, 0.1, 2.0))[0]
    assert (blur.kernel, blur.sigma_min, blur.sigma_max, blur.p) == (13, 0.1, 2.0, 0.5)
    assert device_ops(ImgPilRandomSolarize(0.2))[0].threshold is None
    assert device_ops(T.RandomResizedCrop(8)) is None  # geometry stays in the workers


def quickstart(*overrides):
    _, cfg = load_config(["config=quickstart/simclr_device_aug_digits", *overrides])
    return cfg


def batches(cfg, workers, count, start_sample=0, epoch=1):
    dataset = build_dataset(cfg, "TRAIN", device_augmentation=True)
    loader = build_dataloader(dataset, cfg.DATA.TRAIN, num_workers=workers, pin_memory=False,
                              epoch=epoch, start_sample=start_sample, seed=cfg.SEED_VALUE)
    out = []
    for batch in loader:
        out.append(batch_to_device(batch, dataset, torch.device("cpu"), channels_last=True))
        if len(out) == count:
            return out
    return out


def test_quickstart_batches_are_the_same_with_workers_and_after_a_resume():
    cfg = quickstart("config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=16")
    whole = batches(cfg, workers=0, count=3)
    with_workers = batches(cfg, workers=2, count=3)  # the quickstart's 'auto' on 2 cores
    resumed = batches(cfg, workers=2, count=1, start_sample=32)
    for a, b in zip(whole, with_workers):
        assert torch.equal(a["input"], b["input"]) and torch.equal(a["data_idx"], b["data_idx"])
    assert torch.equal(resumed[0]["input"], whole[2]["input"])
    first = whole[0]["input"]
    assert first.dtype == torch.float32 and first.shape == (32, 3, 16, 16)
    assert -1.0 - 1e-5 <= first.min() and first.max() <= 1.0 + 1e-5  # normalised
    assert first.std() > 0.2
    assert "device_params" not in whole[0]


def test_without_the_option_nothing_changes():
    cfg = quickstart("config.DATA.TRAIN.DEVICE_AUGMENTATION=false")
    dataset = build_dataset(cfg, "TRAIN", device_augmentation=True)
    sample = dataset[5]
    assert dataset.device_augmentation is None and "device_params" not in sample
    assert sample["data"][0].dtype == torch.float32
    assert len(dataset.transform.transforms) == len(cfg.DATA.TRAIN.TRANSFORMS)
    # a dataset built by extraction or evaluation (not asking for it) ignores the option
    on = build_dataset(quickstart(), "TRAIN")
    assert on.device_augmentation is None and on[5]["data"][0].dtype == torch.float32


def test_workers_ship_uint8_views_and_the_device_runs_the_photometric_tail():
    dataset = build_dataset(quickstart(), "TRAIN", device_augmentation=True)
    names = [type(t).__name__ for t in dataset.transform.transforms]
    assert names == ["ImgReplicatePil", "Resize", "RandomResizedCrop", "RandomAffine"]
    assert [type(op) for op in dataset.device_augmentation.ops] == [
        ColorJitterOp, BlurOp, NormalizeOp, ErasingOp]
    sample = dataset[0]
    assert [view.dtype for view in sample["data"]] == [torch.uint8, torch.uint8]
    assert [len(p) for p in sample["device_params"]] == [dataset.device_augmentation.size] * 2


def test_moco_collator_gets_the_rows_of_simclr_collator_split_into_queries_and_keys():
    """Each view's augmentation depends on (seed, epoch, index, view) only, so MoCo's queries
    and keys are the two halves of SimCLR's view-major batch."""
    size = "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8"
    simclr = batches(quickstart(size), workers=0, count=1)[0]["input"]
    moco = batches(quickstart(size, "config.DATA.TRAIN.COLLATE_FUNCTION=moco_collator"),
                   workers=0, count=1)[0]
    assert moco["input"].shape == moco["input_momentum"].shape == (8, 3, 16, 16)
    assert torch.equal(moco["input"], simclr[:8])
    assert torch.equal(moco["input_momentum"], simclr[8:])
    assert not torch.equal(moco["input"], moco["input_momentum"])


def test_unsupported_settings_are_refused_with_the_key():
    siamese = quickstart("config.DATA.TRAIN.COLLATE_FUNCTION=siamese_collator")
    with pytest.raises(ValueError, match="DATA.TRAIN.DEVICE_AUGMENTATION.*collators"):
        check_device_augmentation(siamese, "TRAIN")  # before launch (engines/train.py)
    with pytest.raises(ValueError, match="DATA.TRAIN.DEVICE_AUGMENTATION.*collators"):
        build_dataset(siamese, "TRAIN", device_augmentation=True)
    with pytest.raises(ValueError, match="no device counterpart"):
        build_dataset(quickstart("config.DATA.TRAIN.TRANSFORMS=[{name: RandomResizedCrop, "
                                 "size: 16}]"), "TRAIN", device_augmentation=True)


def test_device_augmentation_of_a_uint8_batch_is_float_in_unit_range():
    augmentation = DeviceAugmentation([GrayscaleOp(1.0)])
    batch = images(4)
    out = augmentation(batch, torch.ones(4, 1))
    assert out.dtype == torch.float32 and 0 <= out.min() and out.max() <= 1
    assert torch.allclose(out[:, 0], out[:, 1]) and not math.isclose(out.std().item(), 0)
