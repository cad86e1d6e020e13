"""Data a user can hand the engine by mistake: disk_folder trees with symbolic links that loop
(listed once per folder, labelled by the class folder an image really is in), and float32
TIFF images (scaled to 0..255, not read as black)."""
import logging
import os
import threading
import time

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import ImageFolder

from ssl_engine.data import check_data_paths
from ssl_engine.data.datasources import ImageLoadError, load_rgb_image
from ssl_engine.data.datasources.disk_folder import DiskFolderSource
from test_data_sources import make_cfg, noise, write_png

LISTING_SECONDS = 10  # the looped tree took more than 10 minutes before


def _tree(root, classes=("a", "b"), per_class=4):
    """``root/<class>/<i>.png``, each image of its own pixels."""
    for c, name in enumerate(classes):
        for i in range(per_class):
            write_png(str(root / name / f"{i}.png"), noise(10 * c + i))


def _listing(root):
    """The (path relative to ``root``, class name) samples of disk_folder at ``root``, listed
    in a thread that must end within LISTING_SECONDS, and the WARNING lines it logged."""
    done = {}

    def listing():
        done["source"] = DiskFolderSource(None, "TRAIN", str(root), 0)

    thread = threading.Thread(target=listing, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(LISTING_SECONDS)
    assert not thread.is_alive(), f"listing {root} took more than {LISTING_SECONDS} s"
    assert time.monotonic() - start < LISTING_SECONDS
    source = done["source"]
    assert source.labels() == [label for _, label in source.samples]
    return [(os.path.relpath(path, root), source.classes[label])
            for path, label in source.samples], source.classes


PLAIN = [(f"{c}/{i}.png", c) for c in "ab" for i in range(4)]


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and r.name == "ssl_engine.data.datasources.disk_folder"]


def test_two_links_to_the_folder_itself_are_skipped_quickly(tmp_path, caplog):
    root = tmp_path / "data"
    _tree(root)
    os.symlink(".", root / "a" / "x")  # each loop doubles the paths os.walk follows
    os.symlink(".", root / "a" / "y")
    check_data_paths(make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[str(root)]), "TRAIN")
    with caplog.at_level(logging.WARNING):
        samples, classes = _listing(root)
    assert classes == ["a", "b"] and samples == PLAIN
    assert _warnings(caplog) == [
        f"disk_folder {root}: skipped 2 symbolic link(s) to folders already listed or that do "
        f"not resolve (e.g. {root / 'a' / 'x'}); each folder is read once"]


def test_a_link_to_the_parent_adds_nothing(tmp_path, caplog):
    root = tmp_path / "data"
    _tree(root)
    os.symlink("..", root / "a" / "up")  # 8 files became 328 samples, a/0.png labelled b 40 times
    with caplog.at_level(logging.WARNING):
        samples, _ = _listing(root)
    assert samples == PLAIN
    assert len(_warnings(caplog)) == 1 and "skipped 1 symbolic link(s)" in _warnings(caplog)[0]


def test_a_class_folder_linked_to_itself_is_skipped_before_launch_and_in_the_listing(tmp_path):
    root = tmp_path / "data"
    _tree(root)
    os.symlink("c", root / "c")  # resolving it fails with ELOOP
    os.symlink(os.path.join("..", "a"), root / "a" / "again")  # an ancestor, through a link
    cfg = make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[str(root)])
    check_data_paths(cfg, "TRAIN")  # an ELOOP traceback before
    samples, classes = _listing(root)
    assert classes == ["a", "b"] and samples == PLAIN


def test_links_elsewhere_are_followed_and_every_image_keeps_its_own_class(tmp_path):
    root, outside = tmp_path / "data", tmp_path / "outside"
    _tree(root)
    write_png(str(root / "b" / "sub" / "s.png"), noise(50))
    write_png(str(outside / "o.png"), noise(60))
    os.symlink(outside, root / "b" / "ext")  # a folder outside the tree: read, as class b
    os.symlink(os.path.join("..", "b", "sub"), root / "a" / "l")  # b's sub-folder: stays b's
    os.symlink("a", root / "z")  # a class folder that is another class: no sample of its own
    samples, classes = _listing(root)
    assert classes == ["a", "b", "z"]
    assert samples == PLAIN[:4] + PLAIN[4:] + [("b/ext/o.png", "b"), ("b/sub/s.png", "b")]


def test_a_tree_without_links_is_listed_as_torchvision_lists_it(tmp_path, caplog):
    root = tmp_path / "data"
    _tree(root, classes=("cat", "dog", "empty"), per_class=2)
    write_png(str(root / "cat" / "deep" / "er" / "x.PNG"), noise(70))
    write_png(str(root / "cat" / "a_first.jpg"), noise(71))
    (root / "dog" / "notes.txt").write_text("not an image")
    os.remove(root / "empty" / "0.png")
    os.remove(root / "empty" / "1.png")
    with caplog.at_level(logging.WARNING):
        source = DiskFolderSource(None, "TRAIN", str(root), 0)
    reference = ImageFolder(str(root), allow_empty=True)
    assert source.classes == reference.classes == ["cat", "dog", "empty"]
    assert list(source.samples) == reference.samples and len(source) == 6
    image, label = source[3]  # cat: 0.png, 1.png, a_first.jpg, then deep/er/x.PNG
    assert label == 0 and np.array_equal(np.asarray(image), noise(70))
    assert _warnings(caplog) == []


# ---- float images ----------------------------------------------------------------------------


def test_a_float32_tiff_of_values_0_to_1_is_scaled_to_0_to_255(tmp_path):
    values = np.linspace(0, 1, 12, dtype=np.float32).reshape(3, 4)
    path = tmp_path / "float.tif"
    Image.fromarray(values).save(path)
    assert Image.open(path).mode == "F"
    assert np.asarray(Image.open(path).convert("RGB")).max() == 1  # what was read before
    image = load_rgb_image(str(path))
    expected = np.rint(values.astype(np.float64) * 255).astype(np.uint8)
    assert image.mode == "RGB" and expected.max() == 255
    assert np.array_equal(np.asarray(image), np.repeat(expected[..., None], 3, axis=2))


def test_a_float32_tiff_of_values_0_to_255_keeps_its_values(tmp_path):
    values = np.array([[0.0, 2.4, 2.6], [100.0, 254.5, 255.0]], dtype=np.float32)
    Image.fromarray(values).save(tmp_path / "float255.tif")
    image = load_rgb_image(str(tmp_path / "float255.tif"))
    assert np.array_equal(np.asarray(image)[..., 0], [[0, 2, 3], [100, 254, 255]])


@pytest.mark.parametrize("values, what", [
    (np.array([[-1.0, 0.5]]), "a float image with values from -1 to 0.5; float images are read "
                              "with values in 0..1 or 0..255"),
    (np.array([[0.0, 300.0]]), "a float image with values from 0 to 300; float images are read "
                               "with values in 0..1 or 0..255"),
    (np.array([[0.0, np.nan]]), "a float image with NaN or infinite values"),
])
def test_a_float_tiff_out_of_range_is_named(tmp_path, values, what):
    path = tmp_path / "odd.tif"
    Image.fromarray(values.astype(np.float32)).save(path)
    with pytest.raises(ImageLoadError) as refused:
        load_rgb_image(str(path))
    assert str(refused.value) == f"cannot read image {path}: {what}"
