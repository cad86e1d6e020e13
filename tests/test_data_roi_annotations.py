"""disk_roi_annotations: one sample per annotated box, the image cropped to it."""
import json

import numpy as np
import pytest

from ssl_engine.data import build_dataset, check_data_paths
from test_data_sources import make_cfg, noise, write_png


def write_annotations(tmp_path, entries):
    path = tmp_path / "rois.json"
    path.write_text(json.dumps(entries))
    return str(path)


def test_each_box_is_a_crop_of_its_image(tmp_path):
    write_png(str(tmp_path / "images/a.png"), noise(1, size=12))
    write_png(str(tmp_path / "b.png"), noise(2, size=12))
    entries = [{"path": "images/a.png", "bbox": [2, 3, 7, 11], "label": 4},  # relative path
               {"path": str(tmp_path / "b.png"), "bbox": [0, 0, 12, 5]},
               {"path": "images/a.png", "bbox": [10, 10, 14, 12]}]  # reaches past the image
    cfg = make_cfg("TEST", DATA_SOURCES=["disk_roi_annotations"],
                   DATA_PATHS=[write_annotations(tmp_path, entries)], LABEL_TYPE="standard")
    check_data_paths(cfg, "TEST")
    dataset = build_dataset(cfg, "TEST")
    source = dataset.source
    assert len(dataset) == 3
    image, label = source[0]
    assert label == 4 and image.size == (5, 8)
    assert np.array_equal(np.asarray(image), noise(1, size=12)[3:11, 2:7])  # rows: top..bottom
    image, label = source[1]
    assert label == -1 and np.array_equal(np.asarray(image), noise(2, size=12)[0:5, 0:12])
    outside = np.asarray(source[2][0])
    assert outside.shape == (2, 4, 3)
    assert np.array_equal(outside[:, :2], noise(1, size=12)[10:12, 10:12])
    assert not outside[:, 2:].any()  # PIL fills what lies outside the image with black
    assert source.labels().tolist() == [4, -1, -1]
    sample = dataset[0]
    assert sample["data"][0].shape == (3, 8, 5)


@pytest.mark.parametrize("entries, problem", [
    ({"path": "a.png"}, "must hold a JSON list"),
    ([{"path": "a.png", "bbox": [0, 0, 4]}], r"entry 0 is .*left < right and top < bottom"),
    ([{"path": "a.png", "bbox": [5, 0, 4, 4]}], r"entry 0 is .*left < right"),
    ([{"bbox": [0, 0, 4, 4]}], r"entry 0 is"),
])
def test_a_bad_annotation_file_is_refused_before_launch(tmp_path, entries, problem):
    cfg = make_cfg("TEST", DATA_SOURCES=["disk_roi_annotations"],
                   DATA_PATHS=[write_annotations(tmp_path, entries)])
    with pytest.raises(ValueError, match=r"config.DATA.TEST.DATA_PATHS\[0\]: .*" + problem):
        check_data_paths(cfg, "TEST")
