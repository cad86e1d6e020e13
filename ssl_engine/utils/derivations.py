"""Settings that the components named in a config derive from the rest of it, before launch.

Each package of components registers a derivation for the kind it holds when it is imported
(the losses for ``LOSS.name``, the trunks for ``MODEL.TRUNK.NAME``: each looks the named
component up in its own registry and lets it fill its settings; the ViT's masking settings,
a section every config has).  The config's own
derivations (``derive_settings``, config/derive.py) run them, so the config layer names no
component and a new one touches its own files only.
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


def run_config_derivations(cfg) -> None:
    """Run every registered derivation on ``cfg``, in the order they were registered."""
    for derive in list(_DERIVATIONS.values()):
        derive(cfg)
