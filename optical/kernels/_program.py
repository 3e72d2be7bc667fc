"""Private numba kernels of :func:`optical.program`: weight loading (each
K-tile's column absolute maxima and the division by the scales, rows gathered
or read transposed; called by ``optical.quant._load`` for every program) and, for the
lens physics, the lens model applied to a mask, its pre-distortion, and the
mask as loaded, fused tile by tile.

The lens kernels are called only by :func:`optical.quant._mask`
(:mod:`optical.physics.crosstalk`), on arguments it has checked. The numpy
code stays the readable truth: :func:`optical.physics.crosstalk.effective_transmissions`
(the lens map), :func:`optical.compensation.pre_distort` (projected Jacobi,
tile by tile), :func:`optical.physics.converters.quantize_levels` and
``transmission``, :func:`optical.physics.encoding.decode`. These kernels do
the same floating-point operations in the same order on every element --
no fast-math, so no reassociation and no fused multiply-adds -- and agree
with them to the bit (up to the sign of a zero).

What they save is memory traffic: the reference builds every rail of the
whole matrix several times per Jacobi step; here each tile is solved on its
own (light does not cross tile edges) one physical mask row at a time, the
input coupling through a ring of ``2 r_in + 1`` rows, the iterate in a
tile-sized scratch, and the weights the digital side keeps overwrite the
normalised weights they come from. Tiles run in parallel (``prange``); each
is serial, so the result does not depend on the number of threads.

Mask layout within a tile (as in ``_mask_apply.apply``): rails interleaved
along a physical row (column ``rails * n + rail``), every tile lit from the
core's first physical column, zero light outside the tile.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from optical import _memory
from optical._numba_cache import can_cache, serialise
from optical._numba_threads import guarded  # (also: passive OpenMP waits)
from optical.physics import converters

_CACHE = can_cache(__file__)  # False (with a warning) where nothing can be written

_SERIAL = {"cache": _CACHE, "error_model": "numpy", "nogil": True}
_PARALLEL = {"cache": _CACHE, "error_model": "numpy", "nogil": True, "parallel": True}


@nb.njit(inline="always", error_model="numpy")
def _clip(a, lo, hi):
    """numpy's clip of a non-NaN value: ``min(max(a, lo), hi)``."""
    a = a if a > lo else lo
    return a if a < hi else hi


@nb.njit(inline="always", error_model="numpy")
def _pos(a, zero):
    """numpy's ``maximum(a, 0)`` of a non-NaN value."""
    return a if a >= zero else zero


@nb.njit(**_SERIAL)
def _row_light(t_row, s, coef, radius, g_lag, g_d0, g_d1, g_w, v, pairs, q_row):
    """Output form of one physical row: ``Q[m] = sum M[d, d'] v[m+d] v[m+d']``
    with ``v = |e| sqrt(t)``, evaluated group by group as ``_mask_apply.output_form``
    does (group ``g`` adds ``pair_lag[m + d0] (+ pair_lag[m + d1])`` times its
    weight; ``g_d1 < -radius``: a group of one shift), so that every element
    sees the same sum in the same order. ``v`` and ``pairs`` are scratch rows
    of ``W + 2 radius`` whose ends stay zero. (Inner loops index views from 0:
    an offset index costs numba a negative-index check that stops SIMD.)"""
    width = t_row.size
    if radius == 0:  # Q = (|e|^2 M00) t
        for m in range(width):
            q_row[m] = t_row[m] * coef[m]
        return
    body = v[radius:radius + width]
    for m in range(width):
        body[m] = np.sqrt(t_row[m]) * s[m]
    span = width + 2 * radius
    for lag in range(2 * radius + 1):
        pair, ahead = pairs[lag], v[lag:]
        for j in range(span - lag):
            pair[j] = v[j] * ahead[j]
    for g in range(g_w.size):
        w = g_w[g]
        a0 = radius + g_d0[g]
        p0 = pairs[g_lag[g], a0:a0 + width]
        if g_d1[g] < -radius:
            if g == 0:
                for m in range(width):
                    q_row[m] = p0[m] * w
            else:
                for m in range(width):
                    q_row[m] = q_row[m] + p0[m] * w
        else:
            a1 = radius + g_d1[g]
            p1 = pairs[g_lag[g], a1:a1 + width]
            if g == 0:
                for m in range(width):
                    q_row[m] = (p0[m] + p1[m]) * w
            else:
                for m in range(width):
                    q_row[m] = q_row[m] + (p0[m] + p1[m]) * w


@nb.njit(**_SERIAL)
def _row_coupling(ring, i, rows, row_d, row_w, out):
    """Input coupling of tile row ``i``: ``T[i] = c0 Q[i] + sum_d c_d Q[i + d]``
    over the tile's rows (taps in ``_mask_apply.taps`` order, the centre first)."""
    n_ring = ring.shape[0]
    centre = ring[i % n_ring]
    c0 = row_w[0]
    for m in range(out.size):
        out[m] = centre[m] * c0
    for tap in range(1, row_w.size):
        j = i + row_d[tap]
        if 0 <= j < rows:
            q = ring[j % n_ring]
            w = row_w[tap]
            for m in range(out.size):
                out[m] = out[m] + q[m] * w


@nb.njit(**_SERIAL)
def _iterate_row(xr, split, t_min, zero, t_row):
    """Physical transmissions ``t_row`` (rails interleaved) of a row of the iterate
    (``compensation.pre_distort``'s mask)."""
    if split:
        for n in range(xr.size):
            d = xr[n]
            t_row[2 * n] = t_min + _pos(d, zero)
            t_row[2 * n + 1] = t_min + _pos(-d, zero)
    else:
        for n in range(xr.size):
            t_row[n] = xr[n]


@nb.njit(**_SERIAL)
def _mask_row(xr, vr, split, compensate, top, consts, levels, t_row):
    """Quantised mask levels and physical transmissions, rails interleaved
    (``levels``, ``t_row``: cols * rails), of one row of a tile: from the
    pre-distorted iterate ``xr`` (``compensate``) or by encoding the
    normalised weights ``vr``. (Branch-free inner loops over flat rows, so
    that they vectorise.)"""
    t_min, span, zero, one, two = consts[0], consts[1], consts[3], consts[4], consts[5]
    cols = xr.size
    if compensate and split:  # (mask(d) - t_min) / span
        for n in range(cols):
            d = xr[n]
            levels[2 * n] = ((t_min + _pos(d, zero)) - t_min) / span
            levels[2 * n + 1] = ((t_min + _pos(-d, zero)) - t_min) / span
    elif compensate:
        for n in range(cols):
            levels[n] = (xr[n] - t_min) / span
    elif split:  # encoding.encode
        for n in range(cols):
            w = vr[n]
            levels[2 * n] = _pos(w, zero)
            levels[2 * n + 1] = _pos(-w, zero)
    else:
        for n in range(cols):
            levels[n] = (vr[n] + one) / two
    if top != zero:  # converters.quantize_levels
        for m in range(t_row.size):
            levels[m] = np.rint(_clip(levels[m], zero, one) * top) / top
    for m in range(t_row.size):  # converters.transmission
        t_row[m] = t_min + span * levels[m]


@nb.njit(**_SERIAL)
def _decode(levels, split, zero, one, two, out):
    """``encoding.decode`` of one row's levels (rails interleaved)."""
    if split:
        for n in range(out.size):
            out[n] = (levels[2 * n] + (-levels[2 * n + 1])) + zero
    else:
        for n in range(out.size):
            out[n] = two * levels[n] + (-one)


@nb.njit(**_SERIAL)
def _jacobi_row(xr, vr, gr, d0, d1, eff, split, t_min, span, one, two, lo, hi, tol):
    """One projected Jacobi step of a row of the iterate, in place (each value
    needs only its own old value and the light of the old row, ``eff``).
    Returns how many values moved by ``tol`` or more: the reference's
    ``max |moved - x| < tol`` is "none did"."""
    busy = 0
    if split:
        for n in range(xr.size):
            d = xr[n]
            target = vr[n] * gr[n] * span
            step = (target - (eff[2 * n] - eff[2 * n + 1])) / (d0[n] if d >= 0 else d1[n])
            moved = _clip(d + step, lo, hi)
            busy += 0 if abs(moved - d) < tol else 1
            xr[n] = moved
    else:
        for n in range(xr.size):
            d = xr[n]
            target = t_min + span * (vr[n] * gr[n] + one) / two
            moved = _clip(d + (target - eff[n]) / d0[n], lo, hi)
            busy += 0 if abs(moved - d) < tol else 1
            xr[n] = moved
    return busy


@nb.njit(**_SERIAL)
def _tile(v, gain, kt, k0, k1, n0, n1, rails, diag, s, coef, radius, g_lag, g_d0, g_d1, g_w,
          row_d, row_w, consts, tol, max_iter, top, split, compensate, transmissions):
    """Program one tile; the weights replace ``v`` on the tile. Returns the
    Jacobi steps it took (0 uncompensated)."""
    dtype = v.dtype
    rows, cols = k1 - k0, n1 - n0
    width = rails * cols
    t_min, span, span_decode, zero, one, two = (consts[0], consts[1], consts[2], consts[3],
                                                consts[4], consts[5])
    reach = 0
    for tap in range(1, row_d.size):
        reach = max(reach, abs(row_d[tap]))
    n_ring = 2 * reach + 1
    ring = np.zeros((n_ring, width), dtype=dtype)
    vbuf = np.zeros(width + 2 * radius, dtype=dtype)
    pairs = np.zeros((2 * radius + 1, width + 2 * radius), dtype=dtype)
    t_row = np.empty(width, dtype=dtype)  # one physical row, rails interleaved
    levels = np.empty(width, dtype=dtype)
    eff = np.empty(width, dtype=dtype)
    s = s[:width]
    gr = gain[kt, n0:n1] if compensate else gain[0, :0]
    d0 = diag[0, n0:n1] if compensate else diag[0, :0]
    d1 = diag[rails - 1, n0:n1] if compensate else diag[0, :0]
    x = np.empty((rows if compensate else 1, cols), dtype=dtype)  # the iterate, tile rows
    steps = 0
    if compensate:
        lo, hi = (-span, span) if split else (t_min, one)
        for i in range(rows):
            xr, vr = x[i], v[k0 + i, n0:n1]
            for n in range(cols):
                if split:
                    target = vr[n] * gr[n] * span
                else:
                    target = t_min + span * (vr[n] * gr[n] + one) / two
                xr[n] = _clip(target / d0[n], lo, hi)
        for _ in range(max_iter):
            steps += 1
            busy = 0
            for j in range(min(reach, rows)):
                _iterate_row(x[j], split, t_min, zero, t_row)
                _row_light(t_row, s, coef, radius, g_lag, g_d0, g_d1, g_w, vbuf, pairs,
                           ring[j % n_ring])
            for i in range(rows):
                j = i + reach
                if j < rows:
                    _iterate_row(x[j], split, t_min, zero, t_row)
                    _row_light(t_row, s, coef, radius, g_lag, g_d0, g_d1, g_w, vbuf, pairs,
                               ring[j % n_ring])
                _row_coupling(ring, i, rows, row_d, row_w, eff)
                busy += _jacobi_row(x[i], v[k0 + i, n0:n1], gr, d0, d1, eff, split, t_min,
                                    span, one, two, lo, hi, tol)
            if busy == 0:
                break
    # The mask as loaded: quantised levels, transmissions, what the light sees;
    # row i's weights overwrite v[i] once no row ahead needs it.
    for j in range(min(reach, rows)):
        _mask_row(x[j if compensate else 0], v[k0 + j, n0:n1], split, compensate, top, consts,
                  levels, t_row)
        _row_light(t_row, s, coef, radius, g_lag, g_d0, g_d1, g_w, vbuf, pairs,
                   ring[j % n_ring])
    for i in range(rows):
        j = i + reach
        if j < rows:
            _mask_row(x[j if compensate else 0], v[k0 + j, n0:n1], split, compensate, top,
                      consts, levels, t_row)
            _row_light(t_row, s, coef, radius, g_lag, g_d0, g_d1, g_w, vbuf, pairs,
                       ring[j % n_ring])
        r = k0 + i
        weights = v[r, n0:n1]
        if not compensate:  # the digital side decodes the quantised levels
            _mask_row(x[0], weights, split, compensate, top, consts, levels, t_row)
            _decode(levels, split, zero, one, two, weights)
        _row_coupling(ring, i, rows, row_d, row_w, eff)
        for rail in range(rails):
            tr = transmissions[rail, r, n0:n1]
            for n in range(cols):
                tr[n] = eff[rails * n + rail]
        if compensate:  # ... or the effective tile, which it knows exactly
            for m in range(width):
                eff[m] = (eff[m] - t_min) / span_decode
            _decode(eff, split, zero, one, two, weights)
    return steps


@guarded
@nb.njit(**_PARALLEL)
def program_tiles(v, gain, k_bounds, n_bounds, rails, diag, s, coef, radius, g_lag, g_d0, g_d1,
                  g_w, row_d, row_w, consts, tol, max_iter, top, split, compensate,
                  transmissions, steps):
    """Program every (K-tile, N-tile) of the mask, tiles in parallel.

    v : (K, N) normalised weights, replaced by the weights the digital side
    believes the light applies; gain : (k_tiles, N) compensation gain.
    k_bounds, n_bounds : (tiles, 2) int64 start and stop of each K- and N-tile.
    diag : (rails, N) self-coupling of each pixel; s : (rails * tile_n,) |e|
    of the physical columns; coef : ``s * s * M00`` (radius 0 only).
    g_* : the output form's groups (``_mask_apply.output_taps``, flattened);
    row_d, row_w : the input coupling's taps (``_mask_apply.taps``).
    consts : dtype ``(t_min, 1 - t_min, dtype(1 - t_min in float64), 0, 1, 2)``.
    top : dtype ``2**mask.bits - 1``, 0 for a continuous mask.
    transmissions : (rails, K, N), out;
    steps : (k_tiles * n_tiles,) int64, out: Jacobi steps of each tile.
    """
    n_tiles = n_bounds.shape[0]
    for t in nb.prange(k_bounds.shape[0] * n_tiles):
        kt, nt = t // n_tiles, t % n_tiles
        steps[t] = _tile(v, gain, kt, k_bounds[kt, 0], k_bounds[kt, 1], n_bounds[nt, 0],
                         n_bounds[nt, 1], rails, diag, s, coef, radius, g_lag, g_d0, g_d1, g_w,
                         row_d, row_w, consts, tol, max_iter, top, split, compensate,
                         transmissions)


def _operand(a: np.ndarray, dtype) -> np.ndarray:
    """C-contiguous and writable, as the kernels were compiled for (a copy only if needed)."""
    return np.require(a, dtype, ("C", "W"))


def lens_mask(v: np.ndarray, gain: np.ndarray | None, diag: np.ndarray | None, tiling, kern,
              min_transmission: float, scheme: str, bits: int | None, *, tol: float,
              max_iter: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mask as loaded through the lens physics, fused tile by tile.

    Parameters
    ----------
    v : ndarray, shape (K, N), float32 or float64
        Normalised weights in [-1, 1]; overwritten with the weights (below)
        when C-contiguous and writable (pass a copy to keep them).
    gain : ndarray, shape (k_tiles, N), or None
        Compensation gain (``compensation.gain``); ``None``: no pre-distortion.
    diag : ndarray, broadcastable to (rails, 1, N), or None
        Each pixel's self-coupling (``_LensOptics.diagonal``); with ``gain``.
    tiling : optical.quant.Tiling
    kern : optical.physics.crosstalk.Kernels
    min_transmission : float
    scheme : {"split", "offset"}
    bits : int or None
        Mask resolution.
    tol, max_iter
        As :func:`optical.compensation.pre_distort`.

    Returns
    -------
    transmissions : ndarray, shape (rails, K, N)
        What the light sees.
    weights : ndarray, shape (K, N)
        What the digital side believes it applies: the decoded quantised
        levels, or with compensation the decoded effective transmissions.
    steps : ndarray of int64, shape (k_tiles * n_tiles,)
        Jacobi steps each tile took (0 without compensation).
    """
    from optical.physics import _mask_apply

    dtype = v.dtype
    rails, radius = kern.rails, kern.radius
    k, n = v.shape
    compensate = gain is not None
    scalar = dtype.type
    t_min = scalar(min_transmission)
    consts = np.array([t_min, 1 - t_min, scalar(1 - min_transmission), 0, 1, 2], dtype=dtype)
    top = scalar(converters.top_code(bits))
    s = np.abs(kern.envelope_field).astype(dtype)[:rails * tiling.tile_n]
    lags = _mask_apply.output_taps(np.real(kern.output_mutual), dtype)
    g_lag, g_d0, g_d1, g_w = [], [], [], []
    for lag, groups in enumerate(lags):
        for shifts, weight in groups:
            g_lag.append(lag)
            g_d0.append(shifts[0])
            g_d1.append(shifts[1] if len(shifts) == 2 else -radius - 1)
            g_w.append(weight)
    coef = s * s * lags[0][0][1] if radius == 0 else np.zeros(0, dtype=dtype)
    taps = _mask_apply.taps(kern.input_coupling, dtype)
    row_d = np.array([d for d, _ in taps], dtype=np.int64)
    row_w = np.array([w for _, w in taps], dtype=dtype)
    if compensate:
        gain = _operand(gain, dtype)
        diag = _operand(np.broadcast_to(diag, (rails, 1, n))[:, 0], dtype)
    else:
        gain = np.zeros((1, 1), dtype=dtype)
        diag = np.zeros((1, 1), dtype=dtype)
    k_bounds = np.array([(s_.start, s_.stop) for s_ in map(tiling.k_slice,
                                                            range(tiling.k_tiles))],
                        dtype=np.int64).reshape(-1, 2)
    n_bounds = np.array([(s_.start, s_.stop) for s_ in map(tiling.n_slice,
                                                            range(tiling.n_tiles))],
                        dtype=np.int64).reshape(-1, 2)
    transmissions = _memory.empty((rails, k, n), dtype)
    weights = _operand(v, dtype)
    steps = np.zeros(tiling.k_tiles * tiling.n_tiles, dtype=np.int64)
    program_tiles(weights, gain, k_bounds, n_bounds, rails, diag, s, coef,
                  radius, np.array(g_lag, dtype=np.int64), np.array(g_d0, dtype=np.int64),
                  np.array(g_d1, dtype=np.int64), np.array(g_w, dtype=dtype), row_d, row_w,
                  consts, float(tol), int(max_iter), top, scheme == "split", compensate,
                  transmissions, steps)
    return transmissions, weights, steps


# --------------------------------------------------------------------------- #
# Loading the weights: row selection, per-K-tile abs-max, normalisation
# --------------------------------------------------------------------------- #


@nb.njit(**_SERIAL, fastmath={"nnan", "ninf", "nsz"})
def _absmax(a):
    """``max |a|`` of finite values, 0 for none (exact in any order, so the
    flags only let the reduction vectorise)."""
    m = a.dtype.type(0)
    for j in range(a.size):
        x = abs(a[j])
        m = x if x > m else m
    return m


@guarded
@nb.njit(**_PARALLEL)
def absmax_c(w, rows, k_bounds, out):
    """``out[kt, n] = max |w[rows[i], n]|`` over the rows ``i`` of K-tile ``kt``
    (``w`` (K_all, N) row-major)."""
    n = w.shape[1]
    chunk = 2048
    n_chunks = -(-n // chunk)
    for task in nb.prange(k_bounds.shape[0] * n_chunks):
        kt, c = task // n_chunks, task % n_chunks
        lo, hi = c * chunk, min(c * chunk + chunk, n)
        o = out[kt, lo:hi]
        o[:] = 0
        for i in range(k_bounds[kt, 0], k_bounds[kt, 1]):
            row = w[rows[i], lo:hi]
            for j in range(hi - lo):
                x = abs(row[j])
                o[j] = x if x > o[j] else o[j]


@guarded
@nb.njit(**_PARALLEL)
def absmax_t(src, rows, k_bounds, out):
    """:func:`absmax_c` of ``w = src.T`` (``src`` (N, K_all) row-major: a
    weight stored [out, in], as Hugging Face stores them)."""
    for n in nb.prange(src.shape[0]):
        line = src[n]
        for kt in range(k_bounds.shape[0]):
            m = src.dtype.type(0)
            a, b = k_bounds[kt, 0], k_bounds[kt, 1]
            if rows[b - 1] - rows[a] == b - 1 - a:  # contiguous rows: one slice
                m = _absmax(line[rows[a]:rows[a] + b - a])
            else:
                for i in range(a, b):
                    x = abs(line[rows[i]])
                    m = x if x > m else m
            out[kt, n] = m


@guarded
@nb.njit(**_PARALLEL)
def divide_c(w, rows, tile_of_row, scale, v):
    """``v[i, n] = w[rows[i], n] / scale[tile_of_row[i], n]``."""
    for i in nb.prange(v.shape[0]):
        src, s, dst = w[rows[i]], scale[tile_of_row[i]], v[i]
        for n in range(dst.size):
            dst[n] = src[n] / s[n]


@guarded
@nb.njit(**_PARALLEL)
def divide_t(src, rows, tile_of_row, scale, v):
    """:func:`divide_c` of ``w = src.T``, in cache-sized blocks (a transpose)."""
    k, n = v.shape
    block = 64
    n_blocks = -(-n // block)
    for task in nb.prange(-(-k // block) * n_blocks):
        i0, n0 = (task // n_blocks) * block, (task % n_blocks) * block
        i1, n1 = min(i0 + block, k), min(n0 + block, n)
        for i in range(i0, i1):
            r, s, dst = rows[i], scale[tile_of_row[i]], v[i]
            for j in range(n0, n1):
                dst[j] = src[j, r] / s[j]


serialise(globals())  # processes filling the kernel cache at once: optical._numba_cache
