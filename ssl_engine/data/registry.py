"""The three name tables of the data package: data sources, transforms and collators."""
from ssl_engine.utils.registry import Registry

DATASOURCE_REGISTRY = Registry("data source")
TRANSFORM_REGISTRY = Registry("transform")
COLLATOR_REGISTRY = Registry("collator")


def register_datasource(name: str):
    """Class decorator: ``cls(cfg, split, path, source_index)`` becomes the source ``name``.

    The class says whether it reads a path (``needs_path``) and may refuse one before launch
    with a static ``check_path(cfg, split, path, source_index)`` that raises ValueError
    (disk_folder refuses a folder without images)."""
    return DATASOURCE_REGISTRY.register(name)


def register_transform(name: str):
    """Class decorator: ``cls(**params)`` becomes the transform ``{name: <name>, ...params}``."""
    return TRANSFORM_REGISTRY.register(name)


def register_collator(name: str):
    """Function decorator: ``fn(samples, **params) -> batch`` becomes COLLATE_FUNCTION ``name``."""
    return COLLATOR_REGISTRY.register(name)
