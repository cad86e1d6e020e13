"""Fashion-MNIST at full size: each method's recipe trained, its features scored on the 10,000
test images, beside raw pixels and (for SimCLR and BYOL) a reference loop built from lightly.

For each recipe of configs/config/benchmark/fashion_mnist/ named by --methods, one after the
other (never two trainings at once), on the 60,000 training images:

1. train with tools/run_distributed_engines.py (wall time from launch to exit);
2. extract res5avg features of the training and test images (engine_name=extract_features,
   one deterministic view);
3. score them on the test images: weighted k-NN (k=20, temperature 0.07, cosine), a linear
   probe (multinomial logistic regression on standardised features, C=1, all 60,000 labels)
   and 1% of the labels (600 training images, 60 per class, the same probe; mean over 3 draws).

``--reference simclr byol`` runs benchmarks/lightly_reference.py right after the engine's run of
the same method, on the same data and cores, and scores its features the same way. Raw pixels
(the test transforms' normalised pixels) are scored first. Prints one table, writes
results.json and draws the engine's runs side by side (ssl_engine.report's comparison figure).

    python benchmarks/fashion_mnist.py --methods simclr byol --reference simclr byol
    python benchmarks/fashion_mnist.py --methods simclr --limit 6000 --epochs 1   # a smoke run
    python benchmarks/fashion_mnist.py --methods simclr --epochs 3 \
        --override config.DATA.TRAIN.BATCHSIZE_PER_REPLICA=256           # a variant of the recipe

Needs the data set's files (docs/config.md: apt-get install dataset-fashion-mnist).
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
METHODS = ["simclr", "moco_v2", "byol", "barlow_twins", "vicreg", "swav", "dino"]
LAYER = "res5avg"
LOW_SHOT_SEEDS = (0, 1, 2)
LOW_SHOT_PER_CLASS = 60


def run(command, log: Path) -> float:
    """Run ``command`` in the repository, its output into ``log``; seconds taken."""
    start = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{' '.join(map(str, command[1:3]))} failed: {tail[0]}")
    return time.perf_counter() - start


def engine_features(method: str, folder: Path, common):
    """Train the recipe, then extract its features; (seconds training, {split: (x, y)})."""
    script = [sys.executable, str(REPO / "tools" / "run_distributed_engines.py"),
              f"config=benchmark/fashion_mnist/{method}", f"config.CHECKPOINT.DIR={folder}",
              *common]
    seconds = run(script, folder.parent / f"{method}_train.log")
    features = folder / "features"
    run(script + ["engine_name=extract_features",
                  f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={folder / 'checkpoint.torch'}",
                  "config.MODEL.FEATURE_EVAL_SETTINGS.EVAL_MODE_ON=true",
                  "config.MODEL.FEATURE_EVAL_SETTINGS.FREEZE_TRUNK_AND_HEAD=true",
                  "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=true",
                  f"config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP="
                  f"[[{LAYER},[Identity,[]]]]",
                  f"config.EXTRACT_FEATURES.OUTPUT_DIR={features}",
                  f"config.CHECKPOINT.DIR={folder}_extract"],
        folder.parent / f"{method}_extract.log")
    return seconds, {split: (np.load(features / f"{split}_{LAYER}_features.npy"),
                             np.load(features / f"{split}_{LAYER}_targets.npy").reshape(-1))
                     for split in ("train", "test")}


def reference_features(method: str, folder: Path, args):
    command = [sys.executable, str(REPO / "benchmarks" / "lightly_reference.py"), method,
               "--out", str(folder), "--data-root", args.data_root] + \
        (["--limit", str(args.limit)] if args.limit else []) + \
        (["--epochs", str(args.epochs)] if args.epochs else []) + \
        (["--override", *args.override] if args.override else [])
    run(command, folder.parent / f"{method}_reference.log")
    seconds = float((folder / "train_seconds.txt").read_text())
    return seconds, {split: (np.load(folder / f"{name}_features.npy"),
                             np.load(folder / f"{name}_labels.npy"))
                     for split, name in (("train", "train"), ("test", "t10k"))}


def raw_pixel_features(root: str):
    from lightly_reference import MEAN, STD, fashion_mnist  # beside this script

    data = {}
    for split, name in (("train", "train"), ("test", "t10k")):
        images, labels = fashion_mnist(root, name)
        pixels = (images.reshape(len(images), -1).astype(np.float32) / 255 - MEAN[0]) / STD[0]
        data[split] = (pixels, labels)
    return data


def low_shot_indices(labels: np.ndarray, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.choice(np.flatnonzero(labels == c), LOW_SHOT_PER_CLASS,
                                      replace=False) for c in np.unique(labels)])


def score(data) -> dict:
    """k-NN, linear probe and 1%-label accuracies (%) on the test split."""
    from ssl_engine.evaluation.knn import knn_classify
    from ssl_engine.evaluation.low_shot import logistic_regression_eval

    (train_x, train_y), (test_x, test_y) = data["train"], data["test"]
    knn = knn_classify(train_x, train_y, test_x, test_y, topk=20, sigma=0.07)["top1"]
    linear = logistic_regression_eval(train_x, train_y, test_x, test_y,
                                      lambdas=[len(train_x)])["top1"]  # C = 1
    shots = []
    for seed in LOW_SHOT_SEEDS:
        rows = low_shot_indices(train_y, seed)
        shots.append(logistic_regression_eval(train_x[rows], train_y[rows], test_x, test_y,
                                              lambdas=[len(rows)])["top1"])
    return {"knn": knn, "linear": linear, "one_percent": float(np.mean(shots)),
            "one_percent_std": float(np.std(shots))}


def table(rows) -> str:
    lines = [f"{'features':<22}{'k-NN':>7}{'linear':>8}{'1% labels':>15}{'train s':>9}"]
    for name, result in rows:
        lines.append(f"{name:<22}{result['knn']:>7.2f}{result['linear']:>8.2f}"
                     f"{result['one_percent']:>9.2f} ± {result['one_percent_std']:.2f}"
                     + (f"{result['seconds']:>9.0f}" if "seconds" in result else f"{'-':>9}"))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--reference", nargs="*", default=[], choices=["simclr", "byol"])
    parser.add_argument("--out", default=None, help="folder for the runs (default: temporary)")
    parser.add_argument("--limit", type=int, default=0, help="train on N images (smoke runs)")
    parser.add_argument("--epochs", type=int, default=0,
                        help="epochs instead of the recipe's (both loops; smoke runs)")
    parser.add_argument("--data-root", default="/usr/share/datasets/fashion-mnist",
                        help="folder of the four IDX files (gzipped or not)")
    parser.add_argument("--override", nargs="*", default=[],
                        help="config.X=v changes to every recipe (both loops)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="fashion_mnist_"))
    out.mkdir(parents=True, exist_ok=True)
    common = [f"config.DATA.{split}.DATA_PATHS=[{args.data_root}]" for split in ("TRAIN", "TEST")]
    common += ([f"config.DATA.TRAIN.DATA_LIMIT={args.limit}"] if args.limit else []) + \
        ([f"config.OPTIMIZER.num_epochs={args.epochs}"] if args.epochs else []) + args.override
    rows = [("raw pixels", score(raw_pixel_features(args.data_root)))]
    print(table(rows), flush=True)
    for method in args.methods:
        seconds, data = engine_features(method, out / method, common)
        rows.append((f"{method} (engine)", {**score(data), "seconds": seconds}))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
        if method in args.reference:
            seconds, data = reference_features(method, out / f"{method}_reference", args)
            rows.append((f"{method} (lightly loop)", {**score(data), "seconds": seconds}))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\nFashion-MNIST test set (10,000 images), {LAYER} features; runs in {out}\n")
    print(table(rows))
    (out / "results.json").write_text(json.dumps(dict(rows), indent=1))
    from ssl_engine.report import comparison_figure, read_run_folder, save_figure

    runs = [read_run_folder(out / method) for method in args.methods]
    print(f"figure: {save_figure(comparison_figure(runs), out / 'fashion_mnist.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
