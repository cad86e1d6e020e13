"""The error raised for a bad config, before any process starts."""


class ConfigError(ValueError):
    """A config key is unknown, has the wrong type, or settings contradict each other."""
