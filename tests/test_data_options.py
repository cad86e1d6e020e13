"""VISSL's data options: DATA_LIMIT_SAMPLING, MMAP_MODE, the torchvision_dataset source, the
dataset catalog, COPY_TO_LOCAL_DISK and the unreadable-image policy."""
import json
import logging
import os
import pickle

import numpy as np
import pytest

from ssl_engine.data import build_dataloader, build_dataset, check_data_paths
from ssl_engine.data.catalog import resolve_dataset_names
from ssl_engine.data.loader import stop_workers
from ssl_engine.data.datasources import ImageLoadError
from ssl_engine.data.local_copy import copy_once, local_path
from ssl_engine.engines.launcher import main
from ssl_engine.utils.errors import ConfigError
from idx_utils import write_idx
from test_data_sources import make_cfg, noise, write_png


def image_folder(root, per_class=4, classes=("a", "b", "c"), size=6):
    """root/<class>/<i>.png of distinct noise; returns the pixels in ImageFolder order."""
    pixels = []
    for c, name in enumerate(classes):
        for i in range(per_class):
            array = noise(100 * c + i, size)
            write_png(os.path.join(root, name, f"{i}.png"), array)
            pixels.append(array)
    return pixels


# ---- DATA_LIMIT with DATA_LIMIT_SAMPLING ----------------------------------------------------


def vissl_random_subset(total, count, skip, seed):
    """The draw VISSL makes: numpy's global generator seeded, then a choice without replacement."""
    state = np.random.get_state()
    np.random.seed(seed)
    drawn = np.random.choice(total, size=skip + count, replace=False)
    np.random.set_state(state)
    return drawn[skip:]


def test_data_limit_is_vissls_seeded_random_subset():
    sampling = {"SEED": 7, "IS_BALANCED": False, "SKIP_NUM_SAMPLES": 0}
    cfg = make_cfg(DATA_SOURCES=["digits"], DATA_LIMIT=30, DATA_LIMIT_SAMPLING=sampling)
    dataset = build_dataset(cfg, "TRAIN")
    assert len(dataset) == 30
    expected = vissl_random_subset(1257, 30, 0, 7)
    assert dataset.subset.tolist() == expected.tolist()
    assert sorted(expected.tolist()) != list(range(30))  # not the first 30
    for position in (0, 29):  # position i reads source sample subset[i], with its label
        assert dataset[position]["label"][0] == dataset.source[int(expected[position])][1]
    again = build_dataset(cfg, "TRAIN")  # what any other rank or worker computes
    assert again.subset.tolist() == expected.tolist()
    skipped = build_dataset(make_cfg(DATA_SOURCES=["digits"], DATA_LIMIT=30, DATA_LIMIT_SAMPLING={
        **sampling, "SKIP_NUM_SAMPLES": 30}), "TRAIN")
    assert skipped.subset.tolist() == vissl_random_subset(1257, 30, 30, 7).tolist()
    assert not set(skipped.subset.tolist()) & set(expected.tolist())


def test_balanced_subset_has_equal_classes_from_the_right_class():
    sampling = {"SEED": 3, "IS_BALANCED": True, "SKIP_NUM_SAMPLES": 5}
    cfg = make_cfg(DATA_SOURCES=["digits"], DATA_LIMIT=43, DATA_LIMIT_SAMPLING=sampling)
    dataset = build_dataset(cfg, "TRAIN")
    labels = dataset.source.labels()
    kept = dataset.subset
    assert len(kept) == 43 and len(set(kept.tolist())) == 43
    counts = np.bincount(labels[kept], minlength=10)
    assert counts.tolist() == [5, 5, 5, 4, 4, 4, 4, 4, 4, 4]  # 43 = 10 * 4 + 3
    # independently: per class, VISSL's draw from one generator in sorted class order
    rng = np.random.RandomState(3)
    expected = []
    for label in range(10):
        members = np.flatnonzero(labels == label)
        keep, drop = counts[label], 1 if label < 5 else 0  # 5 skipped = one in each of 5 classes
        expected += rng.choice(members, size=keep + drop, replace=False)[drop:].tolist()
    assert kept.tolist() == expected


def test_impossible_limits_are_refused_naming_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"config.DATA.TRAIN.DATA_LIMIT must be -1 .* got 0"):
        check_data_paths(make_cfg(DATA_SOURCES=["digits"], DATA_LIMIT=0), "TRAIN")
    np.save(tmp_path / "files.npy", np.array([str(tmp_path / "x.png")]))
    cfg = make_cfg(DATA_SOURCES=["disk_filelist"], DATA_PATHS=[str(tmp_path / "files.npy")],
                   DATA_LIMIT=1, DATA_LIMIT_SAMPLING={"SEED": 0, "IS_BALANCED": True,
                                                      "SKIP_NUM_SAMPLES": 0})
    with pytest.raises(ValueError, match="IS_BALANCED=true needs the labels .*LABEL_PATHS"):
        check_data_paths(cfg, "TRAIN")
    with pytest.raises(ValueError, match="DATA_LIMIT=5 is below the number of classes"):
        build_dataset(make_cfg(DATA_SOURCES=["digits"], DATA_LIMIT=5, DATA_LIMIT_SAMPLING={
            "SEED": 0, "IS_BALANCED": True, "SKIP_NUM_SAMPLES": 0}), "TRAIN")


# ---- MMAP_MODE -------------------------------------------------------------------------------


def test_mmap_mode_maps_the_filelists_and_reads_the_same_samples(tmp_path):
    pixels = image_folder(tmp_path / "img", per_class=2)
    paths = sorted(str(p) for p in (tmp_path / "img").rglob("*.png"))
    np.save(tmp_path / "files.npy", np.array(paths))
    np.save(tmp_path / "labels.npy", np.array([5, 6, 7, 8, 9, 10], dtype=np.int64))
    samples = {}
    for mmap in (True, False):
        cfg = make_cfg(DATA_SOURCES=["disk_filelist"], DATA_PATHS=[str(tmp_path / "files.npy")],
                       LABEL_PATHS=[str(tmp_path / "labels.npy")], MMAP_MODE=mmap)
        source = build_dataset(cfg, "TRAIN").source
        assert isinstance(source.image_paths, np.memmap) is mmap
        assert isinstance(source.label_array, np.memmap) is mmap
        samples[mmap] = [(np.asarray(source[i][0]), source[i][1]) for i in range(6)]
    for (a, la), (b, lb), expected in zip(samples[True], samples[False], pixels):
        assert np.array_equal(a, expected) and np.array_equal(b, expected)
    assert [s[1] for s in samples[True]] == [s[1] for s in samples[False]] == [5, 6, 7, 8, 9, 10]


def test_filelist_paths_written_elsewhere_are_read_with_the_prefix_rewritten(tmp_path):
    pixels = image_folder(tmp_path / "img", per_class=1)
    # the list was written on a machine where the images lay under /mnt/old/data
    listed = [f"/mnt/old/data/{name}/0.png" for name in ("a", "b")] + [
        str(tmp_path / "img" / "c" / "0.png")]  # no prefix to rewrite: read as listed
    np.save(tmp_path / "files.npy", np.array(listed))
    cfg = make_cfg(DATA_SOURCES=["disk_filelist"], DATA_PATHS=[str(tmp_path / "files.npy")],
                   REMOVE_IMG_PATH_PREFIX="/mnt/old/data", NEW_IMG_PATH_PREFIX=str(tmp_path / "img"))
    source = build_dataset(cfg, "TRAIN").source
    assert source.image_path(0) == str(tmp_path / "img" / "a" / "0.png")
    for index, expected in enumerate(pixels):
        assert np.array_equal(np.asarray(source[index][0]), expected)


# ---- torchvision_dataset ---------------------------------------------------------------------


def cifar_batch(path, images, labels, label_key):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    data = images.transpose(0, 3, 1, 2).reshape(len(images), -1)  # rows of R, G, B planes
    with open(path, "wb") as f:
        pickle.dump({"data": data, label_key: list(labels)}, f)


def torchvision_cfg(split, name, root):
    return make_cfg(split, DATA_SOURCES=["torchvision_dataset"], DATA_PATHS=[str(root)],
                    DATASET_NAMES=[name])


def read_all(dataset):
    return [(np.asarray(dataset.source[i][0]), dataset[i]["label"][0]) for i in range(len(dataset))]


def test_cifar10_and_cifar100_pickled_batches(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(10, 32, 32, 3), dtype=np.uint8)
    for i in range(5):  # five training batches of two images
        cifar_batch(tmp_path / "cifar-10-batches-py" / f"data_batch_{i + 1}",
                    images[2 * i:2 * i + 2], [i, 9 - i], "labels")
    cifar_batch(tmp_path / "cifar-10-batches-py" / "test_batch", images[:3], [4, 5, 6], "labels")
    train = read_all(build_dataset(torchvision_cfg("TRAIN", "CIFAR10", tmp_path), "TRAIN"))
    assert [label for _, label in train] == [0, 9, 1, 8, 2, 7, 3, 6, 4, 5]
    assert all(np.array_equal(img, images[i]) for i, (img, _) in enumerate(train))
    test = read_all(build_dataset(torchvision_cfg("TEST", "CIFAR10", tmp_path), "TEST"))
    assert [label for _, label in test] == [4, 5, 6]
    assert np.array_equal(test[2][0], images[2])

    cifar_batch(tmp_path / "cifar-100-python" / "train", images[:4], [99, 0, 42, 7], "fine_labels")
    cifar_batch(tmp_path / "cifar-100-python" / "test", images[4:6], [1, 2], "fine_labels")
    train = read_all(build_dataset(torchvision_cfg("TRAIN", "CIFAR100", tmp_path), "TRAIN"))
    assert [label for _, label in train] == [99, 0, 42, 7]
    assert np.array_equal(train[3][0], images[3])
    test = read_all(build_dataset(torchvision_cfg("TEST", "CIFAR100", tmp_path), "TEST"))
    assert [label for _, label in test] == [1, 2] and np.array_equal(test[0][0], images[4])


def test_stl10_and_mnist_binary_files(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(3, 96, 96, 3), dtype=np.uint8)
    folder = tmp_path / "stl10_binary"
    folder.mkdir()
    # STL-10 stores each channel column-major: [N, C, W, H]
    images.transpose(0, 3, 2, 1).tofile(folder / "train_X.bin")
    np.array([1, 10, 4], dtype=np.uint8).tofile(folder / "train_y.bin")
    train = read_all(build_dataset(torchvision_cfg("TRAIN", "STL10", tmp_path), "TRAIN"))
    assert [label for _, label in train] == [0, 9, 3]
    assert all(np.array_equal(img, images[i]) for i, (img, _) in enumerate(train))

    grey = rng.integers(0, 256, size=(2, 28, 28), dtype=np.uint8)
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    header = lambda ndim, shape: (0x0800 + ndim).to_bytes(4, "big") + b"".join(  # noqa: E731
        n.to_bytes(4, "big") for n in shape)
    (raw / "t10k-images-idx3-ubyte").write_bytes(header(3, grey.shape) + grey.tobytes())
    (raw / "t10k-labels-idx1-ubyte").write_bytes(header(1, (2,)) + bytes([7, 3]))
    test = read_all(build_dataset(torchvision_cfg("TEST", "MNIST", tmp_path), "TEST"))
    assert [label for _, label in test] == [7, 3]
    assert np.array_equal(test[1][0], np.stack([grey[1]] * 3, axis=-1))


def test_fashion_mnist_gzipped_in_the_root_or_unpacked_in_torchvisions_folder(tmp_path):
    """Debian's layout (the .gz files in the root) and torchvision's (FashionMNIST/raw,
    unpacked) both read; the grey images come out RGB, the labels in file order."""
    rng = np.random.default_rng(2)
    grey = rng.integers(0, 256, size=(3, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", grey)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.array([9, 0, 4]))
    train = read_all(build_dataset(torchvision_cfg("TRAIN", "FASHION_MNIST", tmp_path), "TRAIN"))
    assert [label for _, label in train] == [9, 0, 4]
    assert all(np.array_equal(img, np.stack([grey[i]] * 3, axis=-1))
               for i, (img, _) in enumerate(train))
    raw = tmp_path / "other" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    write_idx(raw / "t10k-images-idx3-ubyte", grey[:2])
    write_idx(raw / "t10k-labels-idx1-ubyte", np.array([5, 6]))
    test = read_all(build_dataset(torchvision_cfg("TEST", "FASHION_MNIST", tmp_path / "other"),
                                  "TEST"))
    assert [label for _, label in test] == [5, 6]
    assert np.array_equal(test[1][0][..., 0], grey[1])
    # a cut file is refused, naming it
    write_idx(raw / "t10k-labels-idx1-ubyte", np.array([5, 6]))
    (raw / "t10k-images-idx3-ubyte").write_bytes(
        (raw / "t10k-images-idx3-ubyte").read_bytes()[:-10])
    with pytest.raises(ValueError, match="t10k-images-idx3-ubyte holds 1558 bytes .* cut"):
        build_dataset(torchvision_cfg("TEST", "FASHION_MNIST", tmp_path / "other"), "TEST")


def test_torchvision_dataset_refusals(tmp_path):
    with pytest.raises(ValueError, match=r"DATASET_NAMES\[0\]='ImageNet': the torchvision_dataset "
                                         "source reads one of CIFAR10, CIFAR100, STL10, MNIST, "
                                         "FASHION_MNIST"):
        check_data_paths(torchvision_cfg("TRAIN", "ImageNet", tmp_path), "TRAIN")
    missing = tmp_path / "cifar-10-batches-py" / "data_batch_1"
    with pytest.raises(FileNotFoundError, match=f"{missing} does not exist .*never downloaded"):
        build_dataset(torchvision_cfg("TRAIN", "CIFAR10", tmp_path), "TRAIN")


# ---- dataset catalog -------------------------------------------------------------------------


def write_catalog(path, entries):
    path.write_text(json.dumps(entries))
    return str(path)


def test_catalog_fills_paths_sources_and_existing_labels(tmp_path, monkeypatch):
    monkeypatch.delenv("SSL_ENGINE_DATASET_CATALOG_PATH", raising=False)
    monkeypatch.delenv("VISSL_DATASET_CATALOG_PATH", raising=False)
    image_folder(tmp_path / "train")
    np.save(tmp_path / "val.npy", np.array(["a.png"]))
    np.save(tmp_path / "val_labels.npy", np.array([0]))
    catalog = write_catalog(tmp_path / "catalog.json", {
        "mine": {"train": [str(tmp_path / "train"), "<lbl_path>"],
                 "val": [str(tmp_path / "val.npy"), str(tmp_path / "val_labels.npy")]},
        "CIFAR10": {"train": [str(tmp_path), "<unused>"], "val": [str(tmp_path), "<unused>"]}})
    cfg = make_cfg(DATASET_NAMES=["mine"])
    cfg.DATA.TEST.DATASET_NAMES = ["mine"]
    cfg.DATA.DATASET_CATALOG_PATH = catalog
    for split in ("TRAIN", "TEST"):
        resolve_dataset_names(cfg, split)
    assert cfg.DATA.TRAIN.DATA_PATHS == [str(tmp_path / "train")]
    assert cfg.DATA.TRAIN.DATA_SOURCES == ["disk_folder"]
    assert cfg.DATA.TRAIN.LABEL_PATHS == []  # "<lbl_path>" is no file
    assert cfg.DATA.TEST.DATA_SOURCES == ["disk_filelist"]
    assert cfg.DATA.TEST.LABEL_PATHS == [str(tmp_path / "val_labels.npy")]
    assert len(build_dataset(cfg, "TRAIN")) == 12

    # the catalog from VISSL's environment variable; ours wins over it, the config key over both
    cfg = make_cfg(DATASET_NAMES=["CIFAR10"])
    monkeypatch.setenv("VISSL_DATASET_CATALOG_PATH", catalog)
    resolve_dataset_names(cfg, "TRAIN")
    assert cfg.DATA.TRAIN.DATA_SOURCES == ["torchvision_dataset"]
    assert cfg.DATA.TRAIN.DATA_PATHS == [str(tmp_path)]
    other = write_catalog(tmp_path / "other.json", {"x": {"train": ["/x", ""]}})
    monkeypatch.setenv("SSL_ENGINE_DATASET_CATALOG_PATH", other)
    with pytest.raises(ConfigError, match=f"not in the dataset catalog {other}, which has: x"):
        resolve_dataset_names(make_cfg(DATASET_NAMES=["CIFAR10"]), "TRAIN")
    cfg = make_cfg(DATASET_NAMES=["CIFAR10"])
    cfg.DATA.DATASET_CATALOG_PATH = catalog
    resolve_dataset_names(cfg, "TRAIN")
    assert cfg.DATA.TRAIN.DATA_PATHS == [str(tmp_path)]
    # given paths, or a source without paths: the catalog is not read
    cfg = make_cfg(DATASET_NAMES=["absent"], DATA_SOURCES=["synthetic"])
    resolve_dataset_names(cfg, "TRAIN")
    assert cfg.DATA.TRAIN.DATA_PATHS == []


def test_unknown_dataset_name_is_refused_before_launch(tmp_path, monkeypatch, capsys):
    catalog = write_catalog(tmp_path / "catalog.json", {
        "imagenet1k_folder": {"train": ["/a", ""], "val": ["/b", ""]},
        "places205_folder": {"train": ["/c", ""], "val": ["/d", ""]}})
    monkeypatch.setenv("SSL_ENGINE_DATASET_CATALOG_PATH", catalog)
    code = main(["config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={tmp_path}/out",
                 "config.DATA.TRAIN.DATA_SOURCES=[disk_folder]",
                 "config.DATA.TRAIN.DATASET_NAMES=[imagenet22k]"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "error: config.DATA.TRAIN.DATASET_NAMES[0]='imagenet22k' is not in the dataset catalog "
        f"{catalog}, which has: imagenet1k_folder, places205_folder")
    assert not (tmp_path / "out").exists()


# ---- COPY_TO_LOCAL_DISK ----------------------------------------------------------------------


def test_copy_to_local_disk_reads_a_complete_copy_made_once(tmp_path):
    pixels = image_folder(tmp_path / "data" / "train", per_class=2)
    dest = tmp_path / "local"
    cfg = make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[str(tmp_path / "data" / "train")],
                   COPY_TO_LOCAL_DISK=True, COPY_DESTINATION_DIR=str(dest))
    dataset = build_dataset(cfg, "TRAIN")
    copy = local_path(str(tmp_path / "data" / "train"), str(dest))
    assert os.path.isdir(copy) and os.listdir(dest) == [os.path.basename(copy)]  # no leftovers
    assert cfg.DATA.TRAIN.DATA_PATHS == [str(tmp_path / "data" / "train")]  # config unchanged
    os.rename(tmp_path / "data", tmp_path / "gone")  # only the copy remains readable
    assert all(np.array_equal(np.asarray(dataset.source[i][0]), pixels[i]) for i in range(6))
    marker = os.path.join(copy, "a", "0.png")
    before = os.stat(marker).st_mtime_ns
    os.rename(tmp_path / "gone", tmp_path / "data")
    assert copy_once(str(tmp_path / "data" / "train"), str(dest)) == copy  # reused, not redone
    assert os.stat(marker).st_mtime_ns == before
    # a same-named folder elsewhere gets its own copy
    image_folder(tmp_path / "other" / "train", per_class=1)
    assert copy_once(str(tmp_path / "other" / "train"), str(dest)) != copy


# ---- unreadable images -----------------------------------------------------------------------


def folder_with_bad_files(root, bad):
    """Eight images in one class folder; the positions in ``bad`` hold bytes that are no image."""
    for i in range(8):
        path = os.path.join(root, "c", f"{i}.png")
        write_png(path, noise(i))
        if i in bad:
            with open(path, "wb") as f:
                f.write(b"not an image")
    return make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[str(root)],
                    LABEL_TYPE="sample_index")


def test_unreadable_image_stops_at_the_first_by_default(tmp_path):
    cfg = folder_with_bad_files(tmp_path, bad={3})
    dataset = build_dataset(cfg, "TRAIN")
    bad = tmp_path / "c" / "3.png"
    with pytest.raises(ImageLoadError) as failed:
        dataset[3]
    assert str(failed.value) == (
        f"cannot read image {bad}: not an image file Pillow can decode (cannot identify image "
        "file) (index 3 of config.DATA.TRAIN); set config.DATA.TRAIN.ENABLE_QUEUE_DATASET=true "
        "to skip unreadable images, each replaced by the next readable sample (up to "
        "config.DATA.TRAIN.MAX_INVALID_IMAGES=100)")


def loader_error(dataset, cfg, workers):
    """The error iterating a loader of ``dataset`` over batches of 2 in order raises."""
    cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA = 2
    loader = build_dataloader(dataset, cfg.DATA.TRAIN, num_workers=workers, pin_memory=False,
                              epoch=0, shuffle=False)
    iterator = iter(loader)
    try:
        with pytest.raises(ImageLoadError) as failed:
            list(iterator)
    finally:
        stop_workers(iterator)  # as the trainer does (else the collector stops them, slowly)
    return failed.value


@pytest.mark.parametrize("workers", [1, 2])
def test_loader_workers_report_an_unreadable_image_as_without_workers(tmp_path, workers):
    cfg = folder_with_bad_files(tmp_path, bad={5})
    dataset = build_dataset(cfg, "TRAIN")
    with pytest.raises(ImageLoadError) as in_this_process:
        dataset[5]
    assert str(loader_error(dataset, cfg, workers)) == str(in_this_process.value)
    assert str(loader_error(dataset, cfg, 0)) == str(in_this_process.value)


def test_one_message_error_survives_torchs_report_of_a_worker_exception():
    from torch.utils.data._utils import ExceptionWrapper

    message = "cannot read image /data/a b.png: no such file\nsecond line: of the message"
    try:
        try:
            raise KeyError("the cause")
        except KeyError as cause:
            raise ImageLoadError(message) from cause
    except ImageLoadError:
        report = ExceptionWrapper(where="in DataLoader worker process 3")
    with pytest.raises(ImageLoadError) as reraised:
        report.reraise()  # what torch does in the main process
    assert str(reraised.value) == message and reraised.value.args == (message,)
    assert str(ImageLoadError("Caught nothing: an ordinary message")) == \
        "Caught nothing: an ordinary message"


def test_queue_dataset_substitutes_counts_logs_and_stops_beyond_the_limit(tmp_path, caplog):
    cfg = folder_with_bad_files(tmp_path, bad={2, 3, 6})
    cfg.DATA.TRAIN.ENABLE_QUEUE_DATASET = True
    cfg.DATA.TRAIN.MAX_INVALID_IMAGES = 2
    dataset = build_dataset(cfg, "TRAIN")
    with caplog.at_level(logging.WARNING, logger="ssl_engine.data.ssl_dataset"):
        sample = dataset[2]  # 2 and 3 unreadable: sample 4 in their place
    assert sample["data_idx"] == 4 and sample["label"] == [4] and sample["data_valid"] is False
    assert np.allclose(sample["data"][0].numpy().transpose(1, 2, 0) * 255, noise(4), atol=0.5)
    assert dataset.invalid_count() == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2 and str(tmp_path / "c" / "3.png") in warnings[1]
    assert dataset[3]["data_idx"] == 4 and dataset.invalid_count() == 2  # known files: no recount
    assert dataset[5]["data_valid"] is True
    with pytest.raises(ImageLoadError, match="3 unreadable images in config.DATA.TRAIN, more than "
                                             "config.DATA.TRAIN.MAX_INVALID_IMAGES=2"):
        dataset[6]


def test_loader_workers_count_unreadable_images_together(tmp_path):
    cfg = folder_with_bad_files(tmp_path, bad={0, 2, 4})
    cfg.DATA.TRAIN.ENABLE_QUEUE_DATASET = True
    cfg.DATA.TRAIN.MAX_INVALID_IMAGES = 2
    dataset = build_dataset(cfg, "TRAIN")
    # batches [0, 1] [4, 5] go to worker 0 and [2, 3] to worker 1: 2 + 1 files, 3 in all
    message = str(loader_error(dataset, cfg, workers=2))
    assert message.startswith("3 unreadable images in config.DATA.TRAIN, more than "
                              "config.DATA.TRAIN.MAX_INVALID_IMAGES=2 (-1: no limit); the last: "
                              f"cannot read image {tmp_path / 'c'}")
    assert "\n" not in message


def filelist_with_a_missing_image(root, **split_overrides):
    """A .npy listing 6 images, the one at index 2 missing."""
    paths = [str(root / f"{i}.png") for i in range(6)]
    for i, path in enumerate(paths):
        if i != 2:
            write_png(path, noise(i))
    np.save(root / "files.npy", np.array(paths))
    return make_cfg(DATA_SOURCES=["disk_filelist"], DATA_PATHS=[str(root / "files.npy")],
                    LABEL_TYPE="sample_index", **split_overrides), paths[2]


def test_a_missing_image_of_a_file_list_is_named_in_one_line(tmp_path):
    cfg, missing = filelist_with_a_missing_image(tmp_path)
    message = str(loader_error(build_dataset(cfg, "TRAIN"), cfg, workers=2))
    assert message == (
        f"cannot read image {missing}: no such file (index 2 of config.DATA.TRAIN); set "
        "config.DATA.TRAIN.ENABLE_QUEUE_DATASET=true to skip unreadable images, each replaced "
        "by the next readable sample (up to config.DATA.TRAIN.MAX_INVALID_IMAGES=100)")


def test_a_missing_image_of_a_file_list_is_skipped_and_counted(tmp_path):
    cfg, missing = filelist_with_a_missing_image(tmp_path, ENABLE_QUEUE_DATASET=True,
                                                 MAX_INVALID_IMAGES=1, BATCHSIZE_PER_REPLICA=2)
    dataset = build_dataset(cfg, "TRAIN")
    loader = build_dataloader(dataset, cfg.DATA.TRAIN, num_workers=2, pin_memory=False, epoch=0,
                              shuffle=False)
    iterator = iter(loader)
    batches = list(iterator)
    stop_workers(iterator)
    assert [int(i) for batch in batches for i in batch["data_idx"]] == [0, 1, 3, 3, 4, 5]
    assert [bool(v) for batch in batches for v in batch["data_valid"]] == \
        [True, True, False, True, True, True]
    assert dataset.invalid_count() == 1
