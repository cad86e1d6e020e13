#!/usr/bin/env python
"""MAE's bar on the bundled digits: fine-tuning the MAE checkpoint with 5 labels per class
against fine-tuning the same ViT from random initialisation with the same labels and schedule.

Three runs, each from the command line as a user runs it
(``tools/run_distributed_engines.py``), into fresh folders under OUT:

1. ``mae``: the pretraining, ``config=quickstart/mae_vit_digits`` (its feature report gives the
   frozen features' k-NN and 1-/5-shot accuracy);
2. ``finetune_mae``: ``config=benchmark/fulltune/digits/finetune_vit_digits`` from the MAE
   checkpoint (``MODEL.WEIGHTS_INIT.PARAMS_FILE``);
3. ``finetune_random``: the same fine-tuning with ``PARAMS_FILE=""`` (random initialisation).

It prints the TEST top-1 of both fine-tunings (the last test phase) and their difference; the
bar is a difference of at least 10 points.

    python benchmarks/mae_finetune_digits.py [--out DIR] [--pretrain config.A=v ...]
        [--finetune config.A=v ...] [--skip-pretrain]
"""
import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FRESH = ["config.CHECKPOINT.AUTO_RESUME=false", "config.CHECKPOINT.OVERWRITE_EXISTING=true"]


def run_engine(config: str, folder: Path, overrides) -> float:
    """Runs one config into ``folder``; returns its wall time (raises on failure)."""
    command = [sys.executable, str(REPO / "tools/run_distributed_engines.py"), f"config={config}",
               f"config.CHECKPOINT.DIR={folder}", *FRESH, *overrides]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{config} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def records(folder: Path) -> list:
    return [json.loads(line) for line in (folder / "metrics.json").read_text().splitlines()]


def last_test_top1(folder: Path) -> float:
    """The TEST top-1 (%) of the last test phase in ``folder``'s metrics.json."""
    tests = [r for r in records(folder) if r.get("phase_end") == "test"]
    if not tests:
        raise RuntimeError(f"no test phase in {folder}/metrics.json")
    top1 = tests[-1]["meters"]["accuracy_list_meter"]["top_1"]  # {meter name: percent}
    return float(next(iter(top1.values())))


def final_checkpoint(folder: Path) -> Path:
    finals = sorted(folder.glob("model_final_checkpoint_*.torch"))
    return finals[-1] if finals else folder / "checkpoint.torch"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temp dir)")
    parser.add_argument("--pretrain", nargs="*", default=[],
                        help="config.A.B=v overrides of the MAE pretraining")
    parser.add_argument("--finetune", nargs="*", default=[],
                        help="config.A.B=v overrides of both fine-tunings")
    parser.add_argument("--skip-pretrain", action="store_true",
                        help="reuse OUT/mae from an earlier run")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="mae_finetune_digits_"))
    walls = {}
    if not args.skip_pretrain:
        walls["mae"] = run_engine("quickstart/mae_vit_digits", out / "mae", args.pretrain)
    report = next((r["feature_report"] for r in records(out / "mae") if "feature_report" in r),
                  None)
    finetune = "benchmark/fulltune/digits/finetune_vit_digits"
    checkpoint = final_checkpoint(out / "mae")
    walls["finetune_mae"] = run_engine(
        finetune, out / "finetune_mae",
        [f"config.MODEL.WEIGHTS_INIT.PARAMS_FILE={checkpoint}", *args.finetune])
    walls["finetune_random"] = run_engine(
        finetune, out / "finetune_random",
        ["config.MODEL.WEIGHTS_INIT.PARAMS_FILE=''", *args.finetune])
    from_mae = last_test_top1(out / "finetune_mae")
    from_random = last_test_top1(out / "finetune_random")
    print(f"runs in {out}; wall s: " + ", ".join(f"{k} {v:.0f}" for k, v in walls.items()))
    if report:
        for row in ("learned", "random_init", "raw_pixels"):
            low = report[row]["low_shot"]
            print(f"frozen {report['layer']} {row:<12} kNN {report[row]['knn_top1']:6.2f}  "
                  f"1-shot {low['1']['mean']:6.2f} ± {low['1']['std']:4.2f}  "
                  f"5-shot {low['5']['mean']:6.2f} ± {low['5']['std']:4.2f}")
    print(f"fine-tuned, 5 labels per class, TEST top-1: from MAE {from_mae:.2f}, "
          f"from random initialisation {from_random:.2f}, difference {from_mae - from_random:+.2f}"
          f" (bar: +10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
