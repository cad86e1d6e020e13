"""Engines: the workflows the launcher runs by name (``engine_name=train`` ...).

An engine is a function ``engine(cfg, dist_run_id, checkpoint_path, checkpoint_folder,
hook_generator)`` registered with ``@register_engine(name)``; it runs in every process.
"""
from ssl_engine.utils.registry import Registry

ENGINE_REGISTRY = Registry("engine")


def register_engine(name: str, check_before_launch=None):
    """Register an engine; ``check_before_launch(cfg)``, if given, runs in the launcher before
    any process starts and raises for what it refuses (missing data, unwritable folders)."""

    def decorator(engine):
        engine.check_before_launch = check_before_launch
        return ENGINE_REGISTRY.register(name)(engine)

    return decorator


def get_engine(name: str):
    return ENGINE_REGISTRY.get(name)


from ssl_engine.engines import train  # noqa: E402,F401  (registers)
from ssl_engine.engines import extract_features  # noqa: E402,F401  (registers)
