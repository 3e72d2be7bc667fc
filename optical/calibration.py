"""Calibration from example inputs: static input ranges and ADC windows.

A hardware mapping fixes its ranges once, from a batch of representative
inputs, not per call. This module turns a calibration batch ``(n, K)`` into

- a static input full scale: a percentile of the inputs' absolute values;
- the ADC window of every (K-tile, ADC rail, column) -- or of every tile --
  that minimises the expected squared conversion error, quantisation and
  clipping together, over the readouts those inputs produce.

The readouts are noise-free GEMMs of the normalised, DAC-quantised
calibration inputs with the programmed transmissions (at most
``calibration.max_tokens`` tokens), widened by the analytic readout noise
(shot, dark, read, RIN), so the result does not depend on any noise seed. The
DAC matters: inputs much smaller than the range (the bulk of the channels,
next to outliers) sit on the one or two levels around zero, and with offset
encoding an even number of levels cannot show zero exactly, which shifts and
spreads the readouts far more than the inputs themselves do.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import TYPE_CHECKING

import numpy as np

from optical._gemm import row_block
from optical._validation import (
    as_plain_array,
    check_bool,
    check_float_array,
    check_float_dtype,
    check_positive_int,
)
from optical.config import OpticalConfig
from optical.physics import converters, encoding

if TYPE_CHECKING:
    from optical.quant import Tiling

__all__ = ["check_inputs", "input_range", "mse_windows", "normalise", "readout_windows",
           "subsample"]

#: Bins of a group's readout range; window ends are chosen among the bin edges.
N_BINS = 256

#: Readout noise below this fraction of every column's readout range is left
#: out of the window choice (it widens the readouts' distribution by < 1 %).
NEGLIGIBLE_NOISE = 0.02

#: Samples per tail fitted with an exponential (peaks over threshold): the
#: most extreme readouts, whose local decay the fit follows (for a Gaussian
#: the decay steepens outwards, and an exponential fitted further in would
#: overstate the far tail).
TAIL_SAMPLES = 16

# Nine-point Gauss-Hermite rule for E f(r + s z), z ~ N(0, 1): its nodes
# reach 4.5 s (a three-point rule stops at 1.7 s). The rule sees the noise as
# nine atoms, so the optimal window jumps between them: for pure Gaussian
# readouts it lands within 5 % of the exact optimum's half-width, and within
# 0.1 dB of its conversion MSE, at 2 to 6 and 8 to 10 bits, but 11 % narrow
# at 7 bits (1.1 dB above the optimum's MSE). Readouts spread wider than the
# noise smooth the jumps out (0.3 dB at 7 bits when the noise is 8x their
# spread, at most 0.1 dB otherwise). Other node counts move the miss to
# other bits; an exact Gaussian clipping integral would remove it. Above 10
# bits the window stops at the outermost node while the optimum widens (5.0 s
# at 12 bits, 7.5 s at 24): the conversion MSE of pure noise levels off at
# ~5e-7 of the noise's variance (63 dB below it) instead of falling further.
# 25 nodes would hold 0.1 dB to 16 bits, for ~25 % more window search (a
# third of programming a layer) and no change in validate's SQNRs.
_HERMITE_NODES, _HERMITE_WEIGHTS = np.polynomial.hermite_e.hermegauss(9)
_HERMITE_WEIGHTS = _HERMITE_WEIGHTS / _HERMITE_WEIGHTS.sum()


def check_inputs(calibration: object, k: int) -> np.ndarray:
    """Validate calibration inputs for a matrix of ``k`` rows; return them as (n, k).

    Raises
    ------
    TypeError
        Not a float32/float64 numpy array.
    ValueError
        Wrong width, no tokens, NaN / inf entries, or nothing but zeros.
    """
    cal = check_float_array(calibration, "calibration", min_ndim=1)
    if cal.shape[-1] != k:
        raise ValueError(f"calibration: has {cal.shape[-1]} features (last axis of "
                         f"{cal.shape}) but w has {k} rows")
    cal = cal.reshape(-1, k)
    if cal.shape[0] == 0:
        raise ValueError(f"calibration: shape {calibration.shape} holds no tokens")
    if not cal.any():
        raise ValueError(f"calibration: all {cal.size} entries are zero; ranges and windows "
                         "need representative (non-zero) inputs")
    return cal


def subsample(cal: np.ndarray, max_tokens: int) -> np.ndarray:
    """At most ``max_tokens`` rows, evenly spaced (deterministic)."""
    max_tokens = check_positive_int(max_tokens, "max_tokens")  # (0 gave no rows)
    n = cal.shape[0]
    if n <= max_tokens:
        return cal
    return cal[np.linspace(0, n - 1, max_tokens).round().astype(np.int64)]


def input_range(cal: np.ndarray, percentile: float) -> float:
    """Static input full scale: the ``percentile`` of ``|cal|``; where that is
    0 (mostly-zero inputs: sparse or ReLU activations), the largest ``|cal|``,
    in the inputs' own units (1 only if every entry is 0, which
    :func:`optical.program` refuses). ``percentile`` in (0, 100], as
    ``dac.percentile`` (0 gave the smallest ``|cal|``)."""
    if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real) \
            or not 0 < percentile <= 100:
        raise ValueError(f"percentile: {percentile!r} must be a number in (0, 100]")
    if cal.size == 0:
        return 1.0
    value = float(np.percentile(np.abs(cal), percentile))
    if value > 0:
        return value
    largest = float(np.max(np.abs(cal)))
    return largest if largest > 0 else 1.0


def normalise(cal: np.ndarray, config: OpticalConfig, static_range: float | None, *,
              tensor_absmax: float | None = None) -> np.ndarray:
    """Calibration inputs scaled into [-1, 1] as :func:`optical.matmul` scales
    inputs (per token, per tensor, or by the static range with clipping), float64.

    ``tensor_absmax``: the per-tensor scale when ``cal`` is a subsample of the
    calibration batch (default: the abs-max of ``cal``)."""
    x = cal.astype(np.float64)
    if static_range is not None:
        return np.clip(x / static_range, -1.0, 1.0)
    if config.dac.scaling == "per_token":
        absmax = np.max(np.abs(x), axis=1, keepdims=True)
    else:
        if tensor_absmax is None:
            tensor_absmax = float(np.max(np.abs(x))) if x.size else 0.0
        absmax = np.full((1, 1), tensor_absmax)
    return x / np.where(absmax > 0, absmax, 1.0)


def readout_windows(xn: np.ndarray, transmissions: np.ndarray, tiling: Tiling,
                    rails: np.ndarray,
                    config: OpticalConfig) -> tuple[np.ndarray, np.ndarray]:
    """Calibrated ADC windows per (K-tile, ADC rail, column), full-scale-MAC units.

    Parameters
    ----------
    xn : ndarray, shape (n, K)
        Normalised calibration inputs in [-1, 1] (:func:`normalise`).
    transmissions : ndarray, shape (rails, K, N)
        Physical transmissions of the mask rails.
    tiling : optical.quant.Tiling
    rails : ndarray, shape (adc_rails, detector_rails)
        How detector rails combine into ADC readouts (``quant.adc_rails``).
    config : OpticalConfig

    Returns
    -------
    lo, hi : ndarray, shape (k_tiles, adc_rails, N)
        With ``adc.window == "per_tile"`` every column of an N-tile shares one window.

    Raises
    ------
    ValueError
        Arguments whose shapes disagree (``xn``'s K or the transmissions'
        (K, N) not the tiling's, ``rails`` not one column per rail of the
        transmissions), named: the compiled kernel indexes by them unchecked.
    TypeError
        ``xn`` or ``transmissions`` not float32 or float64.
    """
    from optical.kernels import _windows
    from optical.kernels.numba_backend import engine_matmul

    xn, transmissions, rails = (np.asarray(a) for a in (xn, transmissions, rails))
    # The kernels index by these shapes unchecked: they must agree.
    if transmissions.ndim != 3 or transmissions.shape[1:] != (tiling.k, tiling.n):
        raise ValueError(f"transmissions: expected shape (rails, {tiling.k}, {tiling.n}) of the "
                         f"tiling, got {transmissions.shape}")
    if rails.ndim != 2 or rails.shape[1] != transmissions.shape[0]:
        raise ValueError(f"rails: expected shape (adc_rails, {transmissions.shape[0]}), one "
                         f"column per rail of transmissions, got {rails.shape}")
    if xn.ndim != 2 or xn.shape[1] != tiling.k:
        raise ValueError(f"xn: expected shape (tokens, {tiling.k}) of the tiling, got "
                         f"{xn.shape}")
    # ... and compile for float32 or float64 alone (float16 failed inside numba;
    # integer transmissions gave integer windows).
    for name, a in (("xn", xn), ("transmissions", transmissions)):
        check_float_dtype(a.dtype, name)
    # C order: the DAC levels' means and the GEMM below round by memory order
    # (a Fortran-ordered float64 input moved the windows by 1e-15).
    xn = np.ascontiguousarray(xn)
    bits = config.adc.bits
    p = config.source.photons_per_mac
    det = config.detector
    rin2 = config.source.rin_sigma ** 2
    n_adc = rails.shape[0]
    lo = np.empty((tiling.k_tiles, n_adc, tiling.n), dtype=transmissions.dtype)
    hi = np.empty_like(lo)
    block = row_block(xn.shape[0] * encoding.n_rails(config.encoding.inputs))
    transmissions = np.ascontiguousarray(transmissions)
    rails_f64 = np.ascontiguousarray(rails, dtype=np.float64)
    for kt in range(tiling.k_tiles):
        ks = tiling.k_slice(kt)
        # DAC levels of every pass, stacked: (passes * n, k).
        a = converters.quantize_levels(encoding.encode(xn[:, ks], config.encoding.inputs),
                                       config.dac.bits).reshape(-1, ks.stop - ks.start)
        a_mean, a_sq = a.mean(axis=0), np.square(a).mean(axis=0)
        a = a.astype(transmissions.dtype)
        for nt in range(tiling.n_tiles):
            ns = tiling.n_slice(nt)
            # Each ADC rail's transmissions, the mean detected light per rail
            # (shot noise) and the RIN variance, in one pass over the tile.
            combined = np.empty((n_adc, ks.stop - ks.start, ns.stop - ns.start),
                                dtype=transmissions.dtype)
            detected = np.zeros((rails.shape[1], ns.stop - ns.start))
            rin = np.zeros((n_adc, ns.stop - ns.start))
            _windows.readout_tile(transmissions, ks.start, ks.stop, ns.start, ns.stop,
                                  rails_f64, a_mean, a_sq, combined, detected, rin)
            for e in range(n_adc):
                samples = engine_matmul(a, combined[e], block)  # (passes * n, cols), noise-free
                noise_var = np.zeros(samples.shape[1])
                if rin2 > 0:
                    noise_var += rin2 * rin[e]
                if math.isfinite(p):
                    noise_var += np.square(rails[e]) @ detected / p
                    noise_var += np.square(rails[e]).sum() * det.dark_electrons / (p * p)
                    noise_var += det.read_noise_electrons ** 2 / (p * p)
                groups = None if config.adc.window == "per_column" else \
                    np.zeros(samples.shape[1], dtype=np.int64)
                if bits is None:  # an exact ADC ignores its window
                    w_lo, w_hi = samples.min(axis=0), samples.max(axis=0)
                else:
                    w_lo, w_hi = mse_windows(samples, np.sqrt(noise_var), bits,
                                             config.adc.enob_loss, groups=groups)
                    if groups is not None:
                        w_lo, w_hi = w_lo[groups], w_hi[groups]
                lo[kt, e, ns], hi[kt, e, ns] = w_lo, w_hi
    return lo, hi


def mse_windows(samples: np.ndarray, sigma: np.ndarray, bits: int, enob_loss: float = 0.0, *,
                groups: np.ndarray | None = None, tails: bool = True,
                n_bins: int = N_BINS, backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """ADC windows that minimise the expected squared conversion error.

    For a window ``[lo, hi]`` the error of one readout ``r`` is the clipping
    error ``(r - hi)**2`` above the window, ``(lo - r)**2`` below, and the
    quantisation error ``kappa * step**2 / 12`` (``step = (hi - lo) / (2**bits - 1)``,
    ``kappa = 4**enob_loss`` for the converter's noise) everywhere.

    The expectation runs over the samples, convolved with the readout noise
    of standard deviation ``sigma`` through a nine-point Gauss-Hermite rule
    (skipped where the noise is below ``NEGLIGIBLE_NOISE`` of every column's
    range), and, with ``tails=True``, over exponential tails fitted to the
    ``TAIL_SAMPLES`` most extreme samples of each column on each side: the
    largest of a few hundred samples falls well short of the tail that an
    8-bit window must hold, and a window fitted to the samples alone clips
    new inputs (measured at 8 bits on 512 Gaussian or gamma samples, 100
    draws: a median 10 dB short of the best window for new readouts; with
    the tails, a median 1.4 dB, 90 % of draws within 2.8 dB, the worst 10 dB,
    where the tail fitted to 16 samples came out short and the window
    narrow). The objective is convex in (lo, hi);
    the ends are chosen among ``n_bins + 1`` evenly spaced edges of each
    group's range by alternating exact line minimisations.

    Parameters
    ----------
    samples : ndarray, shape (S, C)
        Noise-free readouts: S samples of C columns.
    sigma : ndarray, shape (C,)
        Readout noise standard deviation per column (same unit); a scalar
        applies to every column.
    bits : int
    enob_loss : float, bits
        Finite, ``>= 0`` and below ``bits``.
    groups : ndarray of int, shape (C,), optional
        Columns sharing one window: ids ``0..G-1``, each used by at least one
        column; default: one per column.
    tails : bool
        Fit exponential tails beyond the samples (True), or take the samples
        as the whole distribution (False).
    n_bins : int
    backend : {"auto", "numpy", "numba"}
        Where the search runs once the ranges and tails are known: "numpy" is
        the readable reference below; "numba" (what "auto" takes) runs each
        group on its own in a compiled kernel (:mod:`optical.kernels._windows`),
        the same arithmetic but for the tails' ``exp`` (libm's, not numpy's),
        which can move a window by one bin at equal cost.

    Returns
    -------
    lo, hi : ndarray, shape (G,), float64
    """
    if backend not in ("auto", "numpy", "numba"):
        raise ValueError(f"backend: {backend!r} is not valid; valid: 'auto', 'numpy', 'numba'")
    if bits is None or isinstance(bits, bool) or not isinstance(bits, int | np.integer) \
            or not 1 <= bits <= 24:
        raise ValueError(f"bits: {bits!r} is not valid; valid: integer in [1, 24] (an exact "
                         "ADC, bits None, needs no window)")
    if isinstance(n_bins, bool) or not isinstance(n_bins, int | np.integer) or n_bins < 1:
        raise ValueError(f"n_bins: {n_bins!r} is not valid; valid: a positive integer")
    tails = check_bool(tails, "tails")
    if isinstance(enob_loss, bool) or not isinstance(enob_loss, numbers.Real) \
            or not 0 <= enob_loss < math.inf:
        raise ValueError(f"enob_loss: {enob_loss!r} is not valid; valid: a finite number >= 0")
    if enob_loss >= bits:  # as ADCConfig: no effective bits left (the search can then
        # stop at a corner of the (lo, hi) grid, far from the best window)
        raise ValueError(f"enob_loss: {enob_loss} leaves no effective bits of bits = {bits}; "
                         "valid: enob_loss < bits")
    samples = as_plain_array(samples, "samples")
    if samples.dtype.kind in "biu":  # integer readouts (ADC codes, say) are exact in float64
        samples = samples.astype(np.float64)
    samples = check_float_array(samples, "samples", ndim=2)
    if samples.shape[0] == 0 or samples.shape[1] == 0:
        raise ValueError(f"samples: shape {samples.shape} is empty; expected (S, C) with "
                         "S, C >= 1")
    sigma = as_plain_array(sigma, "sigma")
    if sigma.dtype.kind not in "iuf":  # not parsed from text, no imaginary part dropped
        raise TypeError(f"sigma: dtype {sigma.dtype} is not supported; expected real "
                        "numbers (integer or float)")
    sigma = sigma.astype(np.float64)
    if sigma.shape not in ((), (1,), samples.shape[1:]):
        raise ValueError(f"sigma: shape {sigma.shape} does not match the {samples.shape[1]} "
                         "columns of samples; expected one per column or a scalar")
    sigma = np.broadcast_to(sigma, samples.shape[1:])
    if not (np.isfinite(sigma).all() and (sigma >= 0).all()):
        raise ValueError("sigma: expected finite, non-negative noise standard deviations")
    n_cols = samples.shape[1]
    if groups is None:
        groups = np.arange(n_cols)
    groups = np.asarray(groups)
    if groups.shape != (n_cols,) or groups.dtype.kind not in "iu" or \
            (groups.size and (groups.min() < 0)):
        raise ValueError(f"groups: expected {n_cols} non-negative integer group ids, one per "
                         f"column, got {groups.dtype} {groups.shape}")
    groups = groups.astype(np.int64)
    n_groups = int(groups.max()) + 1 if groups.size else 0
    unused = np.flatnonzero(np.bincount(groups, minlength=n_groups) == 0)
    if unused.size:
        # A group with no column would get a NaN window.
        raise ValueError(f"groups: ids must be 0..{n_groups - 1}, each used by some column; "
                         f"no column has id(s) {unused.tolist()}")
    col_min = samples.min(axis=0).astype(np.float64)
    col_max = samples.max(axis=0).astype(np.float64)
    noisy = bool(np.any(sigma > NEGLIGIBLE_NOISE * (col_max - col_min)))
    nodes, node_weights = (_HERMITE_NODES, _HERMITE_WEIGHTS) if noisy else ([0.0], [1.0])
    reach = float(np.max(np.abs(nodes)))
    # Column-major samples: each column's values contiguous.
    samples_t = np.ascontiguousarray(samples.T)
    tails = _exponential_tails(samples_t) if tails else None
    g_lo = np.full(n_groups, np.inf)
    g_hi = np.full(n_groups, -np.inf)
    np.minimum.at(g_lo, groups, col_min - reach * sigma)
    np.maximum.at(g_hi, groups, col_max + reach * sigma)
    if tails is not None:
        # Room for windows far into a long tail: past the threshold by up to
        # ~2 ln(levels) mean excesses, where clipping meets one step's error.
        far = 3.0 + 2.0 * math.log(1 << bits)
        np.minimum.at(g_lo, groups, tails.u_lo - far * tails.e_lo)
        np.maximum.at(g_hi, groups, tails.u_hi + far * tails.e_hi)
    width = (g_hi - g_lo) / n_bins
    inv_width = np.where(width > 0, 1.0 / np.where(width > 0, width, 1.0), 0.0)
    if backend != "numpy":
        from optical.kernels import _windows

        return _windows.windows(samples_t, sigma, groups, n_groups, g_lo, width, inv_width,
                                nodes, node_weights, tails, bits, enob_loss, n_bins)

    # Per-column histograms over their group's bins: weight and first and
    # second moments about the group's lower end, from one pass over the
    # samples (column-major, so each column's bins stay close for bincount).
    v = samples_t - g_lo[groups].astype(samples.dtype)[:, None]
    b = (v * inv_width[groups].astype(samples.dtype)[:, None]).astype(np.int64)
    np.clip(b, 0, n_bins - 1, out=b)
    b += (np.arange(n_cols) * n_bins)[:, None]
    b, v = b.ravel(), v.ravel()
    h0 = np.bincount(b, minlength=n_cols * n_bins).astype(np.float64)
    h1 = np.bincount(b, weights=v, minlength=n_cols * n_bins)
    h2 = np.bincount(b, weights=np.square(v, dtype=np.float64), minlength=n_cols * n_bins)
    # Each Gauss-Hermite node shifts a whole column by node * sigma: its moments
    # shift exactly, its bins by the nearest whole number of bins (mass pushed
    # past either end by that rounding stays in the end bin).
    size = n_groups * n_bins
    s0, s1, s2 = np.zeros(size), np.zeros(size), np.zeros(size)
    bins = np.arange(n_bins)
    for node, weight in zip(nodes, node_weights, strict=True):
        shift = (node * sigma)[:, None]
        moved = np.rint(shift * inv_width[groups][:, None]).astype(np.int64)
        dest = (groups[:, None] * n_bins + np.clip(bins + moved, 0, n_bins - 1)).ravel()
        shift = np.broadcast_to(shift, (n_cols, n_bins)).ravel()
        s0 += weight * np.bincount(dest, weights=h0, minlength=size)
        s1 += weight * np.bincount(dest, weights=h1 + shift * h0, minlength=size)
        s2 += weight * np.bincount(dest, weights=h2 + 2 * shift * h1 + shift**2 * h0,
                                   minlength=size)
    zero = np.zeros((n_groups, 1))
    c0, c1, c2 = (np.concatenate([zero, np.cumsum(s.reshape(n_groups, n_bins), axis=1)], axis=1)
                  for s in (s0, s1, s2))
    t0, t1, t2 = c0[:, -1:], c1[:, -1:], c2[:, -1:]
    edges = np.arange(n_bins + 1) * width[:, None]  # (G, B + 1), relative to g_lo
    # Every sample in the bins below edge i lies below it, and above edge j above it.
    clip_lo = c2 - 2 * edges * c1 + edges**2 * c0
    clip_hi = (t2 - c2) - 2 * edges * (t1 - c1) + edges**2 * (t0 - c0)
    if tails is not None:
        # Where the samples run out, the fitted tails still clip.
        absolute = g_lo[groups][:, None] + edges[groups]  # (C, B + 1)
        step = width[groups]
        model_hi = _tail_clip(absolute - tails.u_hi[:, None], tails.count, tails.e_hi, step)
        # Below the lower threshold the ends run the other way: reversed rows.
        model_lo = _tail_clip((tails.u_lo[:, None] - absolute)[:, ::-1], tails.count,
                              tails.e_lo, step)[:, ::-1]
        clip_hi = np.maximum(clip_hi, _group_sum(model_hi, groups, n_groups))
        clip_lo = np.maximum(clip_lo, _group_sum(model_lo, groups, n_groups))
    quant = t0 * 4.0**enob_loss / (12.0 * converters.top_code(bits) ** 2)  # times (hi - lo)**2

    rows = np.arange(n_groups)
    i = np.zeros(n_groups, dtype=np.int64)
    j = np.full(n_groups, n_bins, dtype=np.int64)
    index = np.arange(n_bins + 1)
    for _ in range(4 * n_bins):
        lo_edge = edges[rows, i][:, None]
        cost_hi = clip_hi + quant * (edges - lo_edge) ** 2
        new_j = np.argmin(np.where(index >= i[:, None], cost_hi, np.inf), axis=1)
        hi_edge = edges[rows, new_j][:, None]
        cost_lo = clip_lo + quant * (hi_edge - edges) ** 2
        new_i = np.argmin(np.where(index <= new_j[:, None], cost_lo, np.inf), axis=1)
        if np.array_equal(new_i, i) and np.array_equal(new_j, j):
            break
        i, j = new_i, new_j
    return g_lo + edges[rows, i], g_lo + edges[rows, j]


@dataclasses.dataclass(frozen=True)
class _Tails:
    """Exponential tails fitted per column above ``u_hi`` and below ``u_lo``:
    ``count`` samples lie beyond each threshold, at a mean distance ``e``."""

    count: int
    u_lo: np.ndarray
    e_lo: np.ndarray
    u_hi: np.ndarray
    e_hi: np.ndarray


def _exponential_tails(samples_t: np.ndarray) -> _Tails | None:
    """Peaks over threshold: the ``TAIL_SAMPLES`` largest (smallest) samples
    of each column, as exponential excesses over the next one. An exponential
    tail is at least as heavy as a Gaussian's, so windows err towards holding
    more; ``None`` with too few samples to fit (fewer than 8 per tail)."""
    n = samples_t.shape[1]
    count = min(TAIL_SAMPLES, (n - 1) // 8)
    if count < 1:
        return None
    # Sorted (not partitioned): the tails' sums then run in one canonical order.
    part = np.sort(samples_t, axis=1).astype(np.float64)
    u_lo, u_hi = part[:, count], part[:, n - count - 1]
    e_lo = np.maximum(u_lo - part[:, :count].mean(axis=1), 0.0)
    e_hi = np.maximum(part[:, n - count:].mean(axis=1) - u_hi, 0.0)
    return _Tails(count, u_lo, e_lo, u_hi, e_hi)


def _tail_clip(beyond: np.ndarray, count: int, e: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Clipping error of ``count`` exponential excesses of mean ``e`` over a
    threshold, for window ends ``beyond`` the threshold (negative: inside it):
    ``count * E[(X - beyond)_+ ** 2]`` with ``X ~ Exp(e)``, which is
    ``2 e**2 exp(-beyond / e)`` outside.

    ``beyond`` (C, E): each row a column's window ends, increasing by
    ``step[c]``; ``e``, ``step`` (C,). Outside, the exponential is evaluated
    once per row, at its first end past the threshold, and carried along by
    the factor ``exp(-step / e)`` (a running product: one ``exp`` per column
    instead of one per end; within ~E ulps of evaluating each)."""
    rows, ends = beyond.shape
    outside = beyond > 0
    first = np.argmax(outside, axis=1)  # where each row's outside run starts
    safe = np.where(e > 0, e, 1.0)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        base = np.exp(-beyond[np.arange(rows), first] / safe)
        decay = np.exp(-step / safe)
        index = np.arange(ends)
        factor = np.where(index < first[:, None], 1.0,
                          np.where(index == first[:, None], base[:, None], decay[:, None]))
        tail = 2 * e[:, None] ** 2 * np.cumprod(factor, axis=1)
    tail = np.where(e[:, None] > 0, tail, 0.0)
    e = e[:, None]
    inside = 2 * e**2 - 2 * e * beyond + beyond**2
    return count * np.where(outside, tail, inside)


def _group_sum(per_column: np.ndarray, groups: np.ndarray, n_groups: int) -> np.ndarray:
    if n_groups == per_column.shape[0] and np.array_equal(groups, np.arange(n_groups)):
        return per_column
    out = np.zeros((n_groups, per_column.shape[1]))
    np.add.at(out, groups, per_column)
    return out
