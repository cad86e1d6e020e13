#!/usr/bin/env python
"""VISSL's geolocalisation benchmark: predict a geographic cell for every TEST image, score the
distance from that cell's centre to the image's true place.

    python tools/geolocalization_test.py \
        config=benchmark/geolocalization/eval_resnet_1gpu_geolocalization \
        +config/benchmark/geolocalization/partitioning=coarse \
        +config/benchmark/geolocalization/models_coarse=regnet8gf \
        config.MODEL.WEIGHTS_INIT.PARAMS_FILE=<checkpoint> \
        config.GEO_LOCALIZATION.TRAIN_LABEL_MAPPING=/data/im2gps/cells_50_5000.csv

1. The extract_label_predictions engine writes the TEST predictions of the heads (one output,
   ``heads``) into EXTRACT_FEATURES.OUTPUT_DIR or CHECKPOINT.DIR.
2. GEO_LOCALIZATION.TRAIN_LABEL_MAPPING is the partitioning CSV of the classes (two comment
   rows, then a header with ``class_label``, ``hex_id``, ``latitude_mean``,
   ``longitude_mean``): class i is the i-th row in class_label order.
3. The true places are the TEST labels file (DATA.TEST.LABEL_PATHS[0], or the catalog entry's
   labels path): a .npy of [N, 2] latitude, longitude rows in the order of the image list.
4. The great-circle distance (haversine, R = 6371 km) of each image; the percentage within each
   of GEO_LOCALIZATION.ACC_KM_THRESHOLDS is printed, written to output_metadata_predictions.json
   (per image) and appended to metrics.json as {"geolocalization": ...}.
"""
import csv
import json
import sys
from pathlib import Path

import numpy as np

from ssl_engine.engines.evaluate_extracted import run_tool
from ssl_engine.engines.launcher import launch_distributed
from ssl_engine.engines.prelaunch import check_before_launch
from ssl_engine.evaluation.geolocalization import geolocalization_eval
from ssl_engine.extraction.files import extraction_dir

LAYER = "heads"
COLUMNS = ("class_label", "latitude_mean", "longitude_mean")


def read_partitioning(path: str) -> np.ndarray:
    """[C, 2] latitude, longitude of each class of the partitioning CSV, in class_label order."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"config.GEO_LOCALIZATION.TRAIN_LABEL_MAPPING={path}: no such "
                                "file (the partitioning CSV of the classes)")
    with open(path, newline="") as f:
        lines = f.read().splitlines()[2:]  # two comment rows above the header
    rows = list(csv.DictReader(lines))
    missing = [c for c in COLUMNS if not rows or c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: the partitioning CSV needs the columns {', '.join(COLUMNS)} "
                         f"in its third row; missing: {', '.join(missing)}")
    rows.sort(key=lambda row: int(row["class_label"]))
    return np.array([[float(r["latitude_mean"]), float(r["longitude_mean"])] for r in rows])


def run(cfg):
    test = cfg.DATA.TEST
    if not test.LABEL_PATHS or not test.LABEL_PATHS[0]:
        raise ValueError("the true places of the TEST images are read from "
                         "config.DATA.TEST.LABEL_PATHS[0] (or the catalog entry's labels "
                         "path): none is set or found")
    cells = read_partitioning(cfg.GEO_LOCALIZATION.TRAIN_LABEL_MAPPING)
    cfg.EXTRACT_FEATURES.SPLITS = ["TEST"]
    check_before_launch("extract_label_predictions", cfg)
    launch_distributed(cfg, "extract_label_predictions")
    folder = extraction_dir(cfg)
    predictions = np.load(folder / f"test_{LAYER}_predictions.npy")
    inds = np.load(folder / f"test_{LAYER}_inds.npy")
    truth = np.asarray(np.load(test.LABEL_PATHS[0], allow_pickle=True), dtype=np.float64)
    accuracy, distances = geolocalization_eval(predictions[:, 0], cells, truth[inds],
                                               cfg.GEO_LOCALIZATION.ACC_KM_THRESHOLDS)
    images = np.load(test.DATA_PATHS[0], allow_pickle=True) \
        if str(test.DATA_PATHS[0]).endswith(".npy") else inds
    per_image = {str(images[i]): {"target_lat": float(truth[i, 0]),
                                  "target_long": float(truth[i, 1]),
                                  "pred_lat": float(cells[c, 0]), "pred_long": float(cells[c, 1]),
                                  "pred_cls": int(c), "distance_km": float(d)}
                 for i, c, d in zip(inds, predictions[:, 0], distances)}
    (folder / "output_metadata_predictions.json").write_text(json.dumps(per_image))
    print("geolocalisation: % of TEST images within " + ", ".join(
        f"{km} km: {acc:.2f}" for km, acc in accuracy.items()))
    return folder, {"geolocalization": {"layer": LAYER, "images": len(inds),
                                        "accuracy_within_km": accuracy}}


def main(argv) -> int:
    return run_tool(argv, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
