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

#: Below this mean, Poisson draws use inversion; above, PTRS rejection.
POISSON_INVERSION_MAX = 10.0


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


def poisson(seed: int, stream: int, index: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """Exact Poisson draws (as float64) of mean ``lam``, elementwise.

    Inversion for ``lam < 10``; above, the transformed rejection method PTRS
    (Hormann, Insurance: Math. Econ. 12, 39, 1993), each rejection attempt
    keyed separately so the result stays a function of the index alone.
    ``lam`` must be finite and ``>= 0`` (a NaN would never be accepted).
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
    big = ~small
    if big.any():
        out[big] = _poisson_ptrs(seed, stream, index[big], lam[big])
    return out


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
        k = np.floor((2.0 * at / us + bt) * u + lt + 0.43)
        quick = (us >= 0.07) & (v <= v_r[todo])
        with np.errstate(divide="ignore", invalid="ignore"):
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
