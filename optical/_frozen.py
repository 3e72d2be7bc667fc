"""A read-only dict for the fields of frozen dataclasses.

``dataclasses.dataclass(frozen=True)`` stops a field being rebound, not a
dict it holds being changed in place: a report's ``components["laser"] += 1``
moved its ``total``, and a spec's ``raw`` changed the layers built from it.
:class:`FrozenMapping` is a ``dict`` (so ``json.dumps``, ``|``, pandas and
``dict(...)`` take it as one) that refuses every change: nested dicts are
frozen too and lists held as tuples, numpy arrays as read-only views (also
after pickling or copying, which come back through its constructor). It
hashes by its keys, so equal mappings hash alike. A layer's weights are
held as one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np

__all__ = ["FrozenMapping", "frozen", "read_only_view"]


def _freeze(value: Any) -> Any:
    if isinstance(value, FrozenMapping):
        return value
    if isinstance(value, Mapping):
        return FrozenMapping(value)
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return read_only_view(value)


def read_only_view(value: Any) -> Any:
    """A writeable numpy array as a read-only view (the caller's array keeps
    its flags; nothing is copied); anything else as it is."""
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


class FrozenMapping(dict):
    """A read-only dict (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for key, value in dict(*args, **kwargs).items():
            dict.__setitem__(self, key, _freeze(value))

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__} is read-only: build a new mapping "
                        "(dataclasses.replace for a record's field)")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self))

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (type(self), (dict(self),))

    def __copy__(self) -> FrozenMapping:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenMapping:
        return self  # nothing in it can change

    def __repr__(self) -> str:
        return f"FrozenMapping({dict.__repr__(self)})"


def frozen(instance: object, *names: str) -> None:
    """In a frozen dataclass's ``__post_init__``: make each of the fields
    ``names`` that holds a mapping (not None) a :class:`FrozenMapping`."""
    for name in names:
        value = getattr(instance, name)
        if isinstance(value, Mapping) and not isinstance(value, FrozenMapping):
            object.__setattr__(instance, name, FrozenMapping(value))
