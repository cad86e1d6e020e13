"""Geolocalisation scores (VISSL's GEO_LOCALIZATION benchmark, tools/geolocalization_test.py):
the great-circle distance between the place of each image's predicted geographic cell and its
true place, and the share of images within each distance."""
from typing import Dict, Sequence

import numpy as np

EARTH_RADIUS_KM = 6371.0


def great_circle_km(lat: np.ndarray, lon: np.ndarray, lat_true: np.ndarray,
                    lon_true: np.ndarray) -> np.ndarray:
    """Haversine distance in km on a sphere of radius 6371 km; angles in degrees."""
    lat, lon, lat_true, lon_true = (np.radians(np.asarray(v, dtype=np.float64))
                                    for v in (lat, lon, lat_true, lon_true))
    half = (np.sin((lat_true - lat) / 2) ** 2
            + np.cos(lat) * np.cos(lat_true) * np.sin((lon_true - lon) / 2) ** 2)
    return 2 * EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(half, 0.0, 1.0)))


def accuracy_within(distances_km: np.ndarray, thresholds_km: Sequence[float]) -> Dict[str, float]:
    """``{"<threshold>": % of images whose distance is <= threshold}`` (rounded to 4 places)."""
    distances_km = np.asarray(distances_km)
    if not len(distances_km):
        raise ValueError("no predictions to score")
    return {f"{t:g}": round(100.0 * float(np.mean(distances_km <= t)), 4)
            for t in thresholds_km}


def geolocalization_eval(predicted_cells: np.ndarray, cell_places: np.ndarray,
                         true_places: np.ndarray, thresholds_km: Sequence[float]):
    """(accuracy per threshold, distances): ``predicted_cells`` [N] class indices into
    ``cell_places`` [C, 2] (latitude, longitude per cell), ``true_places`` [N, 2]."""
    predicted_cells = np.asarray(predicted_cells, dtype=np.int64)
    if predicted_cells.size and (predicted_cells.min() < 0
                                 or predicted_cells.max() >= len(cell_places)):
        raise ValueError(f"a predicted class ({predicted_cells.max()}) is not a cell of the "
                         f"partitioning, which has {len(cell_places)}: the head's classes must "
                         "be the cells of GEO_LOCALIZATION.TRAIN_LABEL_MAPPING")
    places = np.asarray(cell_places, dtype=np.float64)[predicted_cells]
    truth = np.asarray(true_places, dtype=np.float64)
    distances = great_circle_km(places[:, 0], places[:, 1], truth[:, 0], truth[:, 1])
    return accuracy_within(distances, thresholds_km), distances
