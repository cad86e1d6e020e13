"""The registry of engines (``engine_name=...`` on the command line)."""
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
