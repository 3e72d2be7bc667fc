"""The counter-based generator of ``optical._rng``, compiled with numba.

Same functions, same bits: ``uniform``, ``normal`` and ``poisson`` of a
(key, index) return what the numpy reference returns for that key and index
(uniforms and Poisson counts exactly; normals to a few ulp, since the
logarithm and cosine here are our own polynomials rather than the platform's).

Why our own ``log`` and ``cos``: a call into the C math library stops LLVM
from vectorising a loop, and then the normals cost as much as the matmul they
decorate. The fdlibm polynomials below (Sun Microsystems, 1993; the kernels
of most C libraries) are plain arithmetic on the bits of a float64, which
vectorises, and are accurate to about one ulp.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from optical._numba_cache import can_cache, serialise
from optical._numba_threads import guarded  # (also: passive OpenMP waits)

_CACHE = can_cache(__file__)  # False (with a warning) where nothing can be written

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
LOW32 = np.uint64(0xFFFFFFFF)
POISSON_INVERSION_MAX = 10.0
POISSON_NORMAL_ABOVE = float(1 << 32)  # see optical._rng
_WHOLE_FLOAT64 = float(1 << 52)

_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LG1 = 6.666666666666735130e-01
_LG2 = 3.999999999940941908e-01
_LG3 = 2.857142874366239149e-01
_LG4 = 2.222219843214978396e-01
_LG5 = 1.818357216161805012e-01
_LG6 = 1.531383769920937332e-01
_LG7 = 1.479819860511658591e-01
_S1 = -1.66666666666666324348e-01
_S2 = 8.33333333332248946124e-03
_S3 = -1.98412698298579493134e-04
_S4 = 2.75573137070700676789e-06
_S5 = -2.50507602534068634195e-08
_S6 = 1.58969099521155010221e-10
_C1 = 4.16666666666666019037e-02
_C2 = -1.38888888888741095749e-03
_C3 = 2.48015872894767294178e-05
_C4 = -2.75573143513906633035e-07
_C5 = 2.08757232129817482790e-09
_C6 = -1.13596475577881948265e-11
_HALF_PI_2M30 = math.pi / 2 * 2.0**-30


@intrinsic
def _as_bits(typingctx, x):
    """Reinterpret a float64 as uint64 (no conversion)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.uint64(types.float64), codegen


@intrinsic
def _from_bits(typingctx, x):
    """Reinterpret a uint64 as float64 (no conversion)."""
    if x != types.uint64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.uint64), codegen


@intrinsic
def _as_bits32(typingctx, x):
    """Reinterpret a float32 as uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


@intrinsic
def _from_bits32(typingctx, x):
    """Reinterpret a uint32 as float32."""
    if x != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


@nb.njit(inline="always", error_model="numpy")
def mix64(z):
    z = (z ^ (z >> np.uint64(30))) * M1
    z = (z ^ (z >> np.uint64(27))) * M2
    return z ^ (z >> np.uint64(31))


@nb.njit(error_model="numpy")
def stream_key(seed, stream, attempt):
    """``optical._rng.stream_key``: seed, stream and attempt are uint64."""
    z = mix64(seed ^ mix64(stream * GOLDEN))
    if attempt != np.uint64(0):
        z = mix64(z ^ (attempt * M2))
    return z


@nb.njit(inline="always", error_model="numpy")
def bits(key, index):
    return mix64(index * GOLDEN + key)


@nb.njit(inline="always", error_model="numpy")
def uniform(key, index):
    """Uniform in [0, 1) with 53 random bits."""
    return np.float64(bits(key, index) >> np.uint64(11)) * 2.0**-53


@nb.njit(inline="always", error_model="numpy")
def _log(x):
    """Natural log of a positive, normal float64 (fdlibm ``__ieee754_log``)."""
    hx = _as_bits(x)
    k = np.int64(hx >> np.uint64(52)) - 1023
    mant = hx & np.uint64(0x000FFFFFFFFFFFFF)
    # Normalise the mantissa into [sqrt(2)/2, sqrt(2)).
    big = mant > np.uint64(0x6A09E667F3BCD)
    k = k + np.int64(big)
    m = _from_bits(mant | (np.uint64(0x3FE0000000000000) if big else np.uint64(0x3FF0000000000000)))
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    w = z * z
    t1 = w * (_LG2 + w * (_LG4 + w * _LG6))
    t2 = z * (_LG1 + w * (_LG3 + w * (_LG5 + w * _LG7)))
    r = t2 + t1
    hfsq = 0.5 * f * f
    dk = np.float64(k)
    return dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)


@nb.njit(inline="always", error_model="numpy")
def _sin_kernel(x):
    z = x * x
    v = z * x
    r = _S2 + z * (_S3 + z * (_S4 + z * (_S5 + z * _S6)))
    return x + v * (_S1 + z * r)


@nb.njit(inline="always", error_model="numpy")
def _cos_kernel(x):
    z = x * x
    r = z * (_C1 + z * (_C2 + z * (_C3 + z * (_C4 + z * (_C5 + z * _C6)))))
    hz = 0.5 * z
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + z * r)


@nb.njit(inline="always", error_model="numpy")
def _cos_turns(word):
    """cos(2 pi word / 2**32) for a uint64 ``word`` < 2**32.

    The quadrant and octant come from the top bits of the integer, so the
    argument reduction is exact.
    """
    quadrant = word >> np.uint64(30)
    rest = word & np.uint64(0x3FFFFFFF)
    upper = rest >= np.uint64(0x20000000)  # angle in [pi/4, pi/2) of the quadrant
    rest = (np.uint64(0x40000000) - rest) if upper else rest
    theta = np.float64(rest) * _HALF_PI_2M30  # in [0, pi/4]
    c = _cos_kernel(theta)
    s = _sin_kernel(theta)
    # cos(q pi/2 + phi), phi = theta or pi/2 - theta
    first = s if upper else c    # cos(phi)
    second = c if upper else s   # sin(phi)
    odd = (quadrant & np.uint64(1)) == np.uint64(1)
    value = second if odd else first
    negative = (quadrant == np.uint64(1)) | (quadrant == np.uint64(2))
    return -value if negative else value


@nb.njit(inline="always", error_model="numpy")
def normal_inline(key, index):
    """Standard normal by Box-Muller from one hash, as ``optical._rng.normal``
    (inlined where called, so that loops over it vectorise)."""
    z = bits(key, index)
    u1 = (np.float64(z >> np.uint64(32)) + 1.0) * 2.0**-32
    return math.sqrt(-2.0 * _log(u1)) * _cos_turns(z & LOW32)


@nb.njit(error_model="numpy")
def normal(key, index):
    """:func:`normal_inline` as a call (keeps large kernels quick to compile)."""
    return normal_inline(key, index)


@nb.njit(error_model="numpy")
def _poisson_inversion(key, index, lam):
    u = uniform(key, index)
    k = 0.0
    p = math.exp(-lam)
    cdf = p
    while u > cdf and p > 0.0:
        k += 1.0
        p *= lam / k
        cdf += p
    return k


@nb.njit(error_model="numpy")
def _poisson_ptrs(seed, stream, index, lam):
    slam = math.sqrt(lam)
    loglam = math.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2.0)
    attempt = np.uint64(0)
    while True:
        z = bits(stream_key(seed, stream, attempt), index)
        u = (np.float64(z >> np.uint64(32)) + 1.0) * 2.0**-32 - 0.5
        v = np.float64(z & LOW32) * 2.0**-32
        us = 0.5 - abs(u)
        # np.floor stays float64 under numba (math.floor gives int64, which
        # wraps for lam above 2**63).
        k = np.floor((2.0 * a / us + b) * u + lam + 0.43)
        if us >= 0.07 and v <= v_r:
            return k
        if k >= 0.0 and not (us < 0.013 and v > us):
            if (math.log(v * inv_alpha / (a / (us * us) + b))
                    <= -lam + k * loglam - math.lgamma(k + 1.0)):
                return k
        attempt += np.uint64(1)


@nb.njit(error_model="numpy")
def _poisson_normal_deviation(key0, index, lam):
    """``count - lam`` of the normal law's count, as the reference's (whose
    normals are this module's, ``optical._rng._normal_arithmetic``)."""
    spread = math.sqrt(lam) * normal(key0, index)
    if lam < _WHOLE_FLOAT64:
        return np.rint(lam + spread) - lam
    return np.rint(spread)


@nb.njit(error_model="numpy")
def poisson(seed, stream, key0, index, lam):
    """Poisson draw of mean ``lam`` (as float64), as ``optical._rng.poisson``.

    ``key0`` is ``stream_key(seed, stream, 0)``, passed in to save a hash.
    """
    if lam < POISSON_INVERSION_MAX:
        return _poisson_inversion(key0, index, lam)
    if lam > POISSON_NORMAL_ABOVE:
        return lam + _poisson_normal_deviation(key0, index, lam)
    return _poisson_ptrs(seed, stream, index, lam)


@nb.njit(error_model="numpy")
def poisson_deviation(seed, stream, key0, index, lam):
    """``poisson(...) - lam``, exact at any mean, as ``optical._rng.poisson``
    with ``deviation=True``."""
    if lam > POISSON_NORMAL_ABOVE:
        return _poisson_normal_deviation(key0, index, lam)
    return poisson(seed, stream, key0, index, lam) - lam


# --------------------------------------------------------------------------- #
# The fast pair: two normals per hash, in float32 arithmetic
# --------------------------------------------------------------------------- #

_F = np.float32


@nb.njit(inline="always", error_model="numpy")
def _logf(x):
    """Natural log of a positive, normal float32 (Cephes ``logf``, no division)."""
    hx = _as_bits32(x)
    e = np.int32(hx >> np.uint32(23)) - np.int32(126)
    m = _from_bits32(np.uint32((hx & np.uint32(0x007FFFFF)) | np.uint32(0x3F000000)))  # [.5, 1)
    low = m < _F(0.707106781186547524)
    e = e - np.int32(low)
    m = (m + m - _F(1.0)) if low else (m - _F(1.0))
    z = m * m
    p = _F(7.0376836292e-2)
    p = p * m + _F(-1.1514610310e-1)
    p = p * m + _F(1.1676998740e-1)
    p = p * m + _F(-1.2420140846e-1)
    p = p * m + _F(1.4249322787e-1)
    p = p * m + _F(-1.6668057665e-1)
    p = p * m + _F(2.0000714765e-1)
    p = p * m + _F(-2.4999993993e-1)
    p = p * m + _F(3.3333331174e-1)
    fe = _F(e)
    y = m * z * p + _F(-2.12194440e-4) * fe - _F(0.5) * z
    return m + y + _F(0.693359375) * fe


@nb.njit(inline="always", error_model="numpy")
def normal_pair32(key, counter):
    """Two independent standard normals (float32) from one hash: Box-Muller's
    cosine and sine of the same angle. Accurate to a few float32 ulp of 1.0
    (absolute error below 1e-6; at small radii, where ``u1`` rounded to
    float32 sets the error, that is up to ~180 ulp of the value); the
    radius is capped at sqrt(64 ln 2) = 6.66, as in the reference."""
    z = bits(key, counter)
    high = z >> np.uint64(32)
    u1 = (_F(np.uint32(high)) + _F(1.0)) * _F(2.0**-32)
    # Near u1 = 1, -log(u1) = -log1p(-w) from the exact w = 1 - u1, so that
    # small radii keep their precision.
    w = _F(np.uint32(np.uint64(0xFFFFFFFF) - high)) * _F(2.0**-32)
    series = w * (_F(1.0) + w * (_F(0.5) + w * _F(1.0 / 3.0)))
    minus_log = series if w < _F(2.0**-10) else -_logf(u1)
    radius = math.sqrt(_F(2.0) * minus_log)
    word = np.uint32(z & LOW32)
    quadrant = word >> np.uint32(30)
    rest = word & np.uint32(0x3FFFFFFF)
    upper = rest >= np.uint32(0x20000000)
    rest = (np.uint32(0x40000000) - rest) if upper else rest
    x = _F(rest) * _F(_HALF_PI_2M30)  # in [0, pi/4]
    x2 = x * x
    s = x + x * x2 * ((_F(-1.9515295891e-4) * x2 + _F(8.3321608736e-3)) * x2
                      + _F(-1.6666654611e-1))
    c = _F(1.0) - _F(0.5) * x2 + x2 * x2 * ((_F(2.443315711809948e-5) * x2
                                              + _F(-1.388731625493765e-3)) * x2
                                             + _F(4.166664568298827e-2))
    cos_phi = s if upper else c
    sin_phi = c if upper else s
    odd = (quadrant & np.uint32(1)) == np.uint32(1)
    # cos and sin of (quadrant * pi / 2 + phi)
    cos_v = sin_phi if odd else cos_phi
    sin_v = cos_phi if odd else sin_phi
    cos_neg = (quadrant == np.uint32(1)) | (quadrant == np.uint32(2))
    sin_neg = quadrant >= np.uint32(2)
    cos_v = -cos_v if cos_neg else cos_v
    sin_v = -sin_v if sin_neg else sin_v
    return radius * cos_v, radius * sin_v


# --------------------------------------------------------------------------- #
# Array entry points (the tests, the RNG benchmark, synthetic weights)
# --------------------------------------------------------------------------- #

_BLOCK = 4096


@nb.njit(cache=_CACHE, error_model="numpy")
def normal_array(key, index, out):
    """The reference's normals of every counter in ``index`` (serial)."""
    for i in range(index.size):
        out[i] = normal(key, index[i])


@nb.njit(cache=_CACHE, error_model="numpy")
def uniform_array(key, index, out):
    for i in range(index.size):
        out[i] = uniform(key, index[i])


@nb.njit(cache=_CACHE, error_model="numpy")
def poisson_array(seed, stream, index, lam, out, deviation=False):
    key0 = stream_key(seed, stream, np.uint64(0))
    for i in range(index.size):
        if deviation:
            out[i] = poisson_deviation(seed, stream, key0, index[i], lam[i])
        else:
            out[i] = poisson(seed, stream, key0, index[i], lam[i])


@nb.njit(cache=_CACHE, error_model="numpy")
def _normal_block(key, start, out):
    for i in range(out.size):
        out[i] = normal_inline(key, start + np.uint64(i))


@nb.njit(cache=_CACHE, error_model="numpy")
def _pairs_block(key, start, out):
    for i in range(out.size // 2):
        c, s = normal_pair32(key, start + np.uint64(i))
        out[2 * i] = c
        out[2 * i + 1] = s


@guarded
@nb.njit(parallel=True, cache=_CACHE, error_model="numpy")
def normal_range(key, start, out):
    """Reference normals of the counters ``start, start + 1, ...``, in parallel."""
    for b in nb.prange((out.size + _BLOCK - 1) // _BLOCK):
        lo = b * _BLOCK
        _normal_block(key, start + np.uint64(lo), out[lo:min(lo + _BLOCK, out.size)])


@guarded
@nb.njit(parallel=True, cache=_CACHE, error_model="numpy")
def normal_pairs_range(key, start, out):
    """Fast normals in parallel: ``out[2 i], out[2 i + 1]`` are the pair of
    counter ``start + i`` (``out.size`` even)."""
    for b in nb.prange((out.size + _BLOCK - 1) // _BLOCK):
        lo = b * _BLOCK
        _pairs_block(key, start + np.uint64(lo // 2), out[lo:min(lo + _BLOCK, out.size)])


@nb.njit(cache=_CACHE, error_model="numpy")
def _tukey_block(key, start, half_h, scale, out):
    for i in range(out.size // 2):
        c, s = normal_pair32(key, start + np.uint64(i))
        out[2 * i] = c * math.exp(half_h * (c * c)) * scale
        out[2 * i + 1] = s * math.exp(half_h * (s * s)) * scale
    if out.size % 2:
        c, _ = normal_pair32(key, start + np.uint64(out.size // 2))
        out[out.size - 1] = c * math.exp(half_h * (c * c)) * scale


@guarded
@nb.njit(parallel=True, cache=_CACHE, error_model="numpy")
def tukey_h_range(key, h, scale, out):
    """Tukey-h samples ``scale z exp(h z**2 / 2)`` (float32, in parallel) of
    the fast normals: ``out[2 i], out[2 i + 1]`` from the pair of counter ``i``."""
    half_h = np.float32(h / 2)
    factor = np.float32(scale)
    for b in nb.prange((out.size + _BLOCK - 1) // _BLOCK):
        lo = b * _BLOCK
        _tukey_block(key, np.uint64(lo // 2), half_h, factor,
                     out[lo:min(lo + _BLOCK, out.size)])


serialise(globals())  # processes filling the kernel cache at once: optical._numba_cache
