"""The error raised for a bad config, before any process starts.

It lives in utils so that every layer (data sources, models, the trainer) can refuse a setting
with it; ``ssl_engine.config`` exports it as well.
"""


class ConfigError(ValueError):
    """A config key is unknown, has the wrong type, or settings contradict each other."""
