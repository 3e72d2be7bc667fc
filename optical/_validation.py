"""Checks shared by the public entry points: clear errors, nothing coerced."""

from __future__ import annotations

import json
import numbers
from typing import Any

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

#: Elements per step of the finiteness check of a large contiguous array.
_FINITE_CHUNK = 1 << 20


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice (``json.loads`` keeps the last)."""


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(f"key {key!r} appears twice in one object (JSON would "
                                    "keep the last and drop the first without a word)")
        out[key] = value
    return out


def parse_json(text: str | bytes, *, unique_keys: bool = False, **kwargs: Any) -> Any:
    """``json.loads(text, **kwargs)``, with text nested too deeply for the
    parser (a RecursionError) or an integer too long to read (a plain
    ValueError) raised as the JSONDecodeError it is. ``unique_keys``: an
    object naming a key twice raises :class:`DuplicateKeyError` (a file
    this library reads as settings, where the first of two would be lost)."""
    if unique_keys:
        kwargs["object_pairs_hook"] = _unique_object
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply", "", 0) from None
    except (json.JSONDecodeError, DuplicateKeyError):
        raise
    except ValueError as err:  # an integer literal longer than int() reads (4300 digits)
        raise json.JSONDecodeError(str(err), "", 0) from None


def all_finite(a: np.ndarray) -> bool:
    """``np.isfinite(a).all()`` without an array of ``a``'s size: a large
    contiguous array is checked a chunk at a time into one small mask (a
    whole-size mask of a weight matrix is fresh memory, whose pages cost
    more to map than the check costs; see :mod:`optical._memory`)."""
    if a.size <= 4 * _FINITE_CHUNK or not (a.flags.c_contiguous or a.flags.f_contiguous):
        return bool(np.isfinite(a).all())
    flat = a.ravel(order="K")  # a view: contiguous either way
    mask = np.empty(_FINITE_CHUNK, dtype=bool)
    for start in range(0, flat.size, _FINITE_CHUNK):
        part = flat[start:start + _FINITE_CHUNK]
        if not np.isfinite(part, out=mask[:part.size]).all():
            return False
    return True


def check_float_dtype(dtype: object, name: str) -> None:
    """TypeError naming ``name`` unless ``dtype`` (numpy's, or a JAX array's)
    is float32 or float64 in native byte order: nothing is cast silently."""
    dtype = np.dtype(dtype)
    if dtype not in FLOAT_DTYPES and dtype.newbyteorder("=") in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype {dtype.str} has the non-native byte order; "
                        f"convert it with {name}.astype({dtype.newbyteorder('=').name})")
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: dtype {dtype} is not supported; use float32 or float64 "
                        "(nothing is cast silently)")


def check_plain_array(a: np.ndarray, name: str) -> np.ndarray:
    """Return ``a``, a numpy array, unless it is a subclass other than
    ``numpy.memmap`` (TypeError naming ``name``): a masked array's mask, a
    matrix's 2-D semantics or a quantity's units would be dropped or misread
    by ``numpy.asarray``."""
    if type(a) is not np.ndarray and not isinstance(a, np.memmap):
        hint = " (its .filled(value))" if isinstance(a, np.ma.MaskedArray) else ""
        # numpy.ma.MaskedArray by its public name (numpy 1.x: numpy.ma.core)
        kind = ("numpy.ma.MaskedArray" if type(a) is np.ma.MaskedArray
                else f"{type(a).__module__}.{type(a).__name__}")
        raise TypeError(f"{name}: {kind}, a numpy.ndarray "
                        f"subclass, is not supported; pass a plain numpy.ndarray{hint}")
    return a


def as_plain_array(value: object, name: str) -> np.ndarray:
    """``numpy.asarray(value)`` for lists, scalars and JAX arrays alike, but an
    ndarray subclass is refused (:func:`check_plain_array`) rather than
    stripped of its mask or units."""
    if isinstance(value, np.ndarray):
        check_plain_array(value, name)
        return np.asarray(value)
    try:
        return np.asarray(value)
    except ValueError as err:  # a ragged list: numpy names no argument
        raise ValueError(f"{name}: not an array ({err})") from None


def check_float_array(a: object, name: str, *, ndim: int | None = None,
                      min_ndim: int = 0) -> np.ndarray:
    """Return ``a`` if it is a finite float32/float64 numpy array, else raise.

    Raises
    ------
    TypeError
        Not a numpy array; a subclass other than ``numpy.memmap`` (a masked
        array's mask, a matrix's 2-D semantics or a quantity's units would
        be dropped or misread); an integer, complex, bool, half or object
        dtype; a non-native byte order.
    ValueError
        Wrong number of dimensions, or NaN / inf entries.
    """
    if not isinstance(a, np.ndarray):
        hint = (f" (numpy.asarray({name}) makes one of a concrete JAX array)"
                if type(a).__module__.split(".")[0] in ("jax", "jaxlib") else "")
        raise TypeError(f"{name}: expected a numpy.ndarray of float32 or float64, got "
                        f"{type(a).__name__}{hint}")
    check_plain_array(a, name)
    check_float_dtype(a.dtype, name)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    if a.ndim < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dimension(s), got shape {a.shape}")
    if not all_finite(a):
        bad = int(np.size(a) - np.count_nonzero(np.isfinite(a)))
        raise ValueError(f"{name}: contains {bad} NaN or infinite value(s)")
    return a


def read_only(a: Any) -> Any:
    """``a`` made read-only, for objects whose arrays the fast backends find
    again by identity: an owning array in place; a view copied first where
    the values could still change under it: a writeable view, or a read-only
    one of a writeable array (``np.broadcast_to`` gives one) or of a buffer
    that is not an array (a memmap's file); anything else as it is."""
    if not isinstance(a, np.ndarray):
        return a
    if a.flags.writeable or _changeable_base(a):
        if a.base is not None:
            a = a.copy()
        a.flags.writeable = False
    return a


def _changeable_base(a: np.ndarray) -> bool:
    base = a.base
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return True
        base = base.base
    if isinstance(base, memoryview) and base.readonly:  # (pickle 5's out-of-band
        base = base.obj                                   # frames: Dask's transfers)
    return base is not None and not isinstance(base, bytes)


def check_bool(value: object, name: str) -> bool:
    """``value`` as a ``bool`` if it is one (Python's or numpy's), else raise
    TypeError: a flag given as 1 or "yes" is refused, not read as truthy."""
    if not isinstance(value, bool | np.bool_):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")
    return bool(value)


def check_positive_int(value: object, name: str) -> int:
    """``value`` as an ``int`` if it is a positive integer (Python's or numpy's;
    not a bool), else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: {value!r} must be a positive integer")
    return int(value)


def check_nonnegative_int(value: object, name: str) -> int:
    """``value`` as an ``int`` if it is a non-negative integer (Python's or
    numpy's; not a bool), else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name}: {value!r} must be a non-negative integer")
    return int(value)


def is_jax_value(value: object) -> bool:
    """Whether ``value`` is a JAX array or tracer (without importing JAX)."""
    return any(c.__module__.split(".")[0] in ("jax", "jaxlib") for c in type(value).__mro__)


def check_seed(seed: object, name: str = "seed") -> int:
    """A seed is a non-negative integer below 2**64 (errors name it ``name``)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{name}: expected a non-negative integer, got {type(seed).__name__}")
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"{name}: {seed} is out of range; valid: integer in [0, 2**64)")
    return seed


def check_operands(x_shape: tuple[int, ...], x_dtype: object, k: int,
                   w_dtype: object | None = None) -> None:
    """``x`` (..., K) against weights of ``k`` rows (and ``w_dtype``, if
    given): ValueError for another K, TypeError for another dtype (nothing
    is cast silently)."""
    if x_shape[-1] != k:
        raise ValueError(f"shape mismatch: x has {x_shape[-1]} features (last axis of "
                         f"{tuple(x_shape)}) but w has {k} rows")
    if w_dtype is not None and np.dtype(x_dtype) != np.dtype(w_dtype):
        raise TypeError(f"dtype mismatch: x is {np.dtype(x_dtype)} but w is "
                        f"{np.dtype(w_dtype)}; cast one explicitly")


def missing_or_broken(module: str, err: ImportError, need: str, extra: str) -> str:
    """What to say when importing ``module`` failed with ``err``: that it is
    not installed (and the extra that installs it), or, where it is but
    failed to import (a wheel built against another numpy), why: the advice
    to install it would change nothing then."""
    top = module.split(".")[0]
    if isinstance(err, ModuleNotFoundError) and (err.name or "").split(".")[0] == top:
        return f"{need}, which is not installed: pip install 'optical[{extra}]'"
    return (f"{need}, which is installed but failed to import ({type(err).__name__}: "
            f"{err}); reinstall it for this environment (a wheel built for another "
            "numpy?)")
