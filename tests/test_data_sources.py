"""Data sources, path checks, label types and limits of ssl_engine.data."""
import collections
import os
import re

import numpy as np
import pytest
import yaml
from PIL import Image

from ssl_engine.config.attr_dict import AttrDict
from ssl_engine.data import DATASOURCE_REGISTRY, build_dataset, check_data_paths
from ssl_engine.data.datasources import ImageLoadError, load_rgb_image

DEFAULTS = os.path.join(os.path.dirname(__file__), "..", "configs", "config", "defaults.yaml")


def make_cfg(split="TRAIN", **split_overrides):
    """The default config with ``cfg.DATA.<split>`` keys replaced by ``split_overrides``."""
    with open(DEFAULTS) as f:
        cfg = AttrDict(yaml.safe_load(f)["config"])
    for key, value in split_overrides.items():
        cfg.DATA[split][key] = value
    return cfg


def write_png(path, pixels):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(pixels).save(path)


def noise(seed, size=6):
    return np.random.default_rng(seed).integers(0, 256, size=(size, size, 3), dtype=np.uint8)


def source_of(cfg, split="TRAIN"):
    return build_dataset(cfg, split).source


# ---- synthetic -------------------------------------------------------------------------------


def test_synthetic_images_are_deterministic_per_index_with_cyclic_labels():
    settings = {"NUM_SAMPLES": 7, "IMAGE_SIZE": 5, "NUM_CLASSES": 3}
    cfg = make_cfg(DATA_SOURCES=["synthetic"], SYNTHETIC=settings)
    first, second = source_of(cfg), source_of(cfg)
    assert len(first) == 7
    assert [first[i][1] for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    image, _ = first[4]
    assert image.mode == "RGB" and image.size == (5, 5)
    assert np.array_equal(np.asarray(image), np.asarray(second[4][0]))
    assert not np.array_equal(np.asarray(first[4][0]), np.asarray(first[5][0]))
    assert len(np.unique(np.asarray(image))) > 20  # noise, not a constant image


def test_synthetic_needs_no_path():
    cfg = make_cfg(DATA_SOURCES=["synthetic"], DATA_PATHS=[])
    check_data_paths(cfg, "TRAIN")
    assert len(build_dataset(cfg, "TRAIN")) == 1000


# ---- disk_folder -----------------------------------------------------------------------------


def make_folder_tree(root):
    """cat/ holds a.png and sub/b.png, dog/ holds c.png; a notes.txt is not an image."""
    pixels = {name: noise(i) for i, name in enumerate(["cat/a.png", "cat/sub/b.png", "dog/c.png"])}
    for name, array in pixels.items():
        write_png(os.path.join(root, name), array)
    with open(os.path.join(root, "dog", "notes.txt"), "w") as f:
        f.write("not an image")
    return pixels


def test_disk_folder_reads_sorted_classes_and_exact_pixels(tmp_path):
    pixels = make_folder_tree(str(tmp_path))
    source = source_of(make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[str(tmp_path)]))
    assert len(source) == 3
    assert source.classes == ["cat", "dog"]
    expected = [("cat/a.png", 0), ("cat/sub/b.png", 0), ("dog/c.png", 1)]
    for i, (name, label) in enumerate(expected):
        image, got_label = source[i]
        assert got_label == label
        assert np.array_equal(np.asarray(image), pixels[name])


@pytest.mark.parametrize("corruption", ["garbage", "truncated"])
def test_disk_folder_corrupt_image_error_names_the_file(tmp_path, corruption):
    make_folder_tree(str(tmp_path))
    bad = os.path.join(str(tmp_path), "dog", "d.png")
    if corruption == "garbage":
        content = b"this is not a png"
    else:
        with open(os.path.join(str(tmp_path), "dog", "c.png"), "rb") as f:
            content = f.read()[:60]
    with open(bad, "wb") as f:
        f.write(content)
    cfg = make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[str(tmp_path)])
    dataset = build_dataset(cfg, "TRAIN")
    with pytest.raises(ImageLoadError, match=f"cannot read image {bad}"):
        dataset[3]


EXTENSIONS = ".jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp (in any case)"


def _class_folders_with_notes(root):
    for name in ("cat", "dog"):
        os.makedirs(root / name)
    (root / "dog" / "notes.txt").write_text("not an image")


@pytest.mark.parametrize("layout, problem", [
    (lambda root: None, "it is empty"),
    (lambda root: os.makedirs(root / "cat"), "its 1 class folder(s) hold no image files"),
    (_class_folders_with_notes,
     "its 2 class folder(s) hold no image files (found other files, e.g. {root}/dog/notes.txt)"),
    (lambda root: write_png(str(root / "a.png"), noise(0)),
     "the images must be in sub-folders, one per class, and it has none (found {root}/a.png)"),
])
def test_disk_folder_without_images_is_refused_before_launch(tmp_path, layout, problem):
    root = tmp_path / "data"
    root.mkdir()
    layout(root)
    cfg = make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[str(root)])
    expected = (f"config.DATA.TRAIN.DATA_PATHS[0]={root} has no images disk_folder can read: "
                f"{problem.format(root=root)}. disk_folder reads <folder>/<class>/**/<image>, "
                f"the images being files ending in {EXTENSIONS}")
    with pytest.raises(ValueError) as refused:  # what the launcher checks before launch
        check_data_paths(cfg, "TRAIN")
    assert str(refused.value) == expected


def test_disk_folder_with_one_image_in_one_class_is_accepted(tmp_path):
    os.makedirs(tmp_path / "cat")
    write_png(str(tmp_path / "dog" / "deep" / "x.PNG"), noise(1))  # any case, any depth
    cfg = make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[str(tmp_path)])
    check_data_paths(cfg, "TRAIN")
    assert source_of(cfg).classes == ["cat", "dog"] and len(source_of(cfg)) == 1


# ---- reading one image -----------------------------------------------------------------------


def _truncated_jpeg(path):
    Image.fromarray(noise(3, size=32)).save(path, format="JPEG")
    content = path.read_bytes()
    path.write_bytes(content[:len(content) // 2])


@pytest.mark.parametrize("make, what", [
    (lambda path: path.write_bytes(b""), re.escape("the file is empty (0 bytes)")),
    (lambda path: path.write_text("a text file"),
     re.escape("not an image file Pillow can decode (cannot identify image file)")),
    (_truncated_jpeg, "(?i:.*truncated)"),  # Pillow's words, which depend on where it stops
    (lambda path: None, "no such file"),
    (lambda path: path.mkdir(), "it is a folder, not an image file"),
])
def test_an_unreadable_image_file_is_named_with_what_is_wrong(tmp_path, make, what):
    path = tmp_path / "photo.jpg"
    make(path)
    with pytest.raises(ImageLoadError) as failed:
        load_rgb_image(str(path))
    assert re.match(re.escape(f"cannot read image {path}: ") + what, str(failed.value))


def test_16_bit_grey_png_is_scaled_to_8_bits(tmp_path):
    values = np.array([[0, 255, 256, 32768], [40000, 65280, 65535, 1000]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode == "I;16"
    image = load_rgb_image(str(tmp_path / "grey16.png"))
    assert image.mode == "RGB"
    expected = np.array([[0, 0, 1, 128], [156, 255, 255, 3]], dtype=np.uint8)  # the high byte
    assert np.array_equal(np.asarray(image), np.repeat(expected[..., None], 3, axis=2))


# ---- disk_filelist ---------------------------------------------------------------------------


def test_disk_filelist_with_and_without_labels(tmp_path):
    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"img{i}.png"))
        write_png(paths[-1], noise(10 + i))
    np.save(tmp_path / "files.npy", np.array(paths))
    np.save(tmp_path / "labels.npy", np.array([5, 3, 7]))
    with_labels = make_cfg(
        DATA_SOURCES=["disk_filelist"],
        DATA_PATHS=[str(tmp_path / "files.npy")],
        LABEL_PATHS=[str(tmp_path / "labels.npy")],
    )
    source = source_of(with_labels)
    assert [source[i][1] for i in range(3)] == [5, 3, 7]
    assert np.array_equal(np.asarray(source[2][0]), noise(12))
    without = make_cfg(DATA_SOURCES=["disk_filelist"], DATA_PATHS=[str(tmp_path / "files.npy")])
    assert [source_of(without)[i][1] for i in range(3)] == [-1, -1, -1]


def test_disk_filelist_label_count_mismatch(tmp_path):
    np.save(tmp_path / "files.npy", np.array(["a.png", "b.png"]))
    np.save(tmp_path / "labels.npy", np.array([1]))
    cfg = make_cfg(
        DATA_SOURCES=["disk_filelist"],
        DATA_PATHS=[str(tmp_path / "files.npy")],
        LABEL_PATHS=[str(tmp_path / "labels.npy")],
    )
    with pytest.raises(ValueError, match=r"LABEL_PATHS\[0\].*holds 1 labels but .* lists 2 images"):
        build_dataset(cfg, "TRAIN")


# ---- digits ----------------------------------------------------------------------------------


def test_digits_split_sizes_disjoint_and_stratified():
    from sklearn.datasets import load_digits

    digits = load_digits()
    train = source_of(make_cfg("TRAIN", DATA_SOURCES=["digits"], DATA_PATHS=[""]), "TRAIN")
    test = source_of(make_cfg("TEST", DATA_SOURCES=["digits"], DATA_PATHS=[""]), "TEST")
    assert (len(train), len(test)) == (1257, 540)
    assert set(train.indices).isdisjoint(test.indices)
    assert len(set(train.indices) | set(test.indices)) == 1797
    assert list(train.indices) == sorted(train.indices)
    totals = collections.Counter(digits.target.tolist())
    test_counts = collections.Counter(digits.target[test.indices].tolist())
    for digit, total in totals.items():
        assert abs(test_counts[digit] - 0.3 * total) <= 1


def test_digits_pixels_are_scaled_grey_rgb():
    from sklearn.datasets import load_digits

    digits = load_digits()
    source = source_of(make_cfg(DATA_SOURCES=["digits"], DATA_PATHS=[]))
    image, label = source[10]
    original = source.indices[10]
    assert image.mode == "RGB" and image.size == (8, 8)
    assert label == digits.target[original]
    expected = np.round(digits.images[original] / 16.0 * 255.0)
    for channel in range(3):
        assert np.array_equal(np.asarray(image)[:, :, channel], expected)


# ---- label type and limit --------------------------------------------------------------------


def test_label_type_sample_index_and_data_limit():
    cfg = make_cfg(DATA_SOURCES=["digits"], LABEL_TYPE="sample_index", DATA_LIMIT=25)
    dataset = build_dataset(cfg, "TRAIN")
    assert len(dataset) == 25
    assert [dataset[i]["label"] for i in (0, 7, 24)] == [[0], [7], [24]]
    with pytest.raises(IndexError):
        dataset[25]


def test_unknown_label_type():
    with pytest.raises(ValueError, match="config.DATA.TRAIN.LABEL_TYPE must be one of"):
        build_dataset(make_cfg(DATA_SOURCES=["digits"], LABEL_TYPE="labels"), "TRAIN")


# ---- check_data_paths ------------------------------------------------------------------------


def test_missing_path_message_names_key_and_path(tmp_path):
    missing = str(tmp_path / "nowhere")
    cfg = make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[missing])
    with pytest.raises(FileNotFoundError) as info:
        check_data_paths(cfg, "TRAIN")
    assert str(info.value) == f"config.DATA.TRAIN.DATA_PATHS[0]: {missing} does not exist"


def test_missing_label_path(tmp_path):
    np.save(tmp_path / "files.npy", np.array(["a.png"]))
    cfg = make_cfg(
        "TEST",
        DATA_SOURCES=["disk_filelist"],
        DATA_PATHS=[str(tmp_path / "files.npy")],
        LABEL_PATHS=["/no/labels.npy"],
    )
    message = r"config.DATA.TEST.LABEL_PATHS\[0\]: /no/labels.npy does not exist"
    with pytest.raises(FileNotFoundError, match=message):
        check_data_paths(cfg, "TEST")


def test_unknown_source_name_suggests_closest():
    cfg = make_cfg(DATA_SOURCES=["disk_foldr"], DATA_PATHS=["/x"])
    message = r"DATA_SOURCES\[0\]: unknown data source 'disk_foldr': did you mean 'disk_folder'"
    with pytest.raises(ValueError, match=message):
        check_data_paths(cfg, "TRAIN")


def test_list_length_mismatch_and_source_count():
    message = "DATA_PATHS has 2 entries but config.DATA.TRAIN.DATA_SOURCES has 1"
    with pytest.raises(ValueError, match=message):
        check_data_paths(make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=["/a", "/b"]), "TRAIN")
    with pytest.raises(ValueError, match="DATA_PATHS has 0 entries"):
        check_data_paths(make_cfg(DATA_SOURCES=["disk_folder"], DATA_PATHS=[]), "TRAIN")
    with pytest.raises(ValueError, match="config.DATA.TEST.DATA_SOURCES is empty"):
        check_data_paths(make_cfg("TEST", DATA_SOURCES=[]), "TEST")
    with pytest.raises(NotImplementedError, match="one source per split"):
        check_data_paths(make_cfg(DATA_SOURCES=["digits", "digits"], DATA_PATHS=["", ""]), "TRAIN")


def test_registered_source_names():
    expected = {"synthetic", "disk_folder", "disk_filelist", "digits"}
    assert expected <= set(DATASOURCE_REGISTRY.names())


def test_label_sources_other_than_the_data_source_are_refused():
    from ssl_engine.data import check_data_paths

    cfg = make_cfg("TRAIN", DATA_SOURCES=["synthetic"], DATA_PATHS=[""],
                   LABEL_SOURCES=["disk_filelist"])
    with pytest.raises(ValueError, match=r"config.DATA.TRAIN.LABEL_SOURCES=\['disk_filelist'\]: "
                                         "labels come from the data source itself"):
        check_data_paths(cfg, "TRAIN")
    cfg = make_cfg("TRAIN", DATA_SOURCES=["synthetic"], DATA_PATHS=[""],
                   LABEL_SOURCES=["synthetic"])
    check_data_paths(cfg, "TRAIN")  # the same as the data source: accepted
