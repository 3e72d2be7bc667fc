"""Private numba kernels of the calibration: :func:`readout_tile`, one pass
over a mask tile for what :func:`optical.calibration.readout_windows` needs of
it, and the MSE window search of :func:`optical.calibration.mse_windows`, one
group of columns at a time.

The search is called only by ``mse_windows``, which validates the arguments
and computes everything that takes a pass over all columns (ranges, fitted
tails, bin widths). The numpy code there is the readable truth; the kernel does the
same floating-point operations in the same order for each group -- its
histograms, their Gauss-Hermite spreading, cumulative moments, clipping
costs and alternating line minimisations -- and agrees with it to the bit,
with one exception: the tail model's ``exp`` (two per column and side, the
rest a running product) is libm's here and numpy's own SIMD routine there,
which differ in the last place for a few percent of
arguments (numpy's differs between machines, too). Where such a difference
tips an argmin between two edges of equal cost to the last bits, the window
moves by one bin (1 / ``n_bins`` of the group's range) at the same cost.

Groups (and ``readout_tile``'s column chunks) run in parallel (``prange``);
each is serial, so the result does not depend on the number of threads.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from optical._numba_cache import can_cache, serialise
from optical._numba_threads import guarded  # (also: passive OpenMP waits)
from optical.physics import converters

_CACHE = can_cache(__file__)  # False (with a warning) where nothing can be written

_SERIAL = {"cache": _CACHE, "error_model": "numpy", "nogil": True}
_PARALLEL = {"cache": _CACHE, "error_model": "numpy", "nogil": True, "parallel": True}


@nb.njit(inline="always", error_model="numpy")
def _tail_clip(g_lo, width, u, e, count, upper, out):
    """``calibration._tail_clip`` of one column's tail at every window end
    ``g_lo + k width``, added to ``out[k]``: the upper tail (ends past ``u``
    above it) or the lower one (below it, walked from the top end down, as
    the reference reverses its rows); the exponential once, at the first end
    outside, then the running product with ``exp(-width / e)``."""
    n = out.size
    decay = np.exp(-width / e) if e > 0.0 else 0.0
    p = 0.0
    started = False
    for i in range(n):
        k = i if upper else n - 1 - i
        absolute = g_lo + np.float64(k) * width
        beyond = absolute - u if upper else u - absolute
        if beyond > 0.0:
            if not e > 0.0:
                out[k] += count * 0.0
                continue
            if started:
                p = p * decay
            else:
                p = np.exp(-beyond / e)
                started = True
            out[k] += count * (2.0 * (e * e) * p)
        else:
            out[k] += count * (2.0 * (e * e) - 2.0 * e * beyond + beyond * beyond)


@nb.njit(inline="always", error_model="numpy")
def _argmin_from(cost, quant, edges, anchor, first, last):
    """First index of the least ``cost[e] + quant (edges[e] - anchor)**2`` over
    ``first <= e <= last`` (numpy's argmin with the rest masked as +inf)."""
    best_e = 0
    best = np.inf
    if first == 0:
        d = edges[0] - anchor
        best = cost[0] + quant * (d * d)
    for e in range(1, edges.size):
        if first <= e <= last:
            d = edges[e] - anchor
            value = cost[e] + quant * (d * d)
            if value < best:
                best, best_e = value, e
    return best_e


@nb.njit(**_SERIAL)
def _group(g, samples_t, sigma, g_lo, width, inv_width, order, starts, nodes, node_weights,
           tails, count, u_lo, e_lo, u_hi, e_hi, kappa, denom, n_bins, lo_out, hi_out):
    n_samples = samples_t.shape[1]
    n_nodes = nodes.size
    dt = samples_t.dtype.type
    lo_s, inv_s = dt(g_lo[g]), dt(inv_width[g])
    h0 = np.empty(n_bins)
    h1 = np.empty(n_bins)
    h2 = np.empty(n_bins)
    spread = np.zeros((n_nodes, 3, n_bins))
    for idx in range(starts[g], starts[g + 1]):
        c = order[idx]
        h0[:] = 0.0
        h1[:] = 0.0
        h2[:] = 0.0
        row = samples_t[c]
        for s in range(n_samples):
            v = row[s] - lo_s
            b = min(max(np.int64(v * inv_s), 0), n_bins - 1)
            vd = np.float64(v)
            h0[b] += 1.0
            h1[b] += vd
            h2[b] += vd * vd
        # Each Gauss-Hermite node shifts the column by node * sigma (see mse_windows).
        for k in range(n_nodes):
            shift = nodes[k] * sigma[c]
            moved = np.int64(np.rint(shift * inv_width[g]))
            dest = spread[k]
            # Bins pushed below the first bin, the bins that land inside, those
            # pushed past the last: each destination still gets its bins in
            # ascending order, and the inside run is a plain shifted add.
            low = min(max(-moved, 0), n_bins)
            high = min(max(n_bins - moved, low), n_bins)
            for b in range(low):
                dest[0, 0] += h0[b]
                dest[1, 0] += h1[b] + shift * h0[b]
                dest[2, 0] += h2[b] + 2.0 * shift * h1[b] + shift * shift * h0[b]
            d0 = dest[0, low + moved:high + moved]
            d1 = dest[1, low + moved:high + moved]
            d2 = dest[2, low + moved:high + moved]
            a0, a1, a2 = h0[low:high], h1[low:high], h2[low:high]
            for b in range(high - low):
                d0[b] += a0[b]
                d1[b] += a1[b] + shift * a0[b]
                d2[b] += a2[b] + 2.0 * shift * a1[b] + shift * shift * a0[b]
            for b in range(high, n_bins):
                dest[0, n_bins - 1] += h0[b]
                dest[1, n_bins - 1] += h1[b] + shift * h0[b]
                dest[2, n_bins - 1] += h2[b] + 2.0 * shift * h1[b] + shift * shift * h0[b]
    s = np.zeros((3, n_bins))
    for k in range(n_nodes):
        for m in range(3):
            for b in range(n_bins):
                s[m, b] = s[m, b] + node_weights[k] * spread[k, m, b]
    c0 = np.zeros(n_bins + 1)
    c1 = np.zeros(n_bins + 1)
    c2 = np.zeros(n_bins + 1)
    c0[1], c1[1], c2[1] = s[0, 0], s[1, 0], s[2, 0]
    for b in range(1, n_bins):
        c0[b + 1] = c0[b] + s[0, b]
        c1[b + 1] = c1[b] + s[1, b]
        c2[b + 1] = c2[b] + s[2, b]
    t0, t1, t2 = c0[n_bins], c1[n_bins], c2[n_bins]
    edges = np.empty(n_bins + 1)
    clip_lo = np.empty(n_bins + 1)
    clip_hi = np.empty(n_bins + 1)
    for e in range(n_bins + 1):
        ed = np.float64(e) * width[g]
        edges[e] = ed
        clip_lo[e] = c2[e] - 2.0 * ed * c1[e] + ed * ed * c0[e]
        clip_hi[e] = (t2 - c2[e]) - 2.0 * ed * (t1 - c1[e]) + ed * ed * (t0 - c0[e])
    if tails:
        # Where the samples run out, the fitted tails still clip (the group's
        # columns added at each end in order, as the reference sums them).
        model_hi = np.zeros(n_bins + 1)
        model_lo = np.zeros(n_bins + 1)
        for idx in range(starts[g], starts[g + 1]):
            c = order[idx]
            _tail_clip(g_lo[g], width[g], u_hi[c], e_hi[c], count, True, model_hi)
            _tail_clip(g_lo[g], width[g], u_lo[c], e_lo[c], count, False, model_lo)
        for e in range(n_bins + 1):
            clip_hi[e] = clip_hi[e] if clip_hi[e] >= model_hi[e] else model_hi[e]
            clip_lo[e] = clip_lo[e] if clip_lo[e] >= model_lo[e] else model_lo[e]
    quant = t0 * kappa / denom
    i, j = 0, n_bins
    for _ in range(4 * n_bins):
        new_j = _argmin_from(clip_hi, quant, edges, edges[i], i, n_bins)
        hi_edge = edges[new_j]
        # cost_lo = clip_lo + quant (hi_edge - edges)**2: the same square.
        new_i = _argmin_lo(clip_lo, quant, edges, hi_edge, new_j)
        if new_i == i and new_j == j:
            break
        i, j = new_i, new_j
    lo_out[g] = g_lo[g] + edges[i]
    hi_out[g] = g_lo[g] + edges[j]


@nb.njit(inline="always", error_model="numpy")
def _argmin_lo(cost, quant, edges, anchor, last):
    """First index of the least ``cost[e] + quant (anchor - edges[e])**2`` over ``e <= last``."""
    d = anchor - edges[0]
    best = cost[0] + quant * (d * d)
    best_e = 0
    for e in range(1, last + 1):
        d = anchor - edges[e]
        value = cost[e] + quant * (d * d)
        if value < best:
            best, best_e = value, e
    return best_e


@guarded
@nb.njit(**_PARALLEL)
def group_windows(samples_t, sigma, g_lo, width, inv_width, order, starts, nodes, node_weights,
                  tails, count, u_lo, e_lo, u_hi, e_hi, kappa, denom, n_bins, lo_out, hi_out):
    """MSE windows of every group (see ``calibration.mse_windows``).

    samples_t : (C, S) samples, column-major; sigma : (C,) float64.
    g_lo, width, inv_width : (G,) float64, each group's range and bin width.
    order, starts : the columns of group ``g`` are ``order[starts[g]:starts[g + 1]]``,
    ascending. nodes, node_weights : the Gauss-Hermite rule (or ``[0], [1]``).
    tails : bool; count, u_lo, e_lo, u_hi, e_hi : the fitted tails per column.
    kappa, denom : the quantisation error is ``t0 kappa / denom (hi - lo)**2``.
    lo_out, hi_out : (G,) float64, out.
    """
    for g in nb.prange(lo_out.size):
        # int64, as the numba kernels' drivers pass it: one compile of _group
        _group(np.int64(g), samples_t, sigma, g_lo, width, inv_width, order, starts, nodes,
               node_weights, tails, count, u_lo, e_lo, u_hi, e_hi, kappa, denom, n_bins, lo_out,
               hi_out)


@guarded
@nb.njit(**_PARALLEL)
def readout_tile(t, k0, k1, n0, n1, rails, a_mean, a_sq, combined, detected, rin):
    """What ``calibration.readout_windows`` needs of one (K-tile, N-tile) of
    the mask, in one pass over it: each ADC rail's transmissions
    ``combined[e] = sum_r rails[e, r] t[r]`` (C-contiguous, for the GEMM of the
    calibration light), the mean detected light per detector rail
    ``detected[r] = a_mean @ t[r]`` and the RIN variance per ADC rail
    ``rin[e] = a_sq @ combined[e]**2`` (float64, rows added in order).

    t : (rails, K, N); rows ``k0:k1``, columns ``n0:n1``; rails : (adc, det)
    float64; a_mean, a_sq : (k1 - k0,) float64; combined : (adc, k1 - k0,
    n1 - n0), out; detected : (det, n1 - n0), rin : (adc, n1 - n0), float64,
    zero on entry. Column chunks run in parallel, rows serially in each.
    """
    cols = n1 - n0
    chunk = 256
    dtype = t.dtype.type
    for task in nb.prange(-(-cols // chunk)):
        c0, c1 = task * chunk, min(task * chunk + chunk, cols)
        for i in range(k1 - k0):
            am, aq = a_mean[i], a_sq[i]
            for r in range(t.shape[0]):
                row = t[r, k0 + i, n0 + c0:n0 + c1]
                det = detected[r, c0:c1]
                for j in range(c1 - c0):
                    det[j] += am * np.float64(row[j])
            for e in range(rails.shape[0]):
                out = combined[e, i, c0:c1]
                out[:] = 0
                for r in range(t.shape[0]):
                    g = rails[e, r]
                    if g == 0:
                        continue
                    row = t[r, k0 + i, n0 + c0:n0 + c1]
                    if g == 1:
                        for j in range(c1 - c0):
                            out[j] = out[j] + row[j]
                    else:
                        gd = dtype(g)
                        for j in range(c1 - c0):
                            out[j] = out[j] + gd * row[j]
                var = rin[e, c0:c1]
                for j in range(c1 - c0):
                    v = np.float64(out[j])
                    var[j] += aq * (v * v)


def windows(samples_t: np.ndarray, sigma: np.ndarray, groups: np.ndarray, n_groups: int,
            g_lo: np.ndarray, width: np.ndarray, inv_width: np.ndarray, nodes, node_weights,
            tails, bits: int, enob_loss: float, n_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Driver: ``mse_windows``'s prepared arguments in, (lo, hi) of every group out."""
    order = np.argsort(groups, kind="stable").astype(np.int64)
    starts = np.searchsorted(groups[order], np.arange(n_groups + 1)).astype(np.int64)
    empty = np.zeros(0)
    if tails is None:
        count, u_lo, e_lo, u_hi, e_hi = 0, empty, empty, empty, empty
    else:
        count, u_lo, e_lo, u_hi, e_hi = (tails.count, tails.u_lo, tails.e_lo, tails.u_hi,
                                         tails.e_hi)
    lo = np.empty(n_groups)
    hi = np.empty(n_groups)

    def f64(a):
        return np.require(a, np.float64, ("C", "W"))

    group_windows(np.require(samples_t, None, ("C", "W")), f64(sigma), f64(g_lo), f64(width),
                  f64(inv_width), order, starts, f64(nodes), f64(node_weights),
                  tails is not None, float(count), f64(u_lo), f64(e_lo), f64(u_hi), f64(e_hi),
                  4.0**enob_loss, 12.0 * converters.top_code(bits) ** 2, int(n_bins), lo, hi)
    return lo, hi



serialise(globals())  # processes filling the kernel cache at once: optical._numba_cache
