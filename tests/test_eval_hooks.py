import pickle

import pytest
import torch
import torch.distributed as dist

from engine_utils import QUICK, final_weights, metrics, run_engine, step_losses
from gloo_utils import spawn_ranks
from ssl_engine.config import load_config
from ssl_engine.data import build_dataset
from ssl_engine.evaluation.knn import knn_classify
from ssl_engine.evaluation.labelled_features import EvalSplits, evaluation_mode
from ssl_engine.evaluation.low_shot import low_shot_eval
from ssl_engine.evaluation.feature_report import feature_report_table
from ssl_engine.hooks import FeatureReportHook, KnnEvalHook
from ssl_engine.trainer.default_hooks import default_hook_generator

TEST_TRANSFORMS = ("[{name: ImgReplicatePil, num_times: 2}, {name: Resize, size: 16}, "
                   "{name: ToTensor}, {name: Normalize, mean: [0.5, 0.5, 0.5], "
                   "std: [0.25, 0.25, 0.25]}]")
WITH_TEST_SPLIT = [
    "config.TEST_MODEL=true", "config.DATA.TEST.DATA_SOURCES=[synthetic]",
    "config.DATA.TEST.DATA_PATHS=['']", "config.DATA.TEST.BATCHSIZE_PER_REPLICA=12",
    "config.DATA.TEST.COLLATE_FUNCTION=simclr_collator",
    "config.DATA.TEST.SYNTHETIC={NUM_SAMPLES: 20, IMAGE_SIZE: 24, NUM_CLASSES: 4}",
    f"config.DATA.TEST.TRANSFORMS={TEST_TRANSFORMS}",
]
HOOKS_ON = ["config.HOOKS.KNN_EVAL.USE_KNN_EVAL=true", "config.HOOKS.FEATURE_REPORT.ENABLED=true",
            "config.NEAREST_NEIGHBOR.TOPK=5", "config.LOW_SHOT.SEEDS=[0,1,2]",
            "config.HOOKS.ONLINE_LINEAR_PROBE.ENABLED=true"]
ROWS = ("learned", "random_init", "raw_pixels")


def raw_pixels(split):
    """The split's images under the single-view test transforms, read straight from the dataset."""
    transforms = TEST_TRANSFORMS.replace("{name: ImgReplicatePil, num_times: 2}, ", "")
    _, cfg = load_config([QUICK, *WITH_TEST_SPLIT, f"config.DATA.{split}.TRANSFORMS={transforms}"])
    dataset = build_dataset(cfg, split)
    samples = [dataset[i] for i in range(len(dataset))]
    return (torch.stack([s["data"][0].flatten() for s in samples]),
            torch.tensor([s["label"][0] for s in samples]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval_hooks")
    run_engine(root / "off", WITH_TEST_SPLIT)
    run_engine(root / "on", WITH_TEST_SPLIT + HOOKS_ON)
    return root / "off", root / "on"


def test_hooks_do_not_change_training(runs):
    off, on = runs
    assert step_losses(off) == step_losses(on)
    weights_off, weights_on = final_weights(off), final_weights(on)
    assert weights_off.keys() == weights_on.keys()
    for name in weights_off:
        assert torch.equal(weights_off[name], weights_on[name]), name
    assert not [m for m in metrics(off) if "knn" in m or "feature_report" in m
                or "online_probe" in m]


def test_knn_record_after_every_test_phase(runs):
    records = [m["knn"] for m in metrics(runs[1]) if "knn" in m]
    assert [r["train_phase_idx"] for r in records] == [0, 1]
    for record in records:
        assert record["layer"] == "res5avg"
        assert 0 <= record["top1"] <= 100
        assert record["top5"] == 100.0  # 4 classes: the top 5 holds every class
    assert "kNN top-1" in (runs[1] / "log.txt").read_text()


def test_online_probe_record_after_every_test_phase(runs):
    records = [m["online_probe"] for m in metrics(runs[1]) if "online_probe" in m]
    assert [r["train_phase_idx"] for r in records] == [0, 1]
    for record in records:
        assert record["layer"] == "res5avg" and 0 <= record["top1"] <= 100
        assert record["top5"] == 100.0  # 4 classes: the top 5 holds every class


def test_feature_report_record_and_table(runs):
    (report,) = [m["feature_report"] for m in metrics(runs[1]) if "feature_report" in m]
    assert report["layer"] == "res5avg"
    for row in ROWS:
        assert 0 <= report[row]["knn_top1"] <= 100
        assert sorted(report[row]["low_shot"]) == ["1", "5"]
        for shot in ("1", "5"):
            stats = report[row]["low_shot"][shot]
            assert len(stats["per_seed"]) == 3
            assert all(0 <= v <= 100 for v in stats["per_seed"])
    # the raw-pixel row, recomputed from the datasets without the hook's feature gathering
    train_x, train_y = raw_pixels("TRAIN")
    test_x, test_y = raw_pixels("TEST")
    expected_knn = knn_classify(train_x, train_y, test_x, test_y, topk=5)
    assert report["raw_pixels"]["knn_top1"] == pytest.approx(expected_knn["top1"])
    expected_low_shot = low_shot_eval(train_x, train_y, test_x, test_y, seeds=(0, 1, 2))
    for shot in (1, 5):
        assert report["raw_pixels"]["low_shot"][str(shot)]["per_seed"] == \
            pytest.approx(expected_low_shot[shot]["per_seed"])
    rows = {row: {**report[row], "low_shot": {int(shot): stats for shot, stats
                                              in report[row]["low_shot"].items()}}
            for row in ROWS}
    table = feature_report_table(rows, [1, 5])
    assert table.splitlines()[0].split() == ["features", "kNN", "top-1", "1-shot", "5-shot"]
    assert table in (runs[1] / "log.txt").read_text()


def test_report_table_is_aligned():
    results = {
        "learned": {"knn_top1": 91.256, "low_shot": {1: {"mean": 40.0, "std": 2.345},
                                                     5: {"mean": 75.5, "std": 0.5}}},
        "raw_pixels": {"knn_top1": 8.0, "low_shot": {1: {"mean": 100.0, "std": 0.0},
                                                     5: {"mean": 9.25, "std": 10.125}}},
    }
    assert feature_report_table(results, [1, 5]).splitlines() == [
        "features    kNN top-1         1-shot        5-shot",
        "learned         91.26   40.00 ± 2.35  75.50 ± 0.50",
        "raw pixels       8.00  100.00 ± 0.00  9.25 ± 10.12",
    ]


def test_hooks_are_added_by_the_config_and_check_it():
    _, cfg = load_config([QUICK, *WITH_TEST_SPLIT, *HOOKS_ON])
    kinds = [type(hook) for hook in default_hook_generator(cfg)]
    assert [kind for kind in kinds if kind in (KnnEvalHook, FeatureReportHook)] == [
        KnnEvalHook, FeatureReportHook]
    _, cfg = load_config([QUICK, "config.HOOKS.KNN_EVAL.USE_KNN_EVAL=true"])
    with pytest.raises(ValueError, match="runs at the end of test phases: set config.TEST_MODEL"):
        default_hook_generator(cfg)
    _, cfg = load_config([QUICK, "config.HOOKS.FEATURE_REPORT.ENABLED=true"])
    with pytest.raises(ValueError, match="needs labelled TRAIN and TEST data: set "
                                         "config.DATA.TEST.DATA_SOURCES"):
        default_hook_generator(cfg)


def test_evaluation_mode_restores_modes_and_random_state():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    model[1].eval()  # a frozen part stays frozen
    torch.manual_seed(5)
    with evaluation_mode(model):
        assert not any(m.training for m in model.modules())
        torch.rand(10)
    assert [m.training for m in model.modules()] == [True, True, False]
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with evaluation_mode(model):
        torch.rand(7)
    assert torch.equal(torch.rand(3), expected)


def gather_worker(rank, world_size, init_file, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    try:
        _, cfg = load_config([QUICK, *WITH_TEST_SPLIT, "config.DATA.TEST.BATCHSIZE_PER_REPLICA=3",
                              "config.DATA.TEST.SYNTHETIC.NUM_SAMPLES=11"])
        result = EvalSplits(cfg).features(lambda x: {"pixels": x}, torch.device("cpu"))
        assert (result is None) == (rank != 0)
        if rank == 0:
            with open(out_file, "wb") as handle:
                pickle.dump(result, handle)
    finally:
        dist.destroy_process_group()


def test_two_processes_gather_every_sample_once_in_order(tmp_path):
    """11 test samples over 2 ranks (padded with a repeat) in batches of 3."""
    spawn_ranks(gather_worker, 2, tmp_path, lambda init: (2, init, tmp_path / "out.pkl"))
    with open(tmp_path / "out.pkl", "rb") as handle:
        result = pickle.load(handle)
    for split, size in (("TRAIN", 32), ("TEST", 11)):
        pixels, labels = raw_pixels(split)
        assert torch.equal(result[split].features["pixels"], pixels[:size])
        assert torch.equal(result[split].targets, labels[:size])


def test_knn_hook_without_test_phases_is_refused_before_launch(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, str(repo / "tools/run_distributed_engines.py"),
         "config=test/quick_simclr_synthetic", f"config.CHECKPOINT.DIR={tmp_path}",
         "config.HOOKS.KNN_EVAL.USE_KNN_EVAL=true"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "error: config.HOOKS.KNN_EVAL.USE_KNN_EVAL runs at the end of test phases" in proc.stderr
    assert "Traceback" not in proc.stderr
