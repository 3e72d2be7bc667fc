"""A read-only mapping for the fields of frozen dataclasses.

``dataclasses.dataclass(frozen=True)`` stops a field being rebound, not a
dict it holds being changed in place: a report's ``components["laser"] += 1``
moved its ``total``, and a spec's ``raw`` changed the layers built from it.
:class:`FrozenMapping` refuses item assignment, hands out a nested dict or
list as a copy, holds numpy arrays as read-only views, hashes by its keys
(equal mappings hash alike) and pickles as a dict. A layer's weights are
held as one (:func:`read_only_arrays`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["FrozenMapping", "frozen", "read_only_arrays"]


class FrozenMapping(Mapping[str, Any]):
    """A read-only copy of a mapping (see the module docstring)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        # Nested containers copied, arrays held as read-only views (also after
        # pickling or copying, which come back through here); other values
        # (frozen records) kept.
        self._data = {k: copy.deepcopy(v) if isinstance(v, dict | list) else _read_only(v)
                      for k, v in data.items()}

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return copy.deepcopy(value) if isinstance(value, dict | list) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        # The keys alone: equal mappings have equal keys (10000 == 10000.0 but
        # their JSON differs, so a hash of the JSON broke hash-equals-eq).
        return hash(frozenset(self._data))

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (type(self), (self._data,))

    def __repr__(self) -> str:
        return f"FrozenMapping({self._data!r})"


def _read_only(value: Any) -> Any:
    """A numpy array as a read-only view (the caller's keeps its flags)."""
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def read_only_arrays(arrays: Mapping[str, Any]) -> FrozenMapping:
    """A :class:`FrozenMapping` of ``arrays``, its numpy arrays read-only views
    (the caller's own arrays keep their flags; nothing is copied)."""
    return FrozenMapping(arrays)


def frozen(instance: object, *names: str) -> None:
    """In a frozen dataclass's ``__post_init__``: make each of the fields
    ``names`` that holds a mapping (not None) a :class:`FrozenMapping`."""
    for name in names:
        value = getattr(instance, name)
        if isinstance(value, Mapping) and not isinstance(value, FrozenMapping):
            object.__setattr__(instance, name, FrozenMapping(value))
