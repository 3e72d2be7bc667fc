"""Low-precision numerics of the references: rounding float32 arrays to fp16 / bf16.

The references compute in float32 numpy and round each op's result to the
model dtype, which is what PyTorch does on the CPU for half types (each
kernel computes in float32 and rounds its output once). Arrays stay float32
holding dtype-representable values, so every GEMM runs in BLAS.
"""

from __future__ import annotations

import functools
import reprlib
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

__all__ = ["DTYPES", "check_dtype", "largest", "range_problem", "round_to", "softmax",
           "underflow_to_zero"]

_F = TypeVar("_F", bound=Callable[..., Any])

#: Reference dtypes, by the names torch and Hugging Face use.
DTYPES = ("float32", "float16", "bfloat16")


def check_dtype(dtype: str | np.dtype | type) -> str:
    """The canonical name of a reference dtype (a plain str, for a numpy
    dtype or scalar type given too, ``np.float16``: equal workloads hash
    alike and write as JSON);
    ValueError for anything else."""
    name = dtype
    if isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        name = np.dtype(dtype).name  # np.float16 as np.dtype("float16"); ml_dtypes' bfloat16
    # (an array here, a mask given in dtype's place: refused, no truth-value error)
    if not (isinstance(name, str) and name in DTYPES):
        raise ValueError(f"dtype: {reprlib.repr(dtype)} is not a reference dtype; valid: "
                         f"{', '.join(repr(d) for d in DTYPES)}")
    return DTYPES[DTYPES.index(name)]


def largest(dtype: str) -> float:
    """The largest finite value of a reference dtype (fp16: 65504)."""
    if check_dtype(dtype) == "bfloat16":
        return 3.3895313892515355e38  # (2 - 2**-7) * 2**127: float32's exponents, 8 bits
    return float(np.finfo(dtype).max)


def range_problem(x: np.ndarray, dtype: str, name: str) -> str | None:
    """Why the ``dtype`` reference cannot take ``x`` (a non-empty float
    array, named ``name``): its values reach far enough past the dtype's
    largest that rounding makes them inf (fp16: 65520 and up; 65504 < |x| <
    65520 rounds to 65504, as a cast in torch does), so the reference would
    be inf and NaN; None where it can."""
    peak = float(np.max(np.abs(x)))
    if peak <= largest("float32") and np.isfinite(
            round_to(np.array([peak], dtype=np.float32), dtype)[0]):
        return None
    return (f"{name}: |values| reach {peak:.8g}, beyond {dtype}'s largest "
            f"{largest(dtype):.8g} (they round to inf): the {dtype} reference would be "
            "inf and NaN")


def _round_bfloat16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), kept as float32.

    bfloat16 is float32 with the low 16 mantissa bits cut; rounding adds half
    an ulp (minus one when the kept last bit is even) before the cut, so a
    carry into the exponent rounds up correctly, and infinities stay infinite.
    NaN payloads are kept NaN.
    """
    bits = np.array(x, dtype=np.float32, copy=True).view(np.uint32)
    carry = bits >> np.uint32(16)  # in place below: two arrays of x's size at most
    carry &= np.uint32(1)
    carry += np.uint32(0x7FFF)
    bits += carry  # wraps only for NaN payloads, restored below
    del carry
    bits &= np.uint32(0xFFFF0000)
    out = bits.view(np.float32)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = np.nan
    return out


def round_to(x: np.ndarray, dtype: str, *, out: np.ndarray | None = None) -> np.ndarray:
    """``x`` (float32) rounded to ``dtype`` and returned as float32.

    Parameters
    ----------
    x : ndarray, float32
    dtype : {"float32", "float16", "bfloat16"}
        ``"float32"`` returns ``x`` itself (or its copy in ``out``); fp16
        overflows to inf as in torch.
    out : ndarray, optional
        Where to write the result: ``x`` itself (rounding in place: no new
        array, its pages already mapped, which on this kind of machine is most
        of the cost) or a float32 array of ``x``'s shape and memory order (a
        recycled buffer, :mod:`optical._memory`).
    """
    if out is not None and out is not x and not (
            out.dtype == np.float32 and out.shape == x.shape and out.strides == x.strides):
        raise ValueError(f"out: expected x itself or a float32 array of x's shape {x.shape} "
                         f"and strides {x.strides}, got {out.dtype} {out.shape} {out.strides}")
    if dtype == "float32":
        if out is not None and out is not x:
            out[...] = x
            return out
        return x
    if dtype not in ("float16", "bfloat16"):
        raise ValueError(f"dtype: {dtype!r} is not a reference dtype")
    if x.dtype == np.float32 and x.size >= _KERNEL_MIN and (x.flags.c_contiguous
                                                           or x.flags.f_contiguous):
        return _round_fast(x, dtype, out)
    if dtype == "float16":
        with np.errstate(over="ignore", under="ignore"):  # fp16's range is the point
            rounded = x.astype(np.float16).astype(np.float32)
    else:
        rounded = _round_bfloat16(x)
    if out is None:
        return rounded
    out[...] = rounded
    return out


#: Smallest array rounded by the numba kernels (below it numpy's passes are as quick).
_KERNEL_MIN = 1 << 14


def _round_fast(x: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """:func:`round_to` of a contiguous float32 array in one parallel pass
    (:mod:`optical.transformer._rounding`; the same bits as the numpy code),
    into ``out`` (a new array, a buffer of x's layout, or ``x`` itself: each
    element is read before it is written)."""
    from optical.transformer import _rounding

    if out is None:
        out = np.empty_like(x)  # the same memory order as x
    flat, out_flat = x.ravel(order="K"), out.ravel(order="K")
    if dtype == "bfloat16":
        _rounding.bfloat16(flat.view(np.uint32), out_flat.view(np.uint32))
        return out
    if _rounding.half(flat.view(np.uint32), flat, out_flat.view(np.uint32), out_flat):
        nan = np.isnan(flat)
        out_flat[nan] = flat[nan].astype(np.float16).astype(np.float32)
    return out


def underflow_to_zero(func: _F) -> _F:
    """``func`` with numpy's underflow ignored whatever ``np.seterr`` says:
    a result below its dtype's least normal value becoming a subnormal or
    zero is what fp16, bf16 and float32 arithmetic do (in torch, and in the
    emulated hardware), not an error. Under ``np.seterr(all="raise")`` every
    layer's softmax, SiLU and fp16 rounding raised FloatingPointError.
    Overflow, invalid operations and division by zero keep the caller's
    handling."""

    @functools.wraps(func)
    def quiet(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(under="ignore"):
            return func(*args, **kwargs)

    return quiet  # type: ignore[return-value]


@underflow_to_zero
def softmax(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in the dtype of ``s`` (float32 for the
    references); ``-inf`` entries get probability 0, as do scores so far
    below their row's largest that the exponential underflows."""
    e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)
