"""The registry of engines (``engine_name=...`` on the command line)."""
from ssl_engine.utils.registry import Registry

ENGINE_REGISTRY = Registry("engine")


def register_engine(name: str, check_before_launch=None, stops_on_signal: bool = False):
    """Register an engine; ``check_before_launch(cfg)``, if given, runs in the launcher before
    any process starts and raises for what it refuses (missing data, unwritable folders).
    ``stops_on_signal``: the engine ends cleanly on SIGTERM / SIGINT by itself
    (``ssl_engine.utils.stop_request``); other engines end as the signal's default action does."""

    def decorator(engine):
        engine.check_before_launch = check_before_launch
        engine.stops_on_signal = stops_on_signal
        return ENGINE_REGISTRY.register(name)(engine)

    return decorator


def get_engine(name: str):
    return ENGINE_REGISTRY.get(name)
