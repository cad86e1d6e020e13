"""Faults a user can cause that end in one line on stderr (``error: ...``), no traceback: before
launch (exit code 2) where the config and the files tell, else when the running job meets them
(exit code 1), with nothing already saved lost."""
import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine_utils import QUICK, TINY_TEST_SPLIT
from ssl_engine.checkpoint import CheckpointWriteError, save_checkpoint
from ssl_engine.engines.launcher import main
from ssl_engine.hooks import SSLHook, register_hook

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TOOLS = Path(__file__).resolve().parents[1] / "tools"
EXTRACT_TEST = ["engine_name=extract_features", *TINY_TEST_SPLIT]
FILELIST_FORM = ("disk_filelist reads a numpy .npy file holding a 1-D array of image paths, "
                 "written with np.save(path, np.array(list_of_paths))")
TEXT_HINT = ("; a text file of one path per line converts with np.save('list.npy', "
             "np.array(open('list.txt').read().splitlines()))")


def run_main(capsys, run_dir: Path, *overrides: str, config: str = QUICK):
    """(exit code, stderr) of the command line ``config overrides`` run in this process."""
    capsys.readouterr()
    code = main([config, f"config.CHECKPOINT.DIR={run_dir}", *overrides])
    return code, capsys.readouterr().err


def image_list(folder: Path) -> Path:
    """A .npy list of 4 readable images and the images themselves."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(4):
        pixels = np.random.default_rng(index).integers(0, 256, (16, 16, 3), dtype=np.uint8)
        paths.append(str(folder / f"img{index}.png"))
        Image.fromarray(pixels).save(paths[-1])
    np.save(folder / "list.npy", np.array(paths))
    (folder / "list.txt").write_text("\n".join(paths) + "\n")
    return folder / "list.npy"


# ---------------------------------------------------------------- an empty split


def test_an_empty_test_split_is_refused_before_launch(tmp_path, capsys):
    images = image_list(tmp_path / "images")
    np.save(tmp_path / "none.npy", np.array([], dtype=str))
    cases = [  # extraction of a split of 0 synthetic images (EOFError of the merge before)
        ([*EXTRACT_TEST, "config.DATA.TEST.SYNTHETIC.NUM_SAMPLES=0"],
         "error: config.DATA.TEST is empty: config.DATA.TEST.SYNTHETIC.NUM_SAMPLES=0 gives 0 "
         "samples; a split needs at least one"),
        # training tested on a file list of 0 entries (test phases of loss nan before)
        (["config.TEST_MODEL=true", "config.DATA.TEST.DATA_SOURCES=[disk_filelist]",
          f"config.DATA.TEST.DATA_PATHS=[{tmp_path / 'none.npy'}]"],
         f"error: config.DATA.TEST is empty: the file list config.DATA.TEST.DATA_PATHS[0]="
         f"{tmp_path / 'none.npy'} gives 0 samples; a split needs at least one"),
        # a limit whose skipped samples are all the list holds
        ([*EXTRACT_TEST, "config.DATA.TEST.DATA_SOURCES=[disk_filelist]",
          f"config.DATA.TEST.DATA_PATHS=[{images}]", "config.DATA.TEST.DATA_LIMIT=2",
          "config.DATA.TEST.DATA_LIMIT_SAMPLING.SKIP_NUM_SAMPLES=4"],
         f"error: config.DATA.TEST is empty: config.DATA.TEST.DATA_LIMIT_SAMPLING."
         f"SKIP_NUM_SAMPLES=4 skips all 4 samples that the file list config.DATA.TEST."
         f"DATA_PATHS[0]={images} gives; set it below 4"),
    ]
    for index, (overrides, line) in enumerate(cases):
        run_dir = tmp_path / f"run{index}"
        assert run_main(capsys, run_dir, *overrides) == (2, line + "\n")
        assert not run_dir.exists() or not any(run_dir.iterdir())


# ---------------------------------------------------------------- disk_filelist's file


def test_a_filelist_that_is_no_npy_list_is_refused_before_launch(tmp_path, capsys):
    images = image_list(tmp_path / "images")
    (tmp_path / "zero.npy").write_bytes(b"")
    np.save(tmp_path / "table.npy", np.array([["a", "b"], ["c", "d"]]))
    key = "config.DATA.TRAIN.DATA_PATHS[0]"
    cases = {
        images.with_suffix(".txt"): f"is a text file, not a .npy file: {FILELIST_FORM}{TEXT_HINT}",
        images.parent: (f"is a folder; {FILELIST_FORM} (for a folder of class folders of "
                        "images use the disk_folder source)"),
        tmp_path / "zero.npy": f"is empty (0 bytes): {FILELIST_FORM}",
        images.parent / "img0.png": ("is not a .npy file (it does not start with numpy's "
                                     f"header): {FILELIST_FORM}"),
        tmp_path / "table.npy": f"holds an array of shape (2, 2); {FILELIST_FORM}",
    }
    for path, what in cases.items():
        code, err = run_main(capsys, tmp_path / "run", "config.DATA.TRAIN.DATA_SOURCES="
                             "[disk_filelist]", f"config.DATA.TRAIN.DATA_PATHS=[{path}]")
        assert (code, err) == (2, f"error: {key}: {path} {what}\n")


# ---------------------------------------------------------------- defaults that recurse


@pytest.mark.parametrize("files, chosen, cycle", [
    ({"loop/self.yaml": ["/config/loop/self"]}, "loop/self", ["loop/self", "loop/self"]),
    ({"loop/a.yaml": ["/config/loop/b"], "loop/b.yaml": ["a"]}, "loop/a",
     ["loop/a", "loop/b", "loop/a"]),
    ({"loop/g.yaml": [{"/config": "loop/g"}]}, "loop/g", ["loop/g", "loop/g"]),
])
def test_defaults_that_include_themselves_are_named_in_one_line(tmp_path, capsys, monkeypatch,
                                                                files, chosen, cycle):
    import yaml

    configs = tmp_path / "configs"
    (configs / "config" / "loop").mkdir(parents=True)
    shutil.copy(CONFIGS / "config" / "defaults.yaml", configs / "config" / "defaults.yaml")
    for name, defaults in files.items():
        (configs / "config" / name).write_text(
            "# @package _global_\n" + yaml.safe_dump({"defaults": defaults}))
    monkeypatch.setenv("SSL_ENGINE_CONFIG_DIR", str(configs))
    chain = " -> ".join(str(configs / "config" / f"{name}.yaml") for name in cycle)
    code, err = run_main(capsys, tmp_path / "run", config=f"config={chosen}")
    assert (code, err) == (2, "error: the defaults lists of the configs include each other "
                              f"without end: {chain}. Remove the entry that includes a config "
                              "already in the chain\n")


# ---------------------------------------------------------------- a pool larger than its stage


def test_a_pool_larger_than_its_feature_map_stops_in_one_line(tmp_path, capsys):
    """The stage's size depends on the images, which the model check does not see: the
    extraction stops at the first batch, naming the entry, the sizes and the remedy."""
    run_dir = tmp_path / "run"
    code, err = run_main(
        capsys, run_dir, *EXTRACT_TEST, "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=true",
        "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true",
        "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP="
        "[[res5,[AvgPool2d,[[6,6],1,0]]]]")
    assert (code, err) == (1, (
        "error: config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP[0]: "
        "AvgPool2d(kernel_size=(6, 6), stride=1, padding=0) does not fit stage res5, whose "
        "feature map is 2x2 for the 16x16 images given to the model: use a window of at most "
        "2x2, or an adaptive pool (e.g. AdaptiveAvgPool2d) of the output size wanted\n"))
    assert not list(run_dir.rglob("*.npy"))  # no partial or temporary feature file


def test_a_pool_larger_than_its_feature_map_stops_a_linear_evaluation_in_one_line(tmp_path,
                                                                                 capsys):
    """The same pool in a training run (a linear evaluation): one line, exit code 1."""
    code, err = run_main(
        capsys, tmp_path / "run", "config.OPTIMIZER.num_epochs=1", "config.TEST_MODEL=false",
        "config.DATA.TRAIN.DATA_LIMIT=64", "config.MODEL.FEATURE_EVAL_SETTINGS."
        "LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res4,[AvgPool2d,[[8,8],1,0]]],[res5avg,[Identity,[]]]]",
        config="config=benchmark/linear_image_classification/digits/eval_resnet_linear")
    assert code == 1 and err.count("\n") == 1, err
    assert err.startswith("error: config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP"
                          "[0]: AvgPool2d(kernel_size=(8, 8), stride=1, padding=0) does not fit "
                          "stage res4, whose feature map is 4x4"), err


# ---------------------------------------------------------------- the run's folder removed


@register_hook("test_remove_run_folder")
class RemoveRunFolder(SSLHook):
    """Removes CHECKPOINT.DIR after iteration 2 (between a checkpoint and the next log)."""

    def __init__(self, cfg):
        super().__init__()
        self.folder = Path(cfg.CHECKPOINT.DIR)

    def on_step(self, task):
        if task.train and task.iteration == 2:
            shutil.rmtree(self.folder)


def gone(folder: Path, what: str) -> str:
    return (f"config.CHECKPOINT.DIR={folder} no longer exists: it was removed (or unmounted) "
            f"while the run went on, so {what} could not be written there. The checkpoints it "
            "held went with it; restore the folder from a backup to continue with "
            "config.CHECKPOINT.AUTO_RESUME=true, or start the run again")


def test_the_run_folder_removed_during_training_stops_in_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    code, err = run_main(capsys, run_dir, "config.OPTIMIZER.num_epochs=1",
                         "config.HOOKS.EXTRA_HOOKS=[test_remove_run_folder]")
    assert (code, err) == (1, f"error: {gone(run_dir, 'metrics.json')}\n")
    assert not run_dir.exists()  # not silently made again by a later write


def test_a_checkpoint_is_not_saved_into_a_folder_made_again(tmp_path):
    with pytest.raises(CheckpointWriteError) as raised:
        save_checkpoint(tmp_path / "gone", "model_phase0.torch", {"a": 1})
    assert str(raised.value) == gone(tmp_path / "gone", "checkpoint model_phase0.torch")
    assert not (tmp_path / "gone").exists()


# ---------------------------------------------------------------- SVMs on mismatched features


def test_svm_on_train_and_test_features_of_other_widths_is_refused_before_training(
        tmp_path, capsys):
    rng = np.random.default_rng(0)
    features = tmp_path / "features"
    features.mkdir()
    for split, width in (("train", 8), ("test", 12)):
        np.save(features / f"{split}_res5avg_features.npy",
                rng.standard_normal((20, width)).astype(np.float32))
        np.save(features / f"{split}_res5avg_targets.npy", np.arange(20) % 2)
        np.save(features / f"{split}_res5avg_inds.npy", np.arange(20))
    spec = importlib.util.spec_from_file_location("train_svm", TOOLS / "train_svm.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "out"
    capsys.readouterr()
    code = tool.main(["config=feature_extraction/extract_resnet_digits",
                      f"config.SVM_FEATURES_PATH={features}", f"config.CHECKPOINT.DIR={out}",
                      "config.SVM.costs.costs_list=[0.1]"])
    assert (code, capsys.readouterr().err) == (2, (
        "error: the SVM's train features are of shape (20, 8) and its test features of shape "
        "(20, 12): both must be [rows, dims] of one width, the same layer of the same model "
        "(extract both splits with one config and checkpoint)\n"))
    assert not (out / "svm").exists()  # no SVM was trained
