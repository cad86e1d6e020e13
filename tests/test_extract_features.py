"""The extract_features engine: files, order, 1 vs 2 processes, weights, errors, interruption."""
import json

import numpy as np
import pytest
import torch

from engine_utils import copy_of, run_engine
from ssl_engine.config import load_config
from ssl_engine.data import build_dataset
from ssl_engine.extraction import write_splits as fx
from ssl_engine.extraction import rank_files
from ssl_engine.extraction.errors import ExtractionError, NonFiniteFeatures
from ssl_engine.extraction.files import extracted_paths, load_extracted
from ssl_engine.models import BaseSSLMultiInputOutputModel, build_model

CONFIG = "config=feature_extraction/extract_resnet_digits"
# 37 train / 21 test synthetic images, batch 8: divisible neither by the batch nor by 2 ranks
TINY = [
    "config.DATA.TRAIN.DATA_SOURCES=[synthetic]",
    "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=37",
    "config.DATA.TRAIN.SYNTHETIC.IMAGE_SIZE=16",
    "config.DATA.TRAIN.SYNTHETIC.NUM_CLASSES=4",
    "config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=8",
    "config.DATA.TEST.DATA_SOURCES=[synthetic]",
    "config.DATA.TEST.SYNTHETIC.NUM_SAMPLES=21",
    "config.DATA.TEST.SYNTHETIC.IMAGE_SIZE=16",
    "config.DATA.TEST.SYNTHETIC.NUM_CLASSES=4",
    "config.DATA.TEST.BATCHSIZE_PER_REPLICA=8",
    "config.MODEL.TRUNK.RESNETS.WIDTH_MULTIPLIER=0.125",
]
SIZES = {"train": 37, "test": 21}
LAYERS = ["res4", "res5avg"]
DIMS = {"res4": 32, "res5avg": 64}  # 256 and 512 channels at width 0.125


def extract(folder, overrides=()):
    return run_engine(folder, TINY + list(overrides), config=CONFIG)


def final_names(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".npy"))


def expected_names():
    return sorted(path.name for split in SIZES for layer in LAYERS
                  for path in extracted_paths(".", split, layer).values())


def save_weights(path, seed=123):
    """A checkpoint of this engine with random (seeded) weights; returns the model."""
    _, cfg = load_config([CONFIG, *TINY])
    torch.manual_seed(seed)
    model = build_model(cfg.MODEL)
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, path)
    return cfg, model.eval()


def direct_features(cfg, model, split):
    """res4 (averaged over space) and res5avg of every sample, one image at a time."""
    dataset = build_dataset(cfg, split)
    rows = {layer: [] for layer in LAYERS}
    with torch.no_grad():
        for index in range(len(dataset)):
            image = dataset[index]["data"][0][None]
            res4, res5avg = model.trunk(image, LAYERS)
            rows["res4"].append(res4.mean(dim=(2, 3))[0].numpy())
            rows["res5avg"].append(res5avg.flatten(1)[0].numpy())
    return {layer: np.stack(values) for layer, values in rows.items()}


def test_one_and_two_processes_write_identical_ordered_files(tmp_path):
    """Without WEIGHTS_INIT the model is seeded alike on every rank (and a warning says so)."""
    one, two = tmp_path / "one", tmp_path / "two"
    extract(one)
    extract(two, ["config.DISTRIBUTED.NUM_PROC_PER_NODE=2", "config.DISTRIBUTED.INIT_METHOD=file"])
    for folder in (one, two):  # the final files only: no temporaries left
        assert final_names(folder) == expected_names()
        assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert "randomly initialised model" in (one / "log.txt").read_text()
    for split, size in SIZES.items():
        for layer in LAYERS:
            a, b = load_extracted(one, split, layer), load_extracted(two, split, layer)
            for kind in ("features", "targets", "inds"):
                assert np.array_equal(getattr(a, kind), getattr(b, kind)), (split, layer, kind)
            assert a.features.dtype == np.float32 and a.features.shape == (size, DIMS[layer])
            assert a.inds.dtype == np.int64 and np.array_equal(a.inds, np.arange(size))
            assert np.array_equal(a.targets, np.arange(size) % 4)  # synthetic label = i % 4


def test_features_are_those_of_the_weights_init_model(tmp_path):
    weights = tmp_path / "weights.torch"
    cfg, model = save_weights(weights)
    out = tmp_path / "features"
    extract(tmp_path / "ckpt", [f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}",
                                f"config.EXTRACT_FEATURES.OUTPUT_DIR={out}",
                                "config.EXTRACT_FEATURES.SPLITS=[TEST]"])
    assert final_names(out) == [name for name in expected_names() if name.startswith("test_")]
    expected = direct_features(cfg, model, "TEST")
    for layer in LAYERS:
        np.testing.assert_allclose(load_extracted(out, "test", layer).features, expected[layer],
                                   rtol=1e-4, atol=1e-5)
    assert f"weights init from {weights}" in (tmp_path / "ckpt" / "log.txt").read_text()


@pytest.fixture
def forward_calls(monkeypatch):
    calls = []
    original = BaseSSLMultiInputOutputModel.extract_layers

    def counting(self, x):
        calls.append(len(x))
        return original(self, x)

    monkeypatch.setattr(BaseSSLMultiInputOutputModel, "extract_layers", counting)
    return calls


def test_unwritable_output_dir_fails_before_any_forward(tmp_path, forward_calls):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    target = blocker / "features"  # a folder cannot be created under a file (even as root)
    with pytest.raises(ExtractionError, match=f"cannot write extracted features to {target}"):
        extract(tmp_path / "ckpt", [f"config.EXTRACT_FEATURES.OUTPUT_DIR={target}"])
    assert forward_calls == []


def test_unknown_layer_names_the_trunk_stages_before_data_work(tmp_path, monkeypatch):
    from ssl_engine.extraction import extractor

    def no_data(*args):
        raise AssertionError("a dataset was built")

    monkeypatch.setattr(extractor, "build_dataset", no_data)
    bad_map = ("config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP="
               "[[res9,[Identity,[]]]]")
    with pytest.raises(ValueError, match=r"no stage\(s\) \['res9'\]; its stages are: conv1, "
                                         r"res1, res2, res3, res4, res5, res5avg"):
        extract(tmp_path, [bad_map])
    assert final_names(tmp_path) == []


def test_interrupted_extraction_leaves_no_final_file_and_a_rerun_completes(tmp_path, monkeypatch):
    original = rank_files.RankWriter.append
    batches = []

    def fail_after_first_batch(self, features, targets, inds):
        if batches:
            raise RuntimeError("killed")
        batches.append(len(inds))
        original(self, features, targets, inds)

    monkeypatch.setattr(rank_files.RankWriter, "append", fail_after_first_batch)
    with pytest.raises(RuntimeError, match="killed"):
        extract(tmp_path)
    assert batches == [8] and final_names(tmp_path) == []

    # a hard kill would leave temporaries behind: a rerun overwrites and removes them
    monkeypatch.setattr(rank_files.RankWriter, "append", original)
    leftovers = [rank_files.temporary(extracted_paths(tmp_path, "train", "res4")["features"], 0),
                 rank_files.temporary(extracted_paths(tmp_path, "train", "res4")["features"])]
    for path in leftovers:
        path.write_bytes(b"junk")
    extract(tmp_path)
    assert final_names(tmp_path) == expected_names()
    assert not any(path.exists() for path in leftovers)
    assert load_extracted(tmp_path, "train", "res4").features.shape == (37, DIMS["res4"])


def test_merge_places_rows_by_index_in_chunks_and_drops_repeats(tmp_path, monkeypatch):
    """Two rank files with shuffled, repeated indices; a chunk of 3 rows."""
    monkeypatch.setattr(rank_files, "MERGE_CHUNK_BYTES", 3 * 2 * 4)
    num_samples, rng = 11, np.random.default_rng(0)
    values = rng.normal(size=(num_samples, 2)).astype(np.float32)
    shares = [np.array([7, 0, 2, 9, 4, 6]), np.array([1, 3, 10, 5, 8, 0])]  # 0 twice (padding)
    sources, inds_files = [], []
    for rank, share in enumerate(shares):
        for rows, name, paths in ((values[share], "rows", sources), (share, "inds", inds_files)):
            appender = rank_files.NpyAppender(tmp_path / f"{name}{rank}.npy", len(share))
            appender.append(rows)
            appender.close()
            paths.append(appender.path)
    assert np.array_equal(np.load(sources[1]), values[shares[1]])  # rank files are .npy too
    final = tmp_path / "merged.npy"
    rank_files.merge_rank_files(final, sources, inds_files, num_samples)
    assert np.array_equal(np.load(rank_files.temporary(final)), values)

    with pytest.raises(ExtractionError, match="1 of 12 dataset indices were never extracted"):
        rank_files.merge_rank_files(final, sources, inds_files, 12)


def test_command_line_refuses_unwritable_output_before_starting(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    proc = subprocess.run(
        [sys.executable, str(repo / "tools/run_distributed_engines.py"), CONFIG,
         "engine_name=extract_features", *TINY, f"config.CHECKPOINT.DIR={tmp_path / 'ckpt'}",
         f"config.EXTRACT_FEATURES.OUTPUT_DIR={blocker / 'features'}"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert f"error: cannot write extracted features to {blocker / 'features'}" in proc.stderr
    assert "Traceback" not in proc.stderr and "init process group" not in proc.stdout


# ---------------------------------------------------------------- safety, from the command line
def extract_cli(folder, overrides=(), env=None, base=(CONFIG, *TINY)):
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    return subprocess.run(
        [sys.executable, str(repo / "tools/run_distributed_engines.py"), *base,
         "engine_name=extract_features", f"config.CHECKPOINT.DIR={folder}", *overrides],
        capture_output=True, text=True, timeout=300,  # the engine of this checkout, test plugins
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "tests"), str(repo)]),
             **(env or {})},
    )


class RunsCommand:
    """Unpickling it runs a shell command: what a malicious weights file carries."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        import os

        return (os.system, (self.command,))


def test_weights_file_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "code_ran"
    weights = tmp_path / "model_zoo.torch"
    cfg, model = save_weights(weights)
    state = torch.load(weights, weights_only=True)
    state["classy_state_dict"]["payload"] = RunsCommand(f"touch {marker}")
    torch.save(state, weights)

    proc = extract_cli(tmp_path / "out", [f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {weights} was not loaded: it holds Python objects other than weights "
        "(posix.system), and loading those could run code the file carries. Only tensors, "
        "numbers, strings and containers of them are loaded; if you trust the file's origin, "
        "convert it once with extra_scripts/convert_to_weights_only.py (see docs/safety.md)"]
    assert not marker.exists()  # the command it carries did not run
    assert "init process group" not in proc.stdout


def test_weights_file_without_a_state_dict_is_refused_before_launch(tmp_path):
    weights = tmp_path / "not_weights.torch"
    torch.save({"epoch": 3, "notes": ["a", "b"]}, weights)
    proc = extract_cli(tmp_path / "out", [f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}",
                                          "config.DISTRIBUTED.NUM_PROC_PER_NODE=2"])
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: MODEL.WEIGHTS_INIT: {weights} holds neither a state dict of tensors nor this "
        "engine's model state (its keys: ['epoch', 'notes']); set "
        "config.MODEL.WEIGHTS_INIT.STATE_DICT_KEY_NAME to the key that holds the weights (e.g. "
        "state_dict, model), or to '' for a plain state dict"]
    assert "init process group" not in proc.stdout


WORKERS = ["config.DATA.NUM_DATALOADER_WORKERS=auto"]  # the default data-loader workers


@pytest.fixture(scope="module")
def first_extraction(tmp_path_factory):
    """A finished command-line extraction (TINY, the default data-loader workers): the earlier
    run of the tests below, each of which extracts again into a copy of its folder."""
    folder = tmp_path_factory.mktemp("first_extraction") / "out"
    first = extract_cli(folder, WORKERS)
    assert first.returncode == 0, first.stderr
    return folder


def test_full_disk_during_extraction_keeps_earlier_files_and_says_what_is_complete(
        tmp_path, first_extraction):
    out = copy_of(first_extraction, tmp_path / "out")
    before = {path.name: path.read_bytes() for path in out.iterdir() if path.suffix == ".npy"}

    # 4 files per batch (inds, targets, 2 layers); train has 5 batches: the 22nd write is the
    # second one of the test split
    proc = extract_cli(out, env={"SSL_ENGINE_PLUGINS": "plugins.full_disk",
                                 "SSL_ENGINE_TEST_FULL_DISK_ROWS": "22"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: could not write the test features to {out}: No space left on device (ENOSPC). "
        "Its temporary files were removed and files of earlier runs left as they were; the "
        f"train features are complete in {out}. Free space and run the extraction again"]
    assert not [path.name for path in out.iterdir() if path.name.endswith(".tmp")]
    after = {path.name: path.read_bytes() for path in out.iterdir() if path.suffix == ".npy"}
    assert after == before  # same weights and data: the rewritten train files are identical


def test_dead_data_loader_worker_ends_extraction_with_one_message(tmp_path):
    out = tmp_path / "out"
    proc = extract_cli(out, ["config.DATA.TRAIN.DATA_SOURCES=[worker_killing_synthetic]",
                             "config.DATA.NUM_DATALOADER_WORKERS=1"],
                       env={"SSL_ENGINE_PLUGINS": "plugins.kill_worker",
                            "SSL_ENGINE_TEST_KILL_AT": "12"})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: a data-loader worker died while reading config.DATA.TRAIN (data sources "
        "['worker_killing_synthetic']): DataLoader worker (pid"), proc.stderr
    assert final_names(out) == [] and not list(out.glob(".*.tmp"))


# ---------------------------------------------------------------- non-finite features
def test_check_finite_names_the_layer_and_the_dataset_index_of_the_first_bad_sample():
    inds = torch.arange(8, 16)
    fine = torch.randn(8, 3)
    bad = fine.clone()
    bad[2, 1], bad[5, 0] = float("nan"), float("inf")
    fx.check_finite({"res4": fine, "classes": torch.arange(8)[:, None]}, inds, "TRAIN")
    with pytest.raises(NonFiniteFeatures, match=r"^the train features of layer res5avg are "
                                                   r"not finite \(NaN or inf\) at dataset "
                                                   r"index 10$"):
        fx.check_finite({"res4": fine, "res5avg": bad}, inds, "TRAIN")


def nan_weights(path):
    """A checkpoint of this engine whose every floating-point weight is NaN."""
    save_weights(path)
    state = torch.load(path, weights_only=True)
    model = state["classy_state_dict"]["base_model"]["model"]
    for part in model.values():
        for key, value in part.items():
            if value.is_floating_point():
                part[key] = torch.full_like(value, float("nan"))
    torch.save(state, path)


def test_nan_weights_stop_extraction_with_one_line_and_earlier_files_stay(tmp_path,
                                                                         first_extraction):
    out = copy_of(first_extraction, tmp_path / "out")
    before = {path.name: path.read_bytes() for path in out.iterdir() if path.suffix == ".npy"}
    weights = tmp_path / "nan.torch"
    nan_weights(weights)

    proc = extract_cli(out, [*WORKERS, f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}"])
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: the train features of layer res4 are not finite (NaN or inf) at dataset index "
        "0: the model gives non-finite values with these weights "
        "(config.MODEL.WEIGHTS_INIT.PARAMS_FILE) or inputs. Its temporary files were removed "
        "and files of earlier runs left as they were; no split of this run was complete"]
    after = {path.name: path.read_bytes() for path in out.iterdir() if path.suffix == ".npy"}
    assert after == before
    assert not [path.name for path in out.iterdir() if path.name.endswith(".tmp")]


# ---------------------------------------------------------------- the folder's files and index
def split_npy(folder, split):
    return sorted(path.name for path in folder.glob(f"{split}_*.npy"))


def test_a_new_extraction_removes_the_layers_it_does_not_write_and_lists_its_files(
        tmp_path, first_extraction):
    out = copy_of(first_extraction, tmp_path / "out")
    test_files = {name: (out / name).read_bytes() for name in split_npy(out, "test")}
    assert len(test_files) == 6
    others = {"notes.txt": b"mine", "train_res4_features.npy.bak": b"a copy",
              "train_res4.npy": b"other naming", "train_heads_predictions.npy": b"label",
              "train_heads_targets.npy": b"predictions"}
    for name, content in others.items():
        (out / name).write_bytes(content)

    # only res5avg, of fewer samples, of the train split only
    proc = extract_cli(out, [*WORKERS, "config.EXTRACT_FEATURES.SPLITS=[TRAIN]",
                             "config.DATA.TRAIN.SYNTHETIC.NUM_SAMPLES=16",
                             "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP="
                             "[[res5avg,[Identity,[]]]]"])
    assert proc.returncode == 0, proc.stderr
    written = ["train_res5avg_features.npy", "train_res5avg_inds.npy",
               "train_res5avg_targets.npy"]
    assert [name for name in split_npy(out, "train") if name not in others] == written
    assert load_extracted(out, "train", "res5avg").features.shape == (16, DIMS["res5avg"])
    assert (f"removed from {out} the train files of an earlier extraction that this one did not "
            "write: train_res4_features.npy, train_res4_targets.npy, train_res4_inds.npy"
            ) in proc.stdout
    index = json.loads((out / "train_extraction.json").read_text())
    assert sorted(index["files"]) == written
    assert index["layers"] == ["res5avg"] and index["samples"] == 16
    # what is not the extraction's, and the split it did not extract, are left as they were
    assert {name: (out / name).read_bytes() for name in others} == others
    assert {name: (out / name).read_bytes() for name in split_npy(out, "test")} == test_files
    test_index = json.loads((out / "test_extraction.json").read_text())
    assert sorted(test_index["files"]) == sorted(test_files)


# ---------------------------------------------------------------- trunk features, heads, checks
QUICKSTART_TRUNK_ONLY = [
    "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=true",
    "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true",
    "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res5avg,[Identity,[]]]]",
    "config.DATA.TRAIN.DATA_LIMIT=24", "config.DATA.TEST.DATA_LIMIT=24",
    "config.EXTRACT_FEATURES.SPLITS=[TRAIN]",
]


@pytest.mark.parametrize("method", ["moco_v3", "byol", "simsiam"])
def test_trunk_only_extraction_of_a_config_with_projector_and_predictor_builds_no_head(
        tmp_path, method):
    from ssl_engine.engines.prelaunch import check_before_launch

    engine_name, cfg = load_config([f"config=quickstart/{method}_digits",
                                    "engine_name=extract_features", *QUICKSTART_TRUNK_ONLY,
                                    f"config.CHECKPOINT.DIR={tmp_path}"])
    assert len(cfg.MODEL.HEAD.PARAMS) == 2  # projector and predictor
    check_before_launch(engine_name, cfg)
    model = build_model(cfg.MODEL)
    assert len(model.heads) == 0 and model.extract_layer_names() == ["res5avg"]


def test_trunk_only_extraction_from_a_byol_checkpoint_equals_a_headless_one(tmp_path):
    """The weights file holds the projector and predictor: extracting the trunk features of the
    quickstart gives what the same extraction with MODEL.HEAD.PARAMS=[] gives."""
    base = ["config=quickstart/byol_digits", *QUICKSTART_TRUNK_ONLY]
    _, cfg = load_config(["config=quickstart/byol_digits"])  # as pretrained
    torch.manual_seed(0)
    model = build_model(cfg.MODEL)
    assert len(model.heads) == 2
    weights = tmp_path / "byol.torch"
    torch.save({"classy_state_dict": {"base_model": model.get_classy_state()}}, weights)

    runs = {}
    for name, extra in (("heads", []), ("headless", ["config.MODEL.HEAD.PARAMS=[]"])):
        proc = extract_cli(tmp_path / name, [f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={weights}",
                                             *extra], base=base)
        assert proc.returncode == 0, proc.stderr
        runs[name] = load_extracted(tmp_path / name, "train", "res5avg")
    assert runs["heads"].features.shape == (24, 256)
    assert np.array_equal(runs["heads"].features, runs["headless"].features)


def test_a_model_without_heads_extracts_its_trunk_output_as_heads():
    """VISSL's extraction of a headless model without EXTRACT_TRUNK_FEATURES_ONLY (its
    extract_resnet_in1k_8gpu file) saved the model's output, the trunk's, as "heads": the
    pooled stages in eval mode, else the trunk's default output flattened."""
    _, cfg = load_config([CONFIG, *TINY])
    assert cfg.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY and not cfg.MODEL.HEAD.PARAMS
    torch.manual_seed(0)
    trunk_only = build_model(cfg.MODEL).eval()
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        stages = trunk_only.extract_layers(images)
    assert list(stages) == ["res4", "res5avg"]
    settings = cfg.MODEL.FEATURE_EVAL_SETTINGS
    settings.EXTRACT_TRUNK_FEATURES_ONLY = False
    headless = build_model(cfg.MODEL).eval()
    headless.load_state_dict(trunk_only.state_dict())
    with torch.no_grad():
        layers = headless.extract_layers(images)
    assert list(layers) == ["heads0", "heads1"]
    for name, stage in zip(layers, stages):
        assert torch.equal(layers[name], stages[stage].flatten(1))
    settings.EVAL_MODE_ON = False
    plain = build_model(cfg.MODEL).eval()
    plain.load_state_dict(trunk_only.state_dict())
    with torch.no_grad():
        (name, output), = plain.extract_layers(images).items()
        expected = torch.flatten(plain.trunk(images)[0], 1)
    assert name == "heads" and output.shape == (3, 64) and torch.equal(output, expected)


LINEAR_EVAL = ["config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=false",
               "config.MODEL.HEAD.PARAMS=[[eval_mlp,{in_channels:64,dims:[64,4]}]]"]


@pytest.mark.parametrize("overrides, message", [
    (LINEAR_EVAL,
     "MODEL.HEAD.PARAMS has 1 head(s) but MODEL.FEATURE_EVAL_SETTINGS."
     "LINEAR_EVAL_FEAT_POOL_OPS_MAP has 2 stage(s) ['res4', 'res5avg']: with "
     "MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON every stage needs its own head, in the same "
     "order"),
    (["config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[[res9,[Identity,[]]]]"],
     "MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP: ResNetTrunk has no stage(s) "
     "['res9']; its stages are: conv1, res1, res2, res3, res4, res5, res5avg"),
], ids=["heads_and_stages", "unknown_stage"])
def test_model_settings_that_cannot_extract_are_refused_before_launch(tmp_path, overrides,
                                                                      message):
    proc = extract_cli(tmp_path / "out", overrides)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {message}"]
    assert "init process group" not in proc.stdout
