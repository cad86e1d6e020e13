"""One registry helper for every named component that classy_vision does not register itself.

A registry maps a name (the string a config uses) to a class or function.  Look-ups of an
unknown name fail with the list of known names and, for a likely typo, the closest one.
"""
import difflib
from typing import Callable, Dict, Iterable, Mapping, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised when a config names a component that no registry knows."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


def closest_name(name: str, candidates: Iterable[str]) -> str:
    """The candidate most similar to ``name`` or "" when none is close enough."""
    matches = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.6)
    return matches[0] if matches else ""


def lookup(mapping: Mapping[str, T], name: str, kind: str) -> T:
    """``mapping[name]`` with an error naming the kind, the known names and the closest one."""
    if name in mapping:
        return mapping[name]
    known = sorted(mapping)
    message = f"unknown {kind} '{name}'"
    suggestion = closest_name(name, known)
    if suggestion:
        message += f": did you mean '{suggestion}'?"
    message += f" Known {kind} names: {', '.join(known) or '(none)'}"
    raise UnknownNameError(message)


class Registry:
    """A name -> object table filled by a ``register`` decorator."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: Dict[str, object] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str):
        return lookup(self._entries, name, self.kind)

    def names(self):
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self._entries
