"""DATA.<split>.BATCHED_READS: whole batches read from an in-memory source and their parameters
drawn at once (data/batched_reads.py, data/batch_draws.py): the draws against torchvision's
own per-view draws (two-sample tests), the batches against the per-sample path's rules (any
workers, any batch, a resume give the same rows)."""

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from idx_utils import write_idx
from scipy.stats import ks_2samp

import ssl_engine.losses  # noqa: F401  (derived settings of the config)
import ssl_engine.models  # noqa: F401
from ssl_engine.config import load_config
from ssl_engine.data import build_dataloader, build_dataset
from ssl_engine.data.batch_draws import CounterDraws, row_keys
from ssl_engine.data.batched_reads import check_batched_reads
from ssl_engine.data.device_augmentation import batch_to_device
from ssl_engine.data.device_ops import (BlurOp, ColorJitterOp, ErasingOp, FlipOp, GrayscaleOp,
                                        ResizedCropOp, SolarizeOp)

ROWS = 3000


def batch_and_view_draws(op, shape, seed=0):
    """(draw_batch's parameters for ROWS rows, torchvision's per-view draws for ROWS views)."""
    batched = op.draw_batch(CounterDraws(row_keys(seed, 1, np.arange(ROWS), 0)), shape)
    torch.manual_seed(seed)
    view = torch.empty(()).expand(shape)
    per_view = torch.tensor([op.draw(view) for _ in range(ROWS)], dtype=torch.float64)
    return batched, per_view


@pytest.mark.parametrize("op, shape", [
    (ResizedCropOp(T.RandomResizedCrop(28, scale=(0.3, 1.0))), (3, 28, 28)),
    (ResizedCropOp(T.RandomResizedCrop(16, scale=(0.08, 1.0))), (3, 20, 36)),
    (ErasingOp(0.5), (3, 28, 28)),
    (ColorJitterOp(T.ColorJitter(0.8, 0.8, 0.4, 0.1), 0.8), (3, 8, 8)),
    (BlurOp(3, 0.1, 2.0, p=0.5), (3, 8, 8)),
    (SolarizeOp(0.2), (3, 8, 8)),
    (FlipOp(0.5), (3, 8, 8)),
    (GrayscaleOp(0.2), (3, 8, 8)),
])
def test_batch_draws_follow_each_ops_per_view_distribution(op, shape):
    batched, per_view = batch_and_view_draws(op, shape)
    assert batched.shape == per_view.shape == (ROWS, op.size)
    for column in range(op.size):
        a, b = batched[:, column].numpy(), per_view[:, column].numpy()
        assert abs(a.mean() - b.mean()) <= 0.1 * (b.std() + 1e-3), (column, a.mean(), b.mean())
        if b.std() > 0:
            assert ks_2samp(a, b, method="asymp").pvalue > 1e-3, column
        else:
            assert np.array_equal(a, b)  # a constant column (e.g. a fixed threshold)


def test_crop_draws_fall_back_to_torchvisions_central_crop():
    # every try is too tall for a 20 x 60 image: torchvision's central box of ratio 4/3
    op = ResizedCropOp(T.RandomResizedCrop(16, scale=(0.9, 1.0)))
    batched, per_view = batch_and_view_draws(op, (3, 20, 60))
    assert (batched == torch.tensor([0.0, 16, 20, 27], dtype=torch.float64)).all()
    assert torch.equal(batched, per_view)
    # and every drawn box lies inside the image
    box = ResizedCropOp(T.RandomResizedCrop(16)).draw_batch(
        CounterDraws(row_keys(1, 0, np.arange(500), 0)), (3, 20, 36))
    assert (box[:, 0] + box[:, 2] <= 20).all() and (box[:, 1] + box[:, 3] <= 36).all()
    assert (box[:, 2:] > 0).all()


def test_row_keys_are_a_function_of_seed_epoch_index_and_view():
    keys = row_keys(7, 3, np.arange(100), 0)
    assert len(set(keys.tolist())) == 100
    assert np.array_equal(row_keys(7, 3, [41, 5], 0), keys[[41, 5]])
    for other in (row_keys(8, 3, [5], 0), row_keys(7, 4, [5], 0), row_keys(7, 3, [5], 1)):
        assert other[0] != keys[5]
    uniform = CounterDraws(keys).uniform(4)
    assert uniform.shape == (100, 4) and 0 <= uniform.min() and uniform.max() < 1
    assert abs(uniform.mean().item() - 0.5) < 0.05
    with pytest.raises(ValueError, match="non-negative"):
        row_keys(0, 0, [-1], 0)


def write_fashion(root, count=40):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
    write_idx(root / "train-images-idx3-ubyte.gz", images)
    write_idx(root / "train-labels-idx1-ubyte.gz", np.arange(count) % 10)
    return images


def fashion_cfg(root, *overrides):
    _, cfg = load_config([
        "config=benchmark/fashion_mnist/simclr", f"config.DATA.TRAIN.DATA_PATHS=[{root}]",
        "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8", "config.DATA.TRAIN.DEVICE_CROPS=true",
        "config.DATA.TRAIN.BATCHED_READS=true", *overrides])
    return cfg


def loader_batches(cfg, workers, epoch=1, start_sample=0):
    dataset = build_dataset(cfg, "TRAIN", device_augmentation=True)
    loader = build_dataloader(dataset, cfg.DATA.TRAIN, num_workers=workers, pin_memory=False,
                              epoch=epoch, start_sample=start_sample, seed=cfg.SEED_VALUE)
    return dataset, list(loader)


def test_batched_reads_give_the_same_rows_whatever_the_workers_batch_or_resume(tmp_path):
    images = write_fashion(tmp_path)
    cfg = fashion_cfg(tmp_path)
    dataset, whole = loader_batches(cfg, workers=0)
    assert dataset.batched is not None and len(whole) == 5
    _, with_workers = loader_batches(cfg, workers=2)  # the default 'auto' on 2 cores
    _, resumed = loader_batches(cfg, workers=2, start_sample=16)
    for a, b in zip(whole, with_workers):
        assert torch.equal(a["input"], b["input"]) and torch.equal(a["data_idx"], b["data_idx"])
        assert torch.equal(a["device_params"][0][0], b["device_params"][0][0])
    assert torch.equal(resumed[0]["input"], whole[2]["input"])
    assert torch.equal(resumed[0]["device_params"][0][0], whole[2]["device_params"][0][0])
    first = whole[0]
    # the views are the stored grey images made RGB, view-major; labels follow the source
    index = first["data_idx"][:8].flatten()
    assert torch.equal(first["input"][:8], torch.from_numpy(images)[index][:, None]
                       .expand(-1, 3, -1, -1))
    assert torch.equal(first["input"][8:], first["input"][:8])
    assert torch.equal(first["target"][:8].flatten(), index % 10)
    # a sample's draws do not depend on its batch; they change with the epoch and the view
    alone = dataset.__getitems__([int(index[3])])[0]["device_params"]
    params = first["device_params"][0][0]
    assert torch.equal(alone[0], params[3]) and torch.equal(alone[1], params[11])
    assert not torch.equal(params[3], params[11])
    _, next_epoch = loader_batches(cfg, workers=0, epoch=2)
    assert not torch.equal(next_epoch[0]["device_params"][0][0], params)
    # the device half crops, flips and normalises them
    out = batch_to_device(first, dataset, torch.device("cpu"))["input"]
    assert out.shape == (16, 3, 28, 28) and out.dtype == torch.float32
    assert (params[:, 2] < 28).any() and 0 < params[:, 4].sum() < 16


def test_batched_reads_refusals_name_the_setting(tmp_path):
    write_fashion(tmp_path)
    with pytest.raises(ValueError, match="BATCHED_READS=true needs .*DEVICE_AUGMENTATION=true"):
        check_batched_reads(fashion_cfg(tmp_path, "config.DATA.TRAIN.DEVICE_CROPS=false",
                                        "config.DATA.TRAIN.DEVICE_AUGMENTATION=false"), "TRAIN")
    no_crops = fashion_cfg(tmp_path, "config.DATA.TRAIN.DEVICE_CROPS=false")
    with pytest.raises(ValueError, match="one ImgReplicatePil, but RandomResizedCrop runs in "
                                         "the loader .*DEVICE_CROPS=true"):
        check_batched_reads(no_crops, "TRAIN")  # before launch (engines/train.py)
    with pytest.raises(ValueError, match="one ImgReplicatePil, but RandomResizedCrop"):
        build_dataset(no_crops, "TRAIN", device_augmentation=True)
    _, digits = load_config(["config=quickstart/simclr_device_aug_digits",
                             "config.DATA.TRAIN.BATCHED_READS=true", "config.DATA.TRAIN."
                             "TRANSFORMS=[{name: ImgReplicatePil}, {name: ToTensor}]"])
    with pytest.raises(ValueError, match="holds its images in memory .*reads them one by one"):
        build_dataset(digits, "TRAIN", device_augmentation=True)
