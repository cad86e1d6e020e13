"""Meters (classy_vision ClassyMeters registered with ``register_meter``) and ``build_meters``."""
import warnings
from typing import List

from ssl_engine.meters.accuracy_list_meter import AccuracyListMeter
from ssl_engine.utils.registry import lookup

with warnings.catch_warnings():  # classy_vision imports deprecated torchvision modules
    warnings.simplefilter("ignore")
    from classy_vision.meters import METER_REGISTRY, ClassyMeter


def build_meters(meters_cfg) -> List[ClassyMeter]:
    """One meter per name in ``meters_cfg.names``, configured by ``meters_cfg[name]``."""
    meters = []
    for name in meters_cfg.get("names", []):
        meter_cls = lookup(METER_REGISTRY, name, "meter")
        meters.append(meter_cls.from_config(meters_cfg.get(name) or {}))
    return meters


__all__ = ["AccuracyListMeter", "build_meters"]
