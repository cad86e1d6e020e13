"""Meters (classy_vision ClassyMeters registered with ``register_meter``) and ``build_meters``."""
from typing import List

from ssl_engine.meters.mean_ap_list_meter import MeanAPListMeter
from ssl_engine.meters.topk_list_meter import (
    AccuracyListMeter,
    PrecisionAtKListMeter,
    RecallAtKListMeter,
)
from ssl_engine.utils.classy import METER_REGISTRY, ClassyMeter
from ssl_engine.utils.registry import lookup


def build_meters(meters_cfg) -> List[ClassyMeter]:
    """One meter per name in ``meters_cfg.names`` (and the older single ``meters_cfg.name``),
    configured by ``meters_cfg[name]``; an empty name means no meter."""
    meters = []
    names = list(meters_cfg.get("names", []))
    if meters_cfg.get("name") and meters_cfg.get("name") not in names:  # VISSL's older key
        names.insert(0, meters_cfg.get("name"))
    for name in names:
        if not name:
            continue
        meter_cls = lookup(METER_REGISTRY, name, "meter")
        meters.append(meter_cls.from_config(meters_cfg.get(name) or {}))
    return meters


__all__ = ["AccuracyListMeter", "MeanAPListMeter", "PrecisionAtKListMeter",
           "RecallAtKListMeter", "build_meters"]
