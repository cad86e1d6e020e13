#!/usr/bin/env python
"""Every method's quickstart recipe on the bundled digits, one after the other, in one table.

Each recipe runs from the command line exactly as a user runs it
(``tools/run_distributed_engines.py config=quickstart/<method>_digits``) into a fresh folder;
its feature report (k-NN top-1 and 1-/5-shot nearest-neighbour accuracy of the res5avg
features, from metrics.json) and its wall time are collected.  Images/s counts training
images (not views) per second over the whole training.  The raw-pixel row is the baseline
every method must beat at 1-shot by at least 5 points.

    python benchmarks/methods_digits.py [--methods simclr byol ...] [--out DIR]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ssl_engine.losses  # noqa: F401  (the losses' derived settings and key rules)
import ssl_engine.models  # noqa: F401  (the trunks')
from ssl_engine.config import load_config
from ssl_engine.report import comparison_figure, comparison_table, read_run_folder, save_figure

REPO = Path(__file__).resolve().parents[1]
METHODS = ["simclr", "moco_v2", "moco_v3", "byol", "simsiam", "barlow_twins", "vicreg", "swav",
           "dino", "dino_vit", "msn_vit", "dinov2_vit", "ibot_vit", "mae_vit", "nnclr", "dcl",
           "mmcr", "pmsn_vit", "lejepa", "ijepa_vit", "aim_vit", "data2vec_vit", "dinov3_vit",
           "capi_vit"]


def run_recipe(method: str, out_dir: Path, overrides) -> dict:
    folder = out_dir / method
    command = [sys.executable, str(REPO / "tools/run_distributed_engines.py"),
               f"config=quickstart/{method}_digits", f"config.CHECKPOINT.DIR={folder}",
               "config.CHECKPOINT.AUTO_RESUME=false", "config.CHECKPOINT.OVERWRITE_EXISTING=true",
               *overrides]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"method": method, "error": proc.stderr.strip().splitlines()[-1:], "wall": wall}
    records = [json.loads(line) for line in (folder / "metrics.json").read_text().splitlines()]
    report = next(r["feature_report"] for r in records if "feature_report" in r)
    phases = [r for r in records if r.get("phase_end") == "train"]
    train_time = sum(r["phase_time_seconds"] for r in phases)
    _, cfg = load_config([f"config=quickstart/{method}_digits", *overrides])
    last_iteration = max(r["iteration"] for r in records if r.get("phase") == "train")
    images = last_iteration * cfg.DATA.TRAIN.BATCHSIZE_PER_REPLICA * \
        cfg.DISTRIBUTED.NUM_PROC_PER_NODE * cfg.DISTRIBUTED.NUM_NODES
    return {"method": method, "report": report, "wall": wall,
            "images_per_sec": images / train_time if train_time else float("nan")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temp dir)")
    parser.add_argument("--figure", default=None,
                        help="the runs side by side as a PNG (default: OUT/methods_digits.png)")
    parser.add_argument("overrides", nargs="*", help="config.A.B=v applied to every recipe")
    args = parser.parse_args(argv)
    out_dir = Path(args.out or tempfile.mkdtemp(prefix="methods_digits_"))
    shots = [1, 5]
    results = []
    for method in args.methods:
        result = run_recipe(method, out_dir, args.overrides)
        results.append(result)
        if "error" in result:
            print(f"{method}: failed after {result['wall']:.0f}s: {result['error']}", flush=True)
            continue
        learned = result["report"]["learned"]
        print(f"{method}: kNN {learned['knn_top1']:.2f}, 1-shot "
              f"{learned['low_shot']['1']['mean']:.2f}, {result['wall']:.0f}s", flush=True)
    done = [r for r in results if "error" not in r]
    if not done:
        return 1
    print(f"\nres5avg features; k-NN top-1 (k=20); low-shot 1-NN mean ± std over 10 seeds; "
          f"runs in {out_dir}\n")
    print(f"{'method':<14}{'kNN top-1':>9}  {'1-shot':>13}  {'5-shot':>13}  {'1-shot vs raw':>13}"
          f"  {'wall s':>6}  {'img/s':>6}")
    raw = done[0]["report"]["raw_pixels"]
    raw_one = raw["low_shot"]["1"]["mean"]
    for r in done:
        learned = r["report"]["learned"]
        low = learned["low_shot"]
        print(f"{r['method']:<14}{learned['knn_top1']:9.2f}  "
              f"{low['1']['mean']:6.2f} ± {low['1']['std']:4.2f}  "
              f"{low['5']['mean']:6.2f} ± {low['5']['std']:4.2f}  "
              f"{low['1']['mean'] - raw_one:+13.2f}  {r['wall']:6.0f}  {r['images_per_sec']:6.0f}")
    print(f"{'raw pixels':<14}{raw['knn_top1']:9.2f}  {raw['low_shot']['1']['mean']:6.2f} ± "
          f"{raw['low_shot']['1']['std']:4.2f}  {raw['low_shot']['5']['mean']:6.2f} ± "
          f"{raw['low_shot']['5']['std']:4.2f}")
    rand = done[0]["report"]["random_init"]
    print(f"{'random init':<14}{rand['knn_top1']:9.2f}  {rand['low_shot']['1']['mean']:6.2f} ± "
          f"{rand['low_shot']['1']['std']:4.2f}  {rand['low_shot']['5']['mean']:6.2f} ± "
          f"{rand['low_shot']['5']['std']:4.2f}")
    runs = [read_run_folder(out_dir / r["method"]) for r in done]
    figure = save_figure(comparison_figure(runs), args.figure or out_dir / "methods_digits.png")
    table = "\n".join("  " + line for line in comparison_table(runs).splitlines())
    print(f"\nruns side by side (tools/compare_runs.py):\n{table}\npicture: {figure}")
    return 0 if len(done) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
