"""extra_scripts: export_digits.py's files read back as the same samples;
convert_to_weights_only.py turns a trusted file into one the engine loads."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from engine_utils import QUICK
from ssl_engine.config import load_config
from ssl_engine.data import build_dataset

REPO = Path(__file__).resolve().parents[1]


def load_script(name="export_digits"):
    spec = importlib.util.spec_from_file_location(name, REPO / f"extra_scripts/{name}.py")
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


class Opaque:
    """Any other object: left out by the conversion."""


def test_trusted_file_with_python_objects_is_converted_to_plain_data(tmp_path, capsys):
    import argparse

    from ssl_engine.checkpoint import UnsafeCheckpointError, load_checkpoint

    source, target = tmp_path / "zoo.pth", tmp_path / "zoo.torch"
    weights = {"conv.weight": torch.randn(2, 3)}
    torch.save({"model": weights, "args": argparse.Namespace(lr=0.5, arch="resnet50"),
                "best_acc": np.float64(71.5), "mean": np.array([0.5, 0.25]),
                "sampler": Opaque()}, source)
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint(source)

    script = load_script("convert_to_weights_only")
    assert script.main([str(source), str(target)]) == 2  # not without the confirmation
    assert "runs any code it carries" in capsys.readouterr().err and not target.exists()
    assert script.main([str(source), str(target), "--i-trust-this-file"]) == 0
    assert "left out file/sampler (test_extra_scripts.Opaque)" in capsys.readouterr().out

    converted = load_checkpoint(target)
    assert set(converted) == {"model", "args", "best_acc", "mean"}
    assert torch.equal(converted["model"]["conv.weight"], weights["conv.weight"])
    assert converted["args"] == {"lr": 0.5, "arch": "resnet50"}
    assert converted["best_acc"] == 71.5 and type(converted["best_acc"]) is float
    assert torch.equal(converted["mean"], torch.tensor([0.5, 0.25], dtype=torch.float64))
