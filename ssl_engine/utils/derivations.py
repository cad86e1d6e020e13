"""Settings that the components named in a config derive from the rest of it, before launch.

Each package of components registers a derivation for the kind it holds when it is imported
(the losses for ``LOSS.name``, the trunks for ``MODEL.TRUNK.NAME``: each looks the named
component up in its own registry and lets it fill its settings; the ViT's masking settings,
a section every config has).  The config's own
derivations (``derive_settings``, config/derive.py) run them, so the config layer names no
component and a new one touches its own files only.

The same imports declare the components' own key rules (utils/key_rules.py), which validation
reads.  A config composed before the losses and the trunks are imported would silently miss
both: ``require_components`` refuses that instead.
"""
from typing import Any, Callable, Dict, List

Derivation = Callable[[Any], None]

_DERIVATIONS: Dict[str, Derivation] = {}


def register_config_derivation(kind: str, derive: Derivation) -> Derivation:
    """Register ``derive(cfg)``: it fills in place the settings that the component of ``kind``
    named by ``cfg`` derives (e.g. ``kind="loss"``: the loss ``cfg.LOSS.name``).  One per kind:
    registering a kind again replaces its derivation.  Returns ``derive``."""
    _DERIVATIONS[kind] = derive
    return derive


def registered_kinds() -> List[str]:
    """The kinds that have a derivation, in the order they run."""
    return list(_DERIVATIONS)


# the kinds every config names (a loss, a trunk), registered by ssl_engine.losses and
# ssl_engine.models when they are imported
REQUIRED_KINDS = ("loss", "trunk")


def require_components() -> None:
    """Raise a RuntimeError naming the packages to import when the losses or the trunks have
    not registered their derivations yet."""
    missing = [kind for kind in REQUIRED_KINDS if kind not in _DERIVATIONS]
    if missing:
        raise RuntimeError(
            f"no {' and no '.join(missing)} is registered yet: import ssl_engine.losses and "
            "ssl_engine.models before composing a config, so their settings and key rules "
            "count (ssl_engine.engines.prelaunch.load_checked_config does)")


def run_config_derivations(cfg) -> None:
    """Run every registered derivation on ``cfg``, in the order they were registered."""
    require_components()
    for derive in list(_DERIVATIONS.values()):
        derive(cfg)
