"""The user's own components: modules named in ``$SSL_ENGINE_PLUGINS``."""
import importlib
import os

from ssl_engine.config import ConfigError


def import_plugins() -> None:
    """Import the modules named in ``$SSL_ENGINE_PLUGINS`` (comma-separated), so that the
    components they register (train steps, losses, hooks ...) exist in this process."""
    for name in filter(None, (n.strip() for n in os.environ.get("SSL_ENGINE_PLUGINS", "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ConfigError(f"SSL_ENGINE_PLUGINS names module '{name}', which cannot be "
                              f"imported: {err}") from None
