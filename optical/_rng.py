"""Counter-based random numbers: every draw is a pure function of
(seed, stream, element index).

Why not ``numpy.random.Generator``: a sequential generator makes a result
depend on the order in which elements are drawn, hence on chunking and thread
count. Here each readout's noise is ``hash(key(seed, stream), index)``, so any
backend, chunk size or thread count draws the same numbers for the same
readout.

The hash is SplitMix64's output function (Steele, Lea & Flood, OOPSLA 2014)
applied to ``key + index * golden``: a Weyl sequence through a strong 64-bit
mixer, which passes BigCrush as a sequential generator. Distinct
(seed, stream) pairs get keys through the same mixer; two streams could only
overlap if their keys differed by a multiple of the golden increment within
the number of draws, a chance of about ``draws / 2**64``.

The numba kernels (``optical.kernels``) implement the same functions on
scalars; the tests hold the two to the same bits.
"""

from __future__ import annotations

import numpy as np

__all__ = ["STREAMS", "stream_key", "uniform", "normal", "poisson", "mix64"]

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_U32 = np.uint64(0xFFFFFFFF)

#: One independent stream per physical noise source, so switching one noise
#: off leaves the draws of the others unchanged.
STREAMS = {"shot": 1, "dark": 2, "read": 3, "rin": 4, "adc": 5}

#: Below this mean, Poisson draws use inversion; above, PTRS rejection (up
#: to :data:`POISSON_NORMAL_ABOVE`).
POISSON_INVERSION_MAX = 10.0

#: Above this mean, a Poisson draw is ``lam + sqrt(lam) z`` (z a standard
#: normal keyed by the index) rounded to a whole number. PTRS's acceptance
#: test, ``-lam + k log(lam) - lgamma(k + 1)``, cancels terms of size
#: ``lam log(lam)`` in float64: its error grows as about ``1e-16 lam log(lam)``
#: (1e-4 at 2**36, about 1 at 1e14, where the variance drifts off ``lam``),
#: while the normal law's error falls as its skewness ``1 / sqrt(lam)``. The
#: two cross here, at about 1.5e-5 each: far below what any run can measure.
POISSON_NORMAL_ABOVE = float(1 << 32)

# From here on a float64 holds no fraction (and above twice this, not every
# whole number): the mean is itself a whole number.
_WHOLE_FLOAT64 = float(1 << 52)


def mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    z = np.asarray(z, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, stream: int, attempt: int = 0) -> np.uint64:
    """The 64-bit key of one (seed, stream[, rejection attempt])."""
    with np.errstate(over="ignore"):
        z = mix64(np.uint64(seed) ^ mix64(np.uint64(stream) * GOLDEN))
        if attempt:
            z = mix64(z ^ (np.uint64(attempt) * _M2))
    return np.uint64(z)


def _bits(key: np.uint64, index: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return mix64(np.asarray(index, dtype=np.uint64) * GOLDEN + key)


def uniform(key: np.uint64, index: np.ndarray) -> np.ndarray:
    """Uniform float64 in [0, 1) with 53 random bits, one per index."""
    return (_bits(key, index) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _uniform_pair(key: np.uint64, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two uniforms from one hash: (0, 1] from the high word, [0, 1) from the low."""
    z = _bits(key, index)
    u1 = ((z >> np.uint64(32)).astype(np.float64) + 1.0) * 2.0**-32
    u2 = (z & _U32).astype(np.float64) * 2.0**-32
    return u1, u2


def normal(key: np.uint64, index: np.ndarray) -> np.ndarray:
    """Standard normal float64 by Box-Muller, one hash per draw (|z| < 6.67)."""
    u1, u2 = _uniform_pair(key, index)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


# fdlibm's log and sin/cos polynomials (Sun Microsystems, 1993), as in
# optical.kernels._rng_numba.
_LN2_HI, _LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
_LG = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01,
       2.222219843214978396e-01, 1.818357216161805012e-01, 1.531383769920937332e-01,
       1.479819860511658591e-01)
_S = (-1.66666666666666324348e-01, 8.33333333332248946124e-03, -1.98412698298579493134e-04,
      2.75573137070700676789e-06, -2.50507602534068634195e-08, 1.58969099521155010221e-10)
_C = (4.16666666666666019037e-02, -1.38888888888741095749e-03, 2.48015872894767294178e-05,
      -2.75573143513906633035e-07, 2.08757232129817482790e-09, -1.13596475577881948265e-11)


def _normal_arithmetic(key: np.uint64, index: np.ndarray) -> np.ndarray:
    """:func:`normal`'s law in plain float64 arithmetic: the bits of
    ``optical.kernels._rng_numba.normal`` (whose log and cosine are these
    polynomials), where :func:`normal` may differ from them by a few ulp.
    For draws whose last bits show: a Poisson count past
    :data:`POISSON_NORMAL_ABOVE` rounds ``sqrt(lam) z`` to a whole number, so
    numba must draw the same ``z`` to the bit."""
    z = _bits(key, index)
    u1 = ((z >> np.uint64(32)).astype(np.float64) + 1.0) * 2.0**-32
    # log(u1): u1 = 2**k m, m in [sqrt(2)/2, sqrt(2)), log(m) = log((1 + s) / (1 - s))
    hx = u1.view(np.uint64)
    mant = hx & np.uint64(0x000FFFFFFFFFFFFF)
    big = mant > np.uint64(0x6A09E667F3BCD)
    dk = ((hx >> np.uint64(52)).astype(np.int64) - 1023 + big).astype(np.float64)
    m = (mant | np.where(big, np.uint64(0x3FE0000000000000),
                         np.uint64(0x3FF0000000000000))).view(np.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    zz = s * s
    w = zz * zz
    r = zz * (_LG[0] + w * (_LG[2] + w * (_LG[4] + w * _LG[6]))) \
        + w * (_LG[1] + w * (_LG[3] + w * _LG[5]))
    hfsq = 0.5 * f * f
    log_u1 = dk * _LN2_HI - ((hfsq - (s * (hfsq + r) + dk * _LN2_LO)) - f)
    # cos(2 pi word / 2**32), the octant from the word's top bits (exact reduction)
    word = z & _U32
    quadrant = word >> np.uint64(30)
    rest = word & np.uint64(0x3FFFFFFF)
    upper = rest >= np.uint64(0x20000000)
    rest = np.where(upper, np.uint64(0x40000000) - rest, rest)
    x = rest.astype(np.float64) * (np.pi / 2 * 2.0**-30)
    x2 = x * x
    sin = x + x2 * x * (_S[0] + x2 * (_S[1] + x2 * (_S[2] + x2 * (_S[3] + x2 * (
        _S[4] + x2 * _S[5])))))
    hz = 0.5 * x2
    w = 1.0 - hz
    cos = w + (((1.0 - w) - hz) + x2 * (x2 * (_C[0] + x2 * (_C[1] + x2 * (_C[2] + x2 * (
        _C[3] + x2 * (_C[4] + x2 * _C[5])))))))
    odd = (quadrant & np.uint64(1)) == np.uint64(1)
    value = np.where(odd != upper, sin, cos)
    negative = (quadrant == np.uint64(1)) | (quadrant == np.uint64(2))
    return np.sqrt(-2.0 * log_u1) * np.where(negative, -value, value)


def poisson(seed: int, stream: int, index: np.ndarray, lam: np.ndarray, *,
            deviation: bool = False) -> np.ndarray:
    """Poisson draws (as float64) of mean ``lam``, elementwise.

    Exact below :data:`POISSON_NORMAL_ABOVE`: inversion for ``lam < 10``;
    above, the transformed rejection method PTRS (Hormann, Insurance: Math.
    Econ. 12, 39, 1993), each rejection attempt keyed separately so the
    result stays a function of the index alone. Above
    :data:`POISSON_NORMAL_ABOVE` (4.3e9), ``lam + sqrt(lam) z`` rounded to a
    whole number, ``z`` a standard normal keyed by ``stream_key(seed, stream)``
    and the index (:func:`_normal_arithmetic`); the law's error there, its
    skewness ``1 / sqrt(lam)``, is below 1.5e-5.
    Past 2**53 a float64 does not hold every whole number: a count is then
    rounded to the float64 grid of ``lam`` (spacing up to ``2**-52 lam``),
    which adds up to ``2**-104 lam**2 / 12`` to its variance (1.6e-3 of it
    at 1e30): the rounding of the count itself, not of its law.
    ``lam`` must be finite and ``>= 0`` (a NaN would never be accepted).

    ``deviation=True`` returns ``count - lam`` instead (dark noise, whose mean
    is subtracted), free of that rounding: past 2**52, where ``lam`` is a
    whole number, it is ``rint(sqrt(lam) z)``; below
    :data:`POISSON_NORMAL_ABOVE`, exactly ``poisson(...) - lam``.
    """
    lam = np.asarray(lam, dtype=np.float64)
    if lam.size and not (lam.min() >= 0 and lam.max() < np.inf):
        raise ValueError(f"lam: must be finite and >= 0; got values in [{lam.min()}, {lam.max()}]")
    index = np.asarray(index, dtype=np.uint64)
    index, lam = np.broadcast_arrays(index, lam)
    out = np.zeros(lam.shape, dtype=np.float64)
    small = lam < POISSON_INVERSION_MAX
    if small.any():
        out[small] = _poisson_inversion(stream_key(seed, stream), index[small], lam[small])
    large = lam > POISSON_NORMAL_ABOVE
    mid = ~small & ~large
    if mid.any():
        out[mid] = _poisson_ptrs(seed, stream, index[mid], lam[mid])
    if deviation:
        out -= lam
    if large.any():
        spread = _poisson_normal_deviation(stream_key(seed, stream), index[large], lam[large])
        out[large] = spread if deviation else lam[large] + spread
    return out


def _poisson_normal_deviation(key: np.uint64, index: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """``count - lam``, the count ``rint(lam + sqrt(lam) z)``, without cancellation."""
    spread = np.sqrt(lam) * _normal_arithmetic(key, index)
    # Below 2**52 the whole count is exact, and so is its difference from lam
    # (Sterbenz); from there on lam is whole, and so is the rounded spread.
    return np.where(lam < _WHOLE_FLOAT64, np.rint(lam + spread) - lam, np.rint(spread))


def _poisson_inversion(key: np.uint64, index: np.ndarray, lam: np.ndarray) -> np.ndarray:
    u = uniform(key, index)
    k = np.zeros_like(lam)
    p = np.exp(-lam)
    cdf = p.copy()
    active = u > cdf
    while active.any():
        k[active] += 1.0
        p[active] *= lam[active] / k[active]
        cdf[active] += p[active]
        # Rounding can leave cdf just below u in the far tail; p then
        # underflows to 0 and the draw stops there.
        active &= (u > cdf) & (p > 0.0)
    return k


def _poisson_ptrs(seed: int, stream: int, index: np.ndarray, lam: np.ndarray) -> np.ndarray:
    from scipy.special import gammaln

    out = np.empty_like(lam)
    todo = np.arange(lam.size)
    slam = np.sqrt(lam)
    loglam = np.log(lam)
    b = 0.931 + 2.53 * slam
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2.0)
    attempt = 0
    while todo.size:
        key = stream_key(seed, stream, attempt)
        u, v = _uniform_pair(key, index[todo])
        u = u - 0.5
        us = 0.5 - np.abs(u)
        lt, at, bt = lam[todo], a[todo], b[todo]
        quick = (us >= 0.07) & (v <= v_r[todo])
        # A uniform of exactly 1 (one draw in 2**32) makes us = 0: k is then
        # inf and the draw is rejected, without a warning.
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.floor((2.0 * at / us + bt) * u + lt + 0.43)
            slow = (
                ~quick & (k >= 0) & ~((us < 0.013) & (v > us))
                & (np.log(v * inv_alpha[todo] / (at / (us * us) + bt))
                   <= -lt + k * loglam[todo] - gammaln(k + 1.0))
            )
        accept = quick | slow
        out[todo[accept]] = k[accept]
        todo = todo[~accept]
        attempt += 1
    return out
