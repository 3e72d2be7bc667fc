"""A read-only mapping for the fields of frozen dataclasses.

``dataclasses.dataclass(frozen=True)`` stops a field being rebound, not a
dict it holds being changed in place: a report's ``components["laser"] += 1``
moved its ``total``, and a spec's ``raw`` changed the layers built from it.
:class:`FrozenMapping` refuses item assignment, hands out a nested dict or
list as a copy, hashes as its canonical JSON and pickles as a dict. A
layer's weights are held as one of read-only array views
(:func:`read_only_arrays`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["FrozenMapping", "frozen", "read_only_arrays"]


class FrozenMapping(Mapping[str, Any]):
    """A read-only copy of a mapping (see the module docstring)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        # Nested containers copied; other values (arrays, frozen records) kept.
        self._data = {k: copy.deepcopy(v) if isinstance(v, dict | list) else v
                      for k, v in data.items()}

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return copy.deepcopy(value) if isinstance(value, dict | list) else value

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(json.dumps(self._data, sort_keys=True, default=repr))

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (type(self), (self._data,))

    def __repr__(self) -> str:
        return f"FrozenMapping({self._data!r})"


def read_only_arrays(arrays: Mapping[str, Any]) -> FrozenMapping:
    """A :class:`FrozenMapping` of read-only views of ``arrays``' numpy arrays
    (the caller's own arrays keep their flags; nothing is copied)."""
    out = {}
    for name, value in arrays.items():
        if isinstance(value, np.ndarray):
            value = value.view()
            value.flags.writeable = False
        out[name] = value
    return FrozenMapping(out)


def frozen(instance: object, *names: str) -> None:
    """In a frozen dataclass's ``__post_init__``: make each of the fields
    ``names`` that holds a mapping (not None) a :class:`FrozenMapping`."""
    for name in names:
        value = getattr(instance, name)
        if isinstance(value, Mapping) and not isinstance(value, FrozenMapping):
            object.__setattr__(instance, name, FrozenMapping(value))
