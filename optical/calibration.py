"""Calibration from example inputs: static input ranges and ADC windows.

A hardware mapping fixes its ranges once, from a batch of representative
inputs, not per call. This module turns a calibration batch ``(n, K)`` into

- a static input full scale: a percentile of the inputs' absolute values;
- the ADC window of every (K-tile, ADC rail, column) -- or of every tile --
  that minimises the expected squared conversion error, quantisation and
  clipping together, over the readouts those inputs produce.

The readouts are noise-free GEMMs of the normalised calibration inputs with
the programmed transmissions (at most ``calibration.max_tokens`` tokens),
widened by the analytic readout noise (shot, dark, read, RIN), so the result
does not depend on any noise seed. DAC quantisation of the calibration inputs
is left out (it barely moves a readout's distribution), which keeps a
programmed matrix valid for every ``dac.bits``.
"""

from __future__ import annotations

import math

import numpy as np

from optical._validation import check_float_array
from optical.config import OpticalConfig
from optical.physics import encoding

__all__ = ["check_inputs", "input_range", "mse_windows", "normalise", "readout_windows",
           "subsample"]

#: Bins of a group's readout range; window ends are chosen among the bin edges.
N_BINS = 512

#: Noise below this fraction of a column's readout spread is left out of the
#: window choice (it widens the readout distribution by < 0.2 %).
NEGLIGIBLE_NOISE = 0.05

# Nine-point Gauss-Hermite rule for E f(r + sigma z), z ~ N(0, 1): its nodes
# reach 4.5 sigma, so for pure noise the optimal window lands within ~5 % of
# the Gaussian optimum at 2 to 8 bits (a three-point rule stops at 1.7 sigma).
_HERMITE_NODES, _HERMITE_WEIGHTS = np.polynomial.hermite_e.hermegauss(9)
_HERMITE_WEIGHTS = _HERMITE_WEIGHTS / _HERMITE_WEIGHTS.sum()


def check_inputs(calibration: object, k: int) -> np.ndarray:
    """Validate calibration inputs for a matrix of ``k`` rows; return them as (n, k).

    Raises
    ------
    TypeError
        Not a float32/float64 numpy array.
    ValueError
        Wrong width, no tokens, or NaN / inf entries.
    """
    cal = check_float_array(calibration, "calibration", min_ndim=1)
    if cal.shape[-1] != k:
        raise ValueError(f"calibration: has {cal.shape[-1]} features (last axis of "
                         f"{cal.shape}) but w has {k} rows")
    cal = cal.reshape(-1, k)
    if cal.shape[0] == 0:
        raise ValueError(f"calibration: shape {calibration.shape} holds no tokens")
    return cal


def subsample(cal: np.ndarray, max_tokens: int) -> np.ndarray:
    """At most ``max_tokens`` rows, evenly spaced (deterministic)."""
    n = cal.shape[0]
    if n <= max_tokens:
        return cal
    return cal[np.linspace(0, n - 1, max_tokens).round().astype(np.int64)]


def input_range(cal: np.ndarray, percentile: float) -> float:
    """Static input full scale: the ``percentile`` of ``|cal|`` (1 if that is 0)."""
    if cal.size == 0:
        return 1.0
    value = float(np.percentile(np.abs(cal), percentile))
    return value if value > 0 else 1.0


def normalise(cal: np.ndarray, config: OpticalConfig, static_range: float | None) -> np.ndarray:
    """Calibration inputs scaled into [-1, 1] as :func:`optical.matmul` scales
    inputs (per token, per tensor, or by the static range with clipping), float64."""
    x = cal.astype(np.float64)
    if static_range is not None:
        return np.clip(x / static_range, -1.0, 1.0)
    if config.dac.scaling == "per_token":
        absmax = np.max(np.abs(x), axis=1, keepdims=True)
    else:
        absmax = np.full((1, 1), np.max(np.abs(x)) if x.size else 0.0)
    return x / np.where(absmax > 0, absmax, 1.0)


def readout_windows(xn: np.ndarray, transmissions: np.ndarray, tiling, rails: np.ndarray,
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
    """
    bits = config.adc.bits
    p = config.source.photons_per_mac
    det = config.detector
    rin2 = config.source.rin_sigma ** 2
    n_adc = rails.shape[0]
    lo = np.empty((tiling.k_tiles, n_adc, tiling.n), dtype=transmissions.dtype)
    hi = np.empty_like(lo)
    for kt in range(tiling.k_tiles):
        ks = tiling.k_slice(kt)
        # Source levels of every pass, stacked: (passes * n, k).
        a = encoding.encode(xn[:, ks], config.encoding.inputs).reshape(-1, ks.stop - ks.start)
        a_mean, a_sq = a.mean(axis=0), np.square(a).mean(axis=0)
        a = a.astype(transmissions.dtype)
        for nt in range(tiling.n_tiles):
            ns = tiling.n_slice(nt)
            t = transmissions[:, ks, ns]
            for e in range(n_adc):
                combined = np.einsum("r,rkn->kn", rails[e].astype(t.dtype), t)
                samples = (a @ combined).astype(np.float64)  # (passes * n, cols)
                noise_var = rin2 * (a_sq @ np.square(combined.astype(np.float64)))
                if math.isfinite(p):
                    detected = np.einsum("k,rkn->rn", a_mean, t.astype(np.float64))
                    noise_var += np.square(rails[e]) @ detected / p
                    noise_var += np.square(rails[e]).sum() * det.dark_electrons / p**2
                    noise_var += det.read_noise_electrons ** 2 / p**2
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
                groups: np.ndarray | None = None,
                n_bins: int = N_BINS) -> tuple[np.ndarray, np.ndarray]:
    """ADC windows that minimise the expected squared conversion error.

    For a window ``[lo, hi]`` the error of one readout ``r`` is the clipping
    error ``(r - hi)**2`` above the window, ``(lo - r)**2`` below, and the
    quantisation error ``kappa * step**2 / 12`` (``step = (hi - lo) / (2**bits - 1)``,
    ``kappa = 4**enob_loss`` for the converter's noise) everywhere. Readout
    noise of standard deviation ``sigma`` is folded in with a nine-point
    Gauss-Hermite rule (left out where it is below ``NEGLIGIBLE_NOISE`` of the
    column's spread). The objective is convex in (lo, hi); the ends are
    chosen among ``n_bins + 1`` evenly spaced edges of each group's range by
    alternating exact line minimisations.

    Parameters
    ----------
    samples : ndarray, shape (S, C)
        Noise-free readouts: S samples of C columns.
    sigma : ndarray, shape (C,)
        Readout noise standard deviation per column (same unit).
    bits : int
    enob_loss : float, bits
    groups : ndarray of int, shape (C,), optional
        Columns sharing one window (ids ``0..G-1``); default: one per column.
    n_bins : int

    Returns
    -------
    lo, hi : ndarray, shape (G,), float64
    """
    samples = np.asarray(samples, dtype=np.float64)
    sigma = np.broadcast_to(np.asarray(sigma, dtype=np.float64), samples.shape[1:])
    n_cols = samples.shape[1]
    if groups is None:
        groups = np.arange(n_cols)
    groups = np.asarray(groups, dtype=np.int64)
    n_groups = int(groups.max()) + 1 if groups.size else 0
    noisy = bool(np.any(sigma > NEGLIGIBLE_NOISE * samples.std(axis=0)))
    nodes, node_weights = (_HERMITE_NODES, _HERMITE_WEIGHTS) if noisy else ([0.0], [1.0])
    reach = float(np.max(np.abs(nodes)))
    col_lo = samples.min(axis=0) - reach * sigma
    col_hi = samples.max(axis=0) + reach * sigma
    g_lo = np.full(n_groups, np.inf)
    g_hi = np.full(n_groups, -np.inf)
    np.minimum.at(g_lo, groups, col_lo)
    np.maximum.at(g_hi, groups, col_hi)
    width = (g_hi - g_lo) / n_bins
    safe_width = np.where(width > 0, width, 1.0)

    # Per-bin weight, first and second moments about the group's lower end.
    s0 = np.zeros(n_groups * n_bins)
    s1 = np.zeros_like(s0)
    s2 = np.zeros_like(s0)
    offset = groups * n_bins
    for node, weight in zip(nodes, node_weights, strict=True):
        v = samples + node * sigma - g_lo[groups]
        b = np.clip((v / safe_width[groups]).astype(np.int64), 0, n_bins - 1) + offset
        s0 += weight * np.bincount(b.ravel(), minlength=s0.size)
        s1 += np.bincount(b.ravel(), weights=(weight * v).ravel(), minlength=s0.size)
        s2 += np.bincount(b.ravel(), weights=(weight * v * v).ravel(), minlength=s0.size)
    zero = np.zeros((n_groups, 1))
    c0, c1, c2 = (np.concatenate([zero, np.cumsum(s.reshape(n_groups, n_bins), axis=1)], axis=1)
                  for s in (s0, s1, s2))
    t0, t1, t2 = c0[:, -1:], c1[:, -1:], c2[:, -1:]
    edges = np.arange(n_bins + 1) * width[:, None]  # (G, B + 1), relative to g_lo
    # Every sample in the bins below edge i lies below it, and above edge j above it.
    clip_lo = c2 - 2 * edges * c1 + edges**2 * c0
    clip_hi = (t2 - c2) - 2 * edges * (t1 - c1) + edges**2 * (t0 - c0)
    quant = t0 * 4.0**enob_loss / (12.0 * ((1 << bits) - 1) ** 2)  # times (hi - lo)**2

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
