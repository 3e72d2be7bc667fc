"""How a config field knows its kind and valid range: the field builders, the
check of one value against its spec, the parse of command-line text, and the
base class of :mod:`optical.config`'s sections.

A field's spec lives in its ``dataclasses.field`` metadata (``kind`` of
``"real"``, ``"int"``, ``"choice"`` or ``"bool"``, with its bounds or choices),
so one place knows every field's range: the sections' ``__post_init__``,
:meth:`optical.config.OpticalConfig.replace`, ``--set`` and sweeps' ``--param``
all check values through :func:`check`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import math
import numbers
import sys
import textwrap
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np


def real(default, lo=-math.inf, hi=math.inf, *, lo_open=False, hi_open=False, optional=False):
    """A real-valued field, valid in [lo, hi] (ends open where asked)."""
    spec = {"kind": "real", "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open,
            "optional": optional}
    return dataclasses.field(default=default, metadata=spec)


def integer(default, lo, hi, *, optional=False):
    """An integer field, valid in [lo, hi]; ``None`` allowed where optional."""
    return dataclasses.field(default=default, metadata={"kind": "int", "lo": lo, "hi": hi,
                                                        "optional": optional})


def choice(default, choices):
    """A field holding one of ``choices``."""
    return dataclasses.field(default=default, metadata={"kind": "choice", "choices": choices})


def boolean(default):
    """A true/false field (numpy's bools accepted, stored as Python's)."""
    return dataclasses.field(default=default, metadata={"kind": "bool"})


@functools.cache
def field_units(section: type) -> dict[str, str]:
    """Field name -> unit, from the numpydoc lines ``name[, name] : type, unit``
    of a section's docstring (a type without a comma has no unit)."""
    units = {}
    for line in _docstring(section).splitlines():
        names, sep, kind = line.partition(" : ")
        if not sep or line.startswith(" ") or "," not in kind or kind.startswith("{"):
            continue
        for name in names.split(","):
            units[name.strip()] = kind.split(",", 1)[1].strip()
    return units


def _docstring(section: type) -> str:
    """A section's docstring, read from its source where ``python -OO``
    stripped it (units live there: without them errors, tables and plot
    labels would silently lose their units). An install without sources
    under -OO has none to read: its units are blank."""
    if sys.flags.optimize < 2:
        return inspect.getdoc(section) or ""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(section)))
    except (OSError, TypeError):  # no source shipped
        return ""
    return inspect.cleandoc(ast.get_docstring(tree.body[0]) or "")


def describe(spec: Mapping[str, Any], unit: str = "") -> str:
    """Human-readable valid range of a field, for error messages, in ``unit``
    (the field's unit, from :func:`field_units`) where it has one."""
    kind = spec["kind"]
    if kind == "choice":
        return "one of " + ", ".join(repr(c) for c in spec["choices"])
    if kind == "bool":
        return "true or false"
    left = "(" if spec.get("lo_open") else "["
    right = ")" if spec.get("hi_open") else "]"
    text = f"{'integer' if kind == 'int' else 'number'} in {left}{spec['lo']}, {spec['hi']}{right}"
    if unit and unit != "dimensionless":
        text += f" {unit}"
    return text + (" or None" if spec.get("optional") else "")


def check(path: str, value: Any, spec: Mapping[str, Any], unit: str = "") -> Any:
    """Validate one field value against its spec; return it in canonical form.
    ``unit`` (the field's, if any) is named in the valid range of an error."""
    kind = spec["kind"]
    valid = describe(spec, unit)
    if kind == "choice":
        # Strings only: an array's `in` is ambiguous (numpy's str_ is a str).
        if not isinstance(value, str) or value not in spec["choices"]:
            raise ValueError(f"{path}: {value!r} is not valid; valid: {valid}")
        return str(value)
    if kind == "bool":  # numpy's bools too, canonicalised
        if isinstance(value, str):  # JSON's "true": a string, not a boolean
            raise ValueError(f"{path}: {value!r} is text, not a boolean; valid: true or false "
                             "(unquoted in JSON; True or False in Python)")
        if not isinstance(value, bool | np.bool_):
            raise ValueError(f"{path}: {value!r} is not valid; valid: {valid}")
        return bool(value)
    if value is None:
        if spec.get("optional"):
            return None
        raise ValueError(f"{path}: None is not valid; valid: {valid}")
    if isinstance(value, bool | np.bool_):
        raise ValueError(f"{path}: {value!r} is not valid; valid: {valid}")
    if type(value).__name__.endswith("Tracer"):  # jax.vmap / jit over a config value
        raise ValueError(f"{path}: a traced value cannot be a config field; pass traced "
                         "noise levels to optical.kernels.jax_backend.matmul as params "
                         "(the fields its PARAMS lists)")
    # numpy scalars (a sweep's np.arange, say) are accepted and made Python numbers.
    if kind == "int":
        if not isinstance(value, numbers.Integral):
            raise ValueError(f"{path}: {value!r} is not an integer; valid: {valid}")
        value = int(value)
        if not spec["lo"] <= value <= spec["hi"]:
            raise ValueError(f"{path}: {value} is out of range; valid: {valid}")
        return value
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{path}: {value!r} is not a number; valid: {valid}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float's range (10**400)
        raise ValueError(f"{path}: an integer of {len(str(abs(value)))} digits is out of "
                         f"range; valid: {valid}") from None
    if math.isinf(number) and isinstance(value, np.floating) and np.isfinite(value):
        # A finite long double beyond float64 (1e4000) is not inf: no photon
        # count or noise figure is turned off by rounding.
        raise ValueError(f"{path}: {value!r} is beyond float64's range; valid: {valid}")
    lo, hi = spec["lo"], spec["hi"]
    too_low = number <= lo if spec["lo_open"] else number < lo
    too_high = number >= hi if spec["hi_open"] else number > hi
    if math.isnan(number) or too_low or too_high:
        raise ValueError(f"{path}: {number} is out of range; valid: {valid}")
    return number + 0.0  # -0.0 is 0.0: one config, one JSON, one run id



def parse(path: str, text: str, spec: Mapping[str, Any], unit: str = "") -> Any:
    """Parse command-line ``text`` into a valid value of the field whose spec
    is ``spec`` (``path`` names it, and ``unit`` its unit, in errors)."""
    kind = spec["kind"]
    raw = text.strip()
    if raw.lower() == "none" and spec.get("optional"):
        return None
    try:
        if kind == "int":
            value: Any = int(raw)
        elif kind == "real":
            value = float(raw)
            if math.isinf(value) and "inf" not in raw.lower():
                raise ValueError(f"{path}: {text!r} overflows a float (write inf for "
                                 "infinity)")
            if value == 0 and any(c in "123456789" for c in raw.lower().partition("e")[0]):
                raise ValueError(f"{path}: {text!r} underflows to 0")
        elif kind == "bool":
            lowered = raw.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            value = lowered in ("true", "1", "yes")
        else:
            value = raw
    except ValueError as err:
        if str(err).startswith(f"{path}: "):
            raise
        raise ValueError(f"{path}: cannot parse {text!r}; valid: "
                         f"{describe(spec, unit)}") from None
    return check(path, value, spec, unit)


class Section:
    """Base of the config sections: validation from field metadata, dict I/O."""

    _name: ClassVar[str] = ""

    def __post_init__(self) -> None:
        units = field_units(type(self))
        for f in dataclasses.fields(self):
            value = check(f"{self._name}.{f.name}", getattr(self, f.name), f.metadata,
                          units.get(f.name, ""))
            object.__setattr__(self, f.name, value)
        self._check_consistency()

    def _check_consistency(self) -> None:
        """Cross-field rules; sections override."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

