"""Hooks by name: a user's hook registered here is turned on by listing its name in
``HOOKS.EXTRA_HOOKS``, with no hook generator to pass in code."""
from ssl_engine.utils.registry import Registry

HOOK_REGISTRY = Registry("hook")


def register_hook(name: str):
    """Class decorator: ``cls(cfg)`` (an ``SSLHook``, given the whole config) becomes the hook
    ``name`` of ``HOOKS.EXTRA_HOOKS``."""
    return HOOK_REGISTRY.register(name)
