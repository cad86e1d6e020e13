"""tools/geolocalization_test.py on tiny images the test writes: predictions of the heads,
their cells' places from a partitioning CSV, distances to the true places."""
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ssl_engine.evaluation.geolocalization import accuracy_within, great_circle_km
from test_extract_features import CONFIG, TINY

TOOL = Path(__file__).resolve().parents[1] / "tools/geolocalization_test.py"
CELLS = [(3, 48.85, 2.35), (0, 40.71, -74.01), (2, -33.87, 151.21), (1, 35.68, 139.69)]


def haversine(lat1, lon1, lat2, lon2):
    p1, p2 = math.radians(lat1), math.radians(lat2)
    a = math.sin((p2 - p1) / 2) ** 2 + math.cos(p1) * math.cos(p2) * \
        math.sin(math.radians(lon2 - lon1) / 2) ** 2
    return 2 * 6371 * math.asin(math.sqrt(a))


def test_distances_and_accuracies_against_known_values():
    # Paris - New York is about 5837 km; a point and itself is 0
    d = great_circle_km([48.8566, 1.0], [2.3522, 2.0], [40.7128, 1.0], [-74.0060, 2.0])
    assert d[0] == pytest.approx(5837, abs=2) and d[1] == 0
    assert accuracy_within([0.5, 20, 300, 800], [1, 25, 2500]) == \
        {"1": 25.0, "25": 50.0, "2500": 100.0}


def test_tool_scores_the_predicted_cells(tmp_path, capsys):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(7):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    np.save(tmp_path / "images.npy", np.array(paths))
    places = np.stack([rng.uniform(-60, 60, 7), rng.uniform(-180, 180, 7)], 1)
    np.save(tmp_path / "places.npy", places)
    csv = tmp_path / "cells_50_5000.csv"
    csv.write_text("# comment\n# comment\nclass_label,hex_id,latitude_mean,longitude_mean\n"
                   + "".join(f"{c},h{c},{lat},{lon}\n" for c, lat, lon in CELLS))
    out = tmp_path / "out"
    argv = [CONFIG, *TINY, f"config.CHECKPOINT.DIR={out}",
            "config.MODEL.FEATURE_EVAL_SETTINGS.EXTRACT_TRUNK_FEATURES_ONLY=false",
            "config.MODEL.FEATURE_EVAL_SETTINGS.LINEAR_EVAL_FEAT_POOL_OPS_MAP=[]",
            "config.MODEL.HEAD.PARAMS=[[mlp,{dims:[64,4]}]]",
            "config.DATA.TEST.DATA_SOURCES=[disk_filelist]",
            f"config.DATA.TEST.DATA_PATHS=[{tmp_path}/images.npy]",
            f"config.DATA.TEST.LABEL_PATHS=[{tmp_path}/places.npy]",
            "config.DATA.TEST.LABEL_TYPE=sample_index",
            f"config.GEO_LOCALIZATION.TRAIN_LABEL_MAPPING={csv}",
            "config.GEO_LOCALIZATION.ACC_KM_THRESHOLDS=[2500,8000,15000]"]
    spec = importlib.util.spec_from_file_location("geolocalization_test", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(argv) == 0
    predicted = np.load(out / "test_heads_predictions.npy")[:, 0]
    inds = np.load(out / "test_heads_inds.npy")
    assert sorted(inds.tolist()) == list(range(7))
    by_class = {c: (lat, lon) for c, lat, lon in sorted(CELLS)}
    distances = [haversine(*by_class[int(c)], *places[i]) for c, i in zip(predicted, inds)]
    expected = {str(t): round(100 * np.mean(np.array(distances) <= t), 4)
                for t in (2500, 8000, 15000)}
    lines = (out / "metrics.json").read_text().splitlines()
    (record,) = [json.loads(line)["geolocalization"] for line in lines
                 if "geolocalization" in json.loads(line)]
    assert record == {"layer": "heads", "images": 7, "accuracy_within_km": expected}
    per_image = json.loads((out / "output_metadata_predictions.json").read_text())
    first = per_image[paths[int(inds[0])]]
    assert first["pred_cls"] == int(predicted[0])
    assert first["distance_km"] == pytest.approx(distances[0])
    assert "% of TEST images within 2500 km" in capsys.readouterr().out
