"""extra_scripts/export_digits.py: the exported files read back as the same samples."""
import importlib.util
from pathlib import Path

import numpy as np
import torch

from engine_utils import QUICK
from ssl_engine.config import load_config
from ssl_engine.data import build_dataset

REPO = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("export_digits",
                                                  REPO / "extra_scripts/export_digits.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dataset(tmp_path, source, path, labels=None):
    overrides = [f"config.DATA.TEST.DATA_SOURCES=[{source}]", f"config.DATA.TEST.DATA_PATHS=[{path}]",
                 "config.DATA.TEST.TRANSFORMS=[{name: ToTensor}]", f"config.CHECKPOINT.DIR={tmp_path}"]
    if labels:
        overrides.append(f"config.DATA.TEST.LABEL_PATHS=[{labels}]")
    _, cfg = load_config([QUICK, *overrides])
    return build_dataset(cfg, "TEST")


def test_exported_folder_and_filelist_match_the_digits_source(tmp_path):
    counts = load_script().export_digits(tmp_path / "digits")
    assert counts == {"train": 1257, "test": 540}
    bundled = dataset(tmp_path, "digits", "''")
    filelist = dataset(tmp_path, "disk_filelist", tmp_path / "digits/test_images.npy",
                       tmp_path / "digits/test_labels.npy")
    folder = dataset(tmp_path, "disk_folder", tmp_path / "digits/test")
    assert len(bundled) == len(filelist) == len(folder) == 540
    for i in (0, 1, 539):  # the file list keeps the bundled order
        assert torch.equal(bundled[i]["data"][0], filelist[i]["data"][0])
        assert bundled[i]["label"] == filelist[i]["label"]
    # the folder tree holds the same images and labels, in class-folder order
    bundled_set = {(bundled[i]["label"][0], bundled[i]["data"][0].numpy().tobytes())
                   for i in range(540)}
    folder_set = {(folder[i]["label"][0], folder[i]["data"][0].numpy().tobytes())
                  for i in range(540)}
    assert bundled_set == folder_set
    assert np.load(tmp_path / "digits/train_labels.npy").shape == (1257,)
