"""What the fast backends derive once per weight load, shared by numba and JAX.

Optics is linear, so every detector rail's mean is a matmul of the source
light with that rail's transmissions. With balanced detection the ADC sees the
difference of two rails, ``a @ (T+ - T-)``, but the shot noise of the pair has
the variance of their *sum*, ``a @ (T+ + T-) / p``: a second matmul as large
as the first, needed only to set the size of a noise term.

:func:`light_factors` replaces that second matmul by a low-rank one. ``T+ + T-``
is non-negative and close to rank one; writing it as its column mean plus a
centred rest gives ``a @ (T+ + T-) ~ sum(a) mean (+ (a @ U) (S V^T))``, exact
for constant light; the top singular directions of the rest (``rank > 1``)
can be kept too, but buy nothing measurable: the error is the rest's
unstructured part, which no low rank captures. With offset-encoded inputs the
light is its constant offset plus a smaller signal, and the shot-noise
standard deviation from the column mean alone comes out within 0.1-0.2%
(median) and 2.3% (worst of 256 x 512 readouts) of the exact one for Gaussian
weights and inputs with massive activations, and within 0.2% / 1.7% for a
programmed Llama-3.1-8B gate_proj K-tile; keeping two more directions
changes neither figure in its second digit (measured by
``tests/test_kernels_numba.py::test_low_rank_light_error``). These figures
depend on the data: the error of an output is ``sum_j x_j (S_jn - mean_j S_jn)
/ 2`` for normalised inputs ``x`` and summed transmissions ``S``, so inputs
whose signs follow the weight rows' magnitudes over many channels move it
further (an audit's constructed case, half the rows 100x weaker and the
inputs positive on the strong half, negative on the weak one, gave noise
standard deviations 0.80x the exact ones, and 1.49x with the signs swapped);
``exact=True`` draws the exact variance. Split-encoded
inputs are sparse and dominated by their largest channels (errors up to 70%
with massive activations), so the fast backends use the factors only for
offset inputs and compute the exact product otherwise, as ``exact=True``
always does.
"""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from optical.config import OpticalConfig
from optical.physics import converters, encoding
from optical.quant import ProgrammedWeights, adc_rails

#: Rank of the low-rank factors of the summed rail light: the column mean alone
#: (more directions change the shot-noise error by under 1%; module docstring).
LIGHT_RANK = 1

# Derived quantities, keyed by the identity of the arrays they derive from
# (not of the ProgrammedWeights: outlier bypass and calibration make new
# ProgrammedWeights around the same arrays), dropped when one of them dies.
_CACHE: dict[tuple, dict] = {}


def light_factors(tsum: np.ndarray, rank: int = LIGHT_RANK, *,
                  seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Factors ``L`` (k, r) and ``R`` (r, N) with ``tsum ~ L @ R``.

    The first factor pair is the column mean (``L[:, 0] = 1``), so
    ``ones @ L @ R == ones @ tsum`` exactly; the rest (``rank > 1``; the
    default is the mean alone, see the module docstring) is a randomised SVD
    (Halko, Martinsson & Tropp, SIAM Rev. 53, 217, 2011; two power
    iterations) of the centred matrix. Exact when ``rank >= min(k, N) + 1``.

    Parameters
    ----------
    tsum : ndarray, shape (k, N)
        Summed transmission of the rails, one K-tile.
    rank : int
        Number of factor pairs, >= 1.
    seed : int
        Seed of the randomised SVD's test matrix (used when ``1 < rank <= min(k, N)``).
    """
    tsum = np.asarray(tsum)
    if tsum.dtype not in (np.float32, np.float64):
        tsum = tsum.astype(np.float64)
    k, n = tsum.shape
    mean = tsum.mean(axis=0, dtype=np.float64)
    if rank == 1:
        return mean_factors(mean, k)
    centred = tsum - mean.astype(tsum.dtype)  # float32 is ample for a noise variance
    if rank - 1 >= min(k, n):
        u, s, vt = np.linalg.svd(centred, full_matrices=False)
        left, right = u, s[:, None] * vt
    else:
        rng = np.random.default_rng(seed)
        sketch = centred @ rng.standard_normal((n, min(n, rank - 1 + 10)), dtype=centred.dtype)
        for _ in range(2):
            sketch, _ = np.linalg.qr(sketch)
            sketch, _ = np.linalg.qr(centred.T @ sketch)
            sketch = centred @ sketch
        q, _ = np.linalg.qr(sketch)
        u, s, vt = np.linalg.svd(q.T @ centred, full_matrices=False)
        left = q @ u[:, :rank - 1]
        right = s[:rank - 1, None] * vt[:rank - 1]
    return (np.concatenate([np.ones((k, 1)), left], axis=1).astype(np.float64),
            np.concatenate([mean[None, :], right], axis=0).astype(np.float64))


def mean_factors(mean: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`light_factors` of rank 1 (the default) from the column mean (N,)
    of a K-tile of ``k`` rows: ``L`` (k, 1) of ones, ``R`` (1, N) the mean."""
    return np.ones((k, 1)), np.asarray(mean, dtype=np.float64)[None, :]


@dataclasses.dataclass(frozen=True)
class Decoding:
    """Constants of the digital decoding of a config (see ``optical.core``)."""

    in_coeffs: np.ndarray
    in_const: float
    h: np.ndarray
    c_sum: float
    w_const: float
    t_min: float
    n_in: int
    n_det: int
    n_adc: int
    balanced: bool

    @classmethod
    def of(cls, config: OpticalConfig) -> Decoding:
        in_coeffs, in_const = encoding.rail_coefficients(config.encoding.inputs)
        w_coeffs, w_const = encoding.rail_coefficients(config.encoding.weights)
        g = adc_rails(config)
        h = np.asarray(w_coeffs) @ np.linalg.pinv(g)
        return cls(np.asarray(in_coeffs, dtype=np.float64), float(in_const), h,
                   float(np.sum(w_coeffs)), float(w_const), config.mask.min_transmission,
                   len(in_coeffs), g.shape[1], g.shape[0],
                   g.shape[0] == 1 and g.shape[1] == 2)


def adc_noise(pw: ProgrammedWeights) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """ADC windows as float64, the ENOB noise std per (K-tile, ADC rail,
    column) as the reference computes it, and the ADC's top code (0: ideal)."""
    bits = pw.config.adc.bits
    lo = pw.adc_lo.astype(np.float64)
    hi = pw.adc_hi.astype(np.float64)
    if bits is None:
        return lo, hi, np.zeros_like(lo), 0.0
    std = converters.enob_noise_std(pw.adc_lo, pw.adc_hi, bits, pw.config.adc.enob)
    return lo, hi, np.asarray(std, dtype=np.float64), float(converters.top_code(bits))


def derived(pw: ProgrammedWeights, name: object, build,
            arrays: tuple[str, ...] = ("transmissions",)):
    """``build(pw)``, computed once per programmed matrix and kept while the
    arrays of ``pw`` named in ``arrays`` (those ``build`` reads) live.
    ``name`` must tell apart everything else ``build`` depends on."""
    key = tuple(id(getattr(pw, a)) for a in arrays)
    store = _CACHE.get(key)
    if store is None:
        store = _CACHE[key] = {}
        for a in arrays:
            weakref.finalize(getattr(pw, a), _CACHE.pop, key, None)
    if name not in store:
        store[name] = build(pw)
    return store[name]
