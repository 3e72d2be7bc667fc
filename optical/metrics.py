"""Accuracy of a test result against a reference (reference first, test second).

All metrics are computed in float64 over every element of the arrays, the
pair metrics after an exact scaling of both arrays by one power of two (at
or above the largest magnitude of either), so that arrays of any magnitude,
1e-300 or 1e300, square without underflow or overflow. What lies far below
that largest magnitude is the limit: from ~1e-155 of it, squares turn
subnormal and lose digits, and from ~1e-162 they are 0. An array that
small beside the other reads as zero (a test result 1e170 times its
reference has a cosine of 0, not 1), and an element or difference that
small is lost (``compare([1, 1e-200], [1, 0])`` reads as exact).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np

from optical._frozen import read_only_view
from optical._validation import all_finite, as_plain_array

__all__ = ["ColumnErrors", "column_errors", "compare", "cosine", "kl_divergence",
           "max_abs_error", "relative_error", "sqnr_db"]


#: Elements per step of the float64 sums: no float64 copy of a whole array
#: (fresh pages, which cost more than the sums; see optical._memory).
SUM_CHUNK = 1 << 16


#: ml_dtypes' narrow floats (bfloat16, the float8s, ...: numpy dtype kind "V"),
#: which float32 holds exactly; JAX arrays in bfloat16 come to numpy as these.
_NARROW_FLOATS = ("bfloat16", "float8_", "float6_", "float4_")


def _real(name: str, value: object, dtype: type | None = None) -> np.ndarray:
    """``value`` as an array of real numbers (bool, integer or float; Python
    objects converted to float64; ml_dtypes' bfloat16 and float8s to float32,
    exactly); TypeError naming ``name`` for anything else (complex values,
    strings, a masked array's mask): nothing is dropped or parsed silently."""
    arr = as_plain_array(value, name)
    if arr.dtype.kind == "V" and arr.dtype.name.startswith(_NARROW_FLOATS):
        arr = arr.astype(np.float32)
    if arr.dtype.kind == "O":
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise TypeError(f"{name}: expected real numbers, got objects ({err})") from None
    if arr.dtype.kind not in "biuf":
        raise TypeError(f"{name}: dtype {arr.dtype} is not supported; expected real numbers "
                        "(bool, integer or float)")
    return arr if dtype is None else arr.astype(dtype, copy=False)


def _checked(reference: object, test: object) -> tuple[np.ndarray, np.ndarray]:
    """Both as flat numeric arrays of one shape, finite and not empty, in
    their own dtypes (real integers or floats; Python objects as float64)."""
    ref, out = _real("reference", reference), _real("test", test)
    if ref.shape != out.shape:
        raise ValueError(f"shape mismatch: reference {ref.shape} vs test {out.shape}")
    if ref.size == 0:
        raise ValueError("metrics of empty arrays are undefined")
    for name, arr in (("reference", ref), ("test", out)):
        if not all_finite(arr):
            raise ValueError(f"{name} contains NaN or infinite values")
    return ref.ravel(), out.ravel()


def _pair(reference: object, test: object) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_checked`, as float64."""
    ref, out = _checked(reference, test)
    return ref.astype(np.float64, copy=False), out.astype(np.float64, copy=False)


def sqnr_db(reference: object, test: object) -> float:
    """Signal-to-quantisation-noise ratio, dB: ``10 log10(sum ref^2 / sum (ref - test)^2)``.

    ``inf`` when the arrays are equal; ``-inf`` when the reference is zero and
    the test is not.
    """
    return _Sums.of(*_checked(reference, test)).sqnr_db()


def cosine(reference: object, test: object) -> float:
    """Cosine similarity of the flattened arrays (1 for equal directions)."""
    return _Sums.of(*_checked(reference, test)).cosine()


def relative_error(reference: object, test: object) -> float:
    """``||ref - test|| / ||ref||`` (Frobenius); ``inf`` if the reference is zero
    and the test is not."""
    return _Sums.of(*_checked(reference, test)).relative_error()


def compare(reference: object, test: object) -> tuple[float, float, float]:
    """``(sqnr_db, cosine, relative_error)`` of one pair, converted to float64
    and checked once (the same values as the three functions)."""
    sums = _Sums.of(*_checked(reference, test))
    return sums.sqnr_db(), sums.cosine(), sums.relative_error()


def _exponent(*arrays: np.ndarray) -> int:
    """``e`` with ``2**e`` at or above the largest magnitude in ``arrays`` (0
    if all are zero): ``np.ldexp(a, -e)`` is exact and brings every value into
    [-1, 1] (not ``a * 2.0**-e``: that factor overflows for subnormal arrays)."""
    top = max(max(float(np.max(a)), -float(np.min(a))) for a in arrays)
    return 0 if top == 0 else math.frexp(top)[1]


@dataclasses.dataclass(frozen=True)
class _Sums:
    """The float64 sums every pair metric is made of."""

    signal: float  # sum ref^2
    error: float  # sum (ref - test)^2
    test: float  # sum test^2
    cross: float  # sum ref * test

    @classmethod
    def of(cls, ref: np.ndarray, out: np.ndarray) -> _Sums:
        """The sums of two flat arrays, in float64, :data:`SUM_CHUNK` elements
        at a time (each chunk's pairwise sums added in order). Not ``np.dot``:
        OpenBLAS splits a long dot product across its threads, so its last
        bits would depend on the thread count (a sweep's worker processes run
        one BLAS thread, the main process two). Both are first divided by a
        power of two at or above their largest magnitude: exact, so no figure
        moves, but squares of values near 1e-200 no longer underflow nor
        those near 1e200 overflow. (Where one array is ~1e-155 of the other,
        its squares turn subnormal: the relative error and cosine lose
        digits first, 1e-4 of their value at 1e-160, where SQNRs near -3200
        dB move in their eighth digit; from ~1e-162 the smaller array's
        squares are 0: it reads as zero, a cosine of 0, an SQNR of -inf or a
        relative error of inf. See the module docstring.)"""
        shift = -_exponent(ref, out)
        signal = error = test = cross = 0.0
        for start in range(0, ref.size, SUM_CHUNK):
            r = np.ldexp(ref[start:start + SUM_CHUNK].astype(np.float64), shift)
            o = np.ldexp(out[start:start + SUM_CHUNK].astype(np.float64), shift)
            e = r - o
            signal += float(np.add.reduce(r * r))
            error += float(np.add.reduce(e * e))
            test += float(np.add.reduce(o * o))
            cross += float(np.add.reduce(r * o))
        return cls(signal, error, test, cross)

    def sqnr_db(self) -> float:
        if self.error == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.error)

    def cosine(self) -> float:
        norm = math.sqrt(self.signal) * math.sqrt(self.test)
        if norm == 0.0:
            return 1.0 if self.signal == 0.0 and self.test == 0.0 else 0.0
        # Cauchy-Schwarz bounds it by 1; the roundings of the three sums do not.
        return min(max(self.cross / norm, -1.0), 1.0)

    def relative_error(self) -> float:
        if self.error == 0.0:
            return 0.0
        return math.sqrt(self.error) / math.sqrt(self.signal) if self.signal else math.inf


def max_abs_error(reference: object, test: object) -> float:
    """Largest elementwise absolute difference (``inf`` where one exceeds
    float64's largest: finite values near 1e308 of opposite signs)."""
    ref, out = _pair(reference, test)
    with np.errstate(over="ignore"):  # that difference is inf, and is the answer
        return float(np.max(np.abs(ref - out)))


def _log_softmax(logits: np.ndarray, axis: int) -> np.ndarray:
    with np.errstate(over="ignore"):  # a spread past float64's largest: -inf, probability 0
        shifted = logits - np.max(logits, axis=axis, keepdims=True)
    with np.errstate(under="ignore"):  # a probability below float64's least: 0
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def kl_divergence(reference_logits: object, test_logits: object, axis: int = -1) -> float:
    """Mean Kullback-Leibler divergence ``KL(softmax(reference) || softmax(test))``, nats.

    The softmax runs along ``axis``; the divergence is averaged over every
    other position (e.g. over tokens, for logits of shape (tokens, vocab)).
    Computed in float64 from log-softmax (max-shifted), so large logits do
    not overflow; 0 for identical distributions.
    """
    # C order: the softmax sums add in one order whatever the inputs' layout.
    ref = np.ascontiguousarray(_real("reference_logits", reference_logits, np.float64))
    out = np.ascontiguousarray(_real("test_logits", test_logits, np.float64))
    _checked(ref, out)
    if isinstance(axis, bool) or not isinstance(axis, numbers.Integral):
        raise TypeError(f"axis: expected an integer axis, got {axis!r}")
    if not -ref.ndim <= axis < ref.ndim:
        raise ValueError(f"axis: {axis} is out of range for arrays of shape {ref.shape}")
    log_p = _log_softmax(ref, axis)
    log_q = _log_softmax(out, axis)
    with np.errstate(under="ignore"):
        p = np.exp(log_p)
    with np.errstate(invalid="ignore", under="ignore"):  # -inf - -inf where p is 0: term 0
        kl = np.sum(np.where(p > 0, p * (log_p - log_q), 0.0), axis=axis)
    return float(np.mean(np.maximum(kl, 0.0)))  # >= 0; rounding can leave -1e-17


@dataclasses.dataclass(frozen=True, eq=False)
class ColumnErrors:
    """Per-output-column accuracy of a test result.

    Attributes
    ----------
    sqnr_db : ndarray, shape (N,)
        SQNR of each column (``inf`` where exact, ``-inf`` where the reference
        column is zero and the test column is not).
    relative_error : ndarray, shape (N,)
        ``||ref[:, n] - test[:, n]|| / ||ref[:, n]||`` (0 where exact, ``inf``
        where the reference column is zero and the test column is not).
    """

    sqnr_db: np.ndarray
    relative_error: np.ndarray

    def __post_init__(self) -> None:
        for name in ("sqnr_db", "relative_error"):  # read-only views: the record is frozen
            object.__setattr__(self, name, read_only_view(np.asarray(getattr(self, name))))

    def __reduce__(self) -> tuple[Any, ...]:  # through __post_init__: read-only once unpickled
        return (type(self), (self.sqnr_db, self.relative_error))

    @property
    def worst_sqnr_db(self) -> float:
        """The lowest column SQNR, dB."""
        return float(np.min(self.sqnr_db))

    @property
    def median_sqnr_db(self) -> float:
        """The median column SQNR, dB."""
        return float(np.median(self.sqnr_db))

    @property
    def worst_column(self) -> int:
        """Index of the column with the lowest SQNR (the first if tied)."""
        return int(np.argmin(self.sqnr_db))


def column_errors(reference: object, test: object) -> ColumnErrors:
    """Error of every output column (the last axis; leading axes are samples)."""
    ref = _real("reference", reference, np.float64)
    out = _real("test", test, np.float64)
    _checked(ref, out)
    if ref.ndim == 0:
        raise ValueError("column_errors: expected arrays with a column axis, got scalars")
    # Exact scaling keeps the squares in range (see _Sums.of), each column by
    # its own largest magnitude (the whole array's took a column 1e170 below
    # it to zero: inf dB, no error); C order makes the column sums add in one
    # order whatever the inputs' layout.
    ref = np.ascontiguousarray(ref.reshape(-1, ref.shape[-1]))
    out = np.ascontiguousarray(out.reshape(-1, ref.shape[-1]))
    top = np.maximum(np.max(np.abs(ref), axis=0, initial=0.0),
                     np.max(np.abs(out), axis=0, initial=0.0))
    shift = -np.frexp(top)[1]  # 0 for an all-zero column
    ref, out = np.ldexp(ref, shift), np.ldexp(out, shift)
    signal = np.sum(ref * ref, axis=0)
    error = np.sum((ref - out) ** 2, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        sqnr = np.where(error == 0, np.inf,
                        np.where(signal == 0, -np.inf, 10.0 * np.log10(signal / error)))
        # Roots first, as the pair metric takes them: a subnormal signal
        # (a reference ~1e-154 of the test) would overflow error / signal.
        rel = np.where(error == 0, 0.0,
                       np.where(signal == 0, np.inf, np.sqrt(error) / np.sqrt(signal)))
    return ColumnErrors(sqnr_db=sqnr, relative_error=rel)
