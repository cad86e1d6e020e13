"""Datasets, SSL transforms, collators, the resumable distributed sampler and loader building."""
from ssl_engine.data import collators, datasources, transforms  # noqa: F401  (registers components)
from ssl_engine.data.collators import build_collator
from ssl_engine.data.device_augmentation import batch_to_device
from ssl_engine.data.loader import build_dataloader
from ssl_engine.data.paths import check_data_paths
from ssl_engine.data.registry import (
    COLLATOR_REGISTRY,
    DATASOURCE_REGISTRY,
    TRANSFORM_REGISTRY,
    register_collator,
    register_datasource,
    register_transform,
)
from ssl_engine.data.sampler import StatefulDistributedSampler
from ssl_engine.data.ssl_dataset import GenericSSLDataset, build_dataset
from ssl_engine.data.transforms import build_transforms

__all__ = [
    "COLLATOR_REGISTRY",
    "DATASOURCE_REGISTRY",
    "TRANSFORM_REGISTRY",
    "GenericSSLDataset",
    "StatefulDistributedSampler",
    "batch_to_device",
    "build_collator",
    "build_dataloader",
    "build_dataset",
    "build_transforms",
    "check_data_paths",
    "register_collator",
    "register_datasource",
    "register_transform",
]
