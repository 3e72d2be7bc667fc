"""Private numba kernels of :func:`optical.transformer.numerics.round_to`.

The references round every op's result (and every weight, once per forward)
to fp16 or bf16; numpy does it in two or five passes over the array with
temporaries of its size. These kernels do it in one parallel pass, on the
float32 bit patterns, and give the same bits as the numpy code in
``numerics`` (fp16: ``x.astype(float16).astype(float32)``, round to nearest
even, overflow to inf, fp16 subnormals kept; bf16: ``_round_bfloat16``).
A NaN comes out as the numpy code makes it (fp16: the few NaNs are rounded
by numpy itself afterwards; bf16: the canonical quiet NaN).

Called on float32 arrays that are contiguous in some order, through flat
views; elementwise, so the result depends neither on threads nor on chunks.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from optical._numba_cache import can_cache, serialise
from optical._numba_threads import guarded  # (also: passive OpenMP waits)

_CACHE = can_cache(__file__)  # False (with a warning) where nothing can be written

_PARALLEL = {"cache": _CACHE, "error_model": "numpy", "nogil": True, "parallel": True}

_CHUNK = 1 << 16
_ABS = np.uint32(0x7FFFFFFF)
_SIGN = np.uint32(0x80000000)
_INF = np.uint32(0x7F800000)
#: 65520: from here up, fp16 rounds to infinity (65504 is its largest finite value).
_HALF_OVERFLOW = np.uint32(0x477FF000)
#: 2**-14, fp16's smallest normal number; below it the spacing is 2**-24.
_HALF_NORMAL = np.uint32(0x38800000)


@guarded
@nb.njit(**_PARALLEL)
def half(bits, values, out, out_values):
    """fp16 rounding of float32 ``values`` (bit patterns ``bits``, the same
    memory) into ``out`` (``out_values`` its float32 view); returns the number
    of NaNs, left for the caller."""
    n = bits.size
    nans = 0
    for c in nb.prange(-(-n // _CHUNK)):
        for i in range(c * _CHUNK, min(c * _CHUNK + _CHUNK, n)):
            b = bits[i]
            a = b & _ABS
            if a > _INF:
                nans += 1
                out[i] = b
            elif a >= _HALF_OVERFLOW:
                out[i] = (b & _SIGN) | _INF
            elif a >= _HALF_NORMAL:  # keep 11 significant bits, ties to even
                r = np.uint64(a) + np.uint64(0xFFF) + np.uint64((a >> np.uint32(13))
                                                                & np.uint32(1))
                out[i] = (b & _SIGN) | (np.uint32(r) & np.uint32(0xFFFFE000))
            else:  # fp16 subnormal or zero: a multiple of 2**-24 (exact scalings)
                q = np.rint(abs(values[i]) * np.float32(16777216.0)) * np.float32(2.0 ** -24)
                out_values[i] = -q if b & _SIGN else q
    return nans


@guarded
@nb.njit(**_PARALLEL)
def bfloat16(bits, out):
    """bf16 rounding of float32 bit patterns (``numerics._round_bfloat16``)."""
    n = bits.size
    for c in nb.prange(-(-n // _CHUNK)):
        for i in range(c * _CHUNK, min(c * _CHUNK + _CHUNK, n)):
            b = bits[i]
            if (b & _ABS) > _INF:
                out[i] = np.uint32(0x7FC00000)  # numpy's float32(nan)
            else:
                r = np.uint64(b) + np.uint64(0x7FFF) + np.uint64((b >> np.uint32(16))
                                                                 & np.uint32(1))
                out[i] = np.uint32(r & np.uint64(0xFFFF0000))


serialise(globals())  # processes filling the kernel cache at once: optical._numba_cache
