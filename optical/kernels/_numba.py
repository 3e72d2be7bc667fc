"""Private numba kernels of the fast path: what happens per readout.

Called only by :mod:`optical.kernels.numba_backend`, which checks and
normalises every argument (contiguous arrays of the working dtype). Each
kernel works on one block of tokens and one (K-tile, N-tile) weight block;
the GEMMs between them run in BLAS or XLA. Each is a serial function of one
token (``_*_token``, compiled once) under a thin ``prange`` driver, which keeps
numba's compile time short. The drivers hand it the loop index as
``np.int64``: numba types a ``prange`` index as int64 where it types the loop
and as uint64 in the parallel function it builds from it, so an index passed
as it is compiles each per-token function twice (a fifth of the kernels' cold
compile). Every random number is a function of its absolute
(seed, index), so the output depends neither on the thread count nor on how
tokens are blocked.

Index layout (the numpy reference's, see docs/ARCHITECTURE.md):
``pass_id = (token * k_tiles + k_tile) * input_passes + pass``; a detector
draw has index ``(pass_id * N + column) * rails + rail``, an ADC-rail draw
``(pass_id * N + column) * adc_rails + rail``, a RIN draw
``(pass_id * n_tiles + n_tile) * tile_k + row``. The fast path's own draws
(one combined Gaussian per ADC readout; RIN) come in Box-Muller pairs: the
pair of counter ``(pass_id * ceil(N / 2) + column // 2) * adc_rails + rail``,
resp. ``(pass_id * n_tiles + n_tile) * ceil(tile_k / 2) + row // 2``, gives
its cosine to the even and its sine to the odd column (row).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from optical._numba_cache import can_cache, dependencies_current, serialise
from optical._numba_threads import guarded  # (also: passive OpenMP waits)
from optical.kernels import _rng_numba as rng

#: SHA-256 (first 16 hex digits) of each module whose numba functions the
#: kernels here compile in. numba checks a cached kernel against its own
#: file only ("cache invalidation fails to recognize changes in symbols
#: defined in a different file", its notes on caching), so an edit there
#: alone would leave the kernels cached from this file running the old
#: code. Recording the digests makes such an edit change this file too;
#: ``tests/test_kernels_numba.py`` fails until they are updated, and until
#: then the kernels here compile without the disk cache (with a warning).
DEPENDENCY_SHA256 = {"_rng_numba.py": "7edaf12f4a370db9"}

# False (with a warning) where nothing can be written, or a dependency changed.
_CACHE = can_cache(__file__) and dependencies_current(__file__, DEPENDENCY_SHA256,
                                                  __loader__)

_SERIAL = {"cache": _CACHE, "error_model": "numpy", "nogil": True}
_PARALLEL = {"cache": _CACHE, "error_model": "numpy", "nogil": True, "parallel": True}


@nb.njit(inline="always", error_model="numpy")
def _pass_id(token, k_tiles, kt, n_in, s):
    return (np.uint64(token) * np.uint64(k_tiles) + np.uint64(kt)) * np.uint64(n_in) \
        + np.uint64(s)


# --------------------------------------------------------------------------- #
# Per weight load: a balanced rail pair in one pass
# --------------------------------------------------------------------------- #


@guarded
@nb.njit(**_PARALLEL)
def balanced_rails(t, k0, k1, chunks, offsets, diff, rowpart, colsum):
    """One K-tile (rows ``k0:k1``) of a balanced rail pair ``t`` (2, K, N), one pass.

    ``chunks`` (C, 4) int64: ``n0, n1, n_tile, tile_start`` of each column
    chunk (chunks never straddle N-tiles). Out: ``diff`` (flat) holds
    ``T+ - T-`` of N-tile ``nt`` as its own C-contiguous (k1 - k0, width)
    block from ``offsets[nt]``; ``colsum`` (N,) float64 the column sums of
    ``T+ + T-``, zero on entry (rows added in order from row ``k0``, as numpy's
    ``(t[0] + t[1]).sum(axis=0, dtype=float64)``); ``rowpart`` (C, k1 - k0)
    float64 each chunk's row sums of both rails. Chunks run in parallel,
    each serially, so nothing depends on the thread count.
    """
    for c in nb.prange(chunks.shape[0]):
        n0, n1, nt, start = chunks[c, 0], chunks[c, 1], chunks[c, 2], chunks[c, 3]
        width = (offsets[nt + 1] - offsets[nt]) // (k1 - k0)
        col = colsum[n0:n1]
        for i in range(k1 - k0):
            plus, minus = t[0, k0 + i, n0:n1], t[1, k0 + i, n0:n1]
            base = offsets[nt] + i * width + (n0 - start)
            out = diff[base:base + (n1 - n0)]
            acc = 0.0
            for j in range(n1 - n0):
                a, b = plus[j], minus[j]
                out[j] = a - b
                total = np.float64(a + b)
                col[j] += total
                acc += np.float64(a) + np.float64(b)
            rowpart[c, i] = acc


# --------------------------------------------------------------------------- #
# Inputs: scale, clip, encode, DAC
# --------------------------------------------------------------------------- #


@nb.njit(**_SERIAL)
def _levels_token(t, x, k0, scale, offset, top, levels, a_sum, left_t, p_low):
    row, s = x[t, k0:k0 + levels.shape[2]], scale[t]
    out0, out1 = levels[0, t], levels[-1, t]
    one = row.dtype.type(1)
    two = row.dtype.type(2)
    zero = row.dtype.type(0)
    if offset:
        for j in range(row.size):
            v = min(max(row[j] / s, -one), one)
            u = (v + one) / two
            if top != zero:
                u = np.rint(min(max(u, zero), one) * top) / top
            out0[j] = u
    else:
        for j in range(row.size):
            v = min(max(row[j] / s, -one), one)
            up = max(v, zero)
            un = max(-v, zero)
            if top != zero:
                up = np.rint(up * top) / top
                un = np.rint(un * top) / top
            out0[j] = up
            out1[j] = un
    n_in, tokens = levels.shape[0], levels.shape[1]
    for r in range(n_in):
        lev = levels[r, t]
        a_sum[r, t] = _sum(lev)
        for q in range(left_t.shape[0]):
            p_low[r * tokens + t, q] = _dot(lev, left_t[q])


# Reductions may be reassociated so that they vectorise: the order of a sum then
# depends on the SIMD width of the machine, not on threads or blocking.
_REDUCE = {**_SERIAL, "fastmath": {"reassoc", "contract"}}


@nb.njit(**_REDUCE)
def _sum(a):
    total = 0.0
    for j in range(a.size):
        total += np.float64(a[j])
    return total


@nb.njit(**_REDUCE)
def _dot(a, b):
    total = 0.0
    for j in range(a.size):
        total += np.float64(a[j]) * b[j]
    return total


@guarded
@nb.njit(**_PARALLEL)
def encode_levels(x, k0, scale, offset, top, levels, a_sum, left_t, p_low):
    """DAC levels of one K-tile of a block of tokens.

    x : (T, K) dtype; the K-tile is columns k0 : k0 + kk. scale : (T,) dtype.
    offset : bool, offset (one rail) or split (two rails) input encoding.
    top : dtype, ``2**bits - 1``, or 0 for an ideal DAC.
    levels : (n_in, T, kk) dtype, out; a_sum : (n_in, T) float64, out.
    left_t : (rank, kk) float64, the low-rank light factors (rank may be 0);
    p_low : (n_in * T, rank) float64, out: ``levels @ left_t.T``.
    """
    for t in nb.prange(x.shape[0]):
        _levels_token(np.int64(t), x, k0, scale, offset, top, levels, a_sum, left_t, p_low)


# --------------------------------------------------------------------------- #
# Sources: relative intensity noise, and the light they put on the mask
# --------------------------------------------------------------------------- #


@nb.njit(**_SERIAL)
def _rin_exact(a, out, key, sigma, base):
    """out = a * max(1 + sigma e, 0), e the reference's normal of index base + row."""
    for j in range(a.size):
        f = max(1.0 + sigma * rng.normal_inline(key, base + np.uint64(j)), 0.0)
        out[j] = a[j] * out.dtype.type(f)


@nb.njit(**_SERIAL)
def _rin_fast(a, out, key, sigma, pair_base):
    """out = a * max(1 + sigma e, 0), rows 2i and 2i + 1 from the pair of counter
    pair_base + i."""
    kk = a.size
    sig = np.float32(sigma)
    one, zero = np.float32(1.0), np.float32(0.0)
    for jp in range(kk // 2):
        c, s = rng.normal_pair32(key, pair_base + np.uint64(jp))
        out[2 * jp] = a[2 * jp] * out.dtype.type(max(one + sig * c, zero))
        out[2 * jp + 1] = a[2 * jp + 1] * out.dtype.type(max(one + sig * s, zero))
    if kk % 2:
        c, s = rng.normal_pair32(key, pair_base + np.uint64(kk // 2))
        out[kk - 1] = a[kk - 1] * out.dtype.type(max(one + sig * c, zero))


@nb.njit(**_SERIAL)
def _light_token(t, levels, out, rowsum, light, key, sigma, exact, t_first, k_tiles, kt, n_tiles,
                 nt, tile_k):
    n_in, tokens, kk = levels.shape
    half = (tile_k + 1) // 2
    for s in range(n_in):
        row = s * tokens + t
        block = _pass_id(t_first + t, k_tiles, kt, n_in, s) * np.uint64(n_tiles) + np.uint64(nt)
        if sigma == 0.0:
            dst, src = out[row], levels[s, t]
            for j in range(kk):
                dst[j] = src[j]
        elif exact:
            _rin_exact(levels[s, t], out[row], key, sigma, block * np.uint64(tile_k))
        else:
            _rin_fast(levels[s, t], out[row], key, sigma, block * np.uint64(half))
        light[row] = _dot(out[row], rowsum)


@guarded
@nb.njit(**_PARALLEL)
def source_light(levels, out, rowsum, light, key, sigma, exact, t_first, k_tiles, kt, n_tiles,
                 nt, tile_k):
    """The light each pass puts on the mask, and how much of it is detected.

    levels : (n_in, T, kk) DAC levels of the K-tile.
    out : (n_in * T, kk) dtype, out: the levels times each source's RIN factor
        (a copy of ``levels`` when ``sigma`` is 0).
    rowsum : (kk,) float64, the summed transmission of every mask row over the
        N-tile's columns and the detector rails; ``light`` (n_in * T,) float64
        gets ``out @ rowsum``, the pass's mean detected light in full-scale MACs.
    """
    for t in nb.prange(levels.shape[1]):
        _light_token(np.int64(t), levels, out, rowsum, light, key, sigma, exact, t_first,
                     k_tiles, kt, n_tiles, nt, tile_k)


# --------------------------------------------------------------------------- #
# Detection and conversion
# --------------------------------------------------------------------------- #


@nb.njit(inline="always", error_model="numpy")
def _adc(value, lo, hi, top):
    """Digitise one readout: (reconstructed value, clipped?). ``top`` 0: ideal."""
    if top == 0.0:
        return value, False
    step = (hi - lo) / top
    safe = step if step > 0.0 else 1.0
    code = np.rint((value - lo) / safe)
    clipped = (code < 0.0 or code > top) and step > 0.0
    code = min(max(code, 0.0), top)
    return lo + code * (step if step > 0.0 else 0.0), clipped


@nb.njit(**_SERIAL)
def _pair_normals(key, pass_id, half_n, n_adc, e, col0, noise):
    """Fast normals of the columns col0, col0 + 1, ... of one pass and ADC rail,
    into ``noise[shift:]``; returns ``shift`` (1 when col0 is odd)."""
    first = col0 // 2
    for jp in range(noise.size // 2):
        counter = (pass_id * np.uint64(half_n) + np.uint64(first + jp)) * np.uint64(n_adc) \
            + np.uint64(e)
        c, s = rng.normal_pair32(key, counter)
        noise[2 * jp] = c
        noise[2 * jp + 1] = s
    return col0 - 2 * first


@nb.njit(**_SERIAL)
def _readout_fast_pass(m, row, g, p_low, r_low, lo, step, inv_step, var_col, var_const, inv_p,
                       top, key, pass_id, half_n, col0, h, noise, var, mean_e, zsum):
    """One pass of one token: noise, ADC and rail decoding, summed into zsum.
    Returns the number of clipped conversions."""
    n_sig, _, nn = m.shape
    n_adc = g.shape[0]
    rank = r_low.shape[0]
    n_clip = 0
    for e in range(n_adc):
        # Mean and shot-noise variance (in units of 1 / inv_p) of ADC rail e.
        for j in range(nn):
            var[j] = 0.0
            mean_e[j] = 0.0
        for r in range(n_sig):
            ger = g[e, r]
            mr = m[r, row]
            if rank == 0:
                for j in range(nn):
                    v = np.float64(mr[j])
                    mean_e[j] += ger * v
                    var[j] += ger * ger * max(v, 0.0)
            else:
                for j in range(nn):
                    mean_e[j] += ger * np.float64(mr[j])
        if rank > 0:
            for q in range(rank):
                pq = p_low[row, q]
                rq = r_low[q]
                for j in range(nn):
                    var[j] += pq * rq[j]
        shift = _pair_normals(key, pass_id, half_n, n_adc, e, col0, noise)
        lo_e, step_e, inv_e, vc_e = lo[e], step[e], inv_step[e], var_col[e]
        vconst, he = var_const[e], h[e]
        if top > 0.0:
            for j in range(nn):
                v = max(var[j], 0.0) * inv_p + vconst + vc_e[j]
                # float32 is ample for the size of a noise term (the root is taken in
                # float64: a variance past float32's range is a finite deviation).
                value = mean_e[j] + np.float64(np.float32(math.sqrt(v)) * noise[j + shift])
                # A zero-width window has inv_step 0: code 0, value lo, never clipped
                # (also for a deviation past float32's range: inf * 0 would be NaN).
                code = np.rint((value - lo_e[j]) * inv_e[j]) if inv_e[j] != 0.0 else 0.0
                n_clip += (code < 0.0) | (code > top)
                zsum[j] += he * (lo_e[j] + min(max(code, 0.0), top) * step_e[j])
        else:
            for j in range(nn):
                v = max(var[j], 0.0) * inv_p + vconst + vc_e[j]
                zsum[j] += he * (mean_e[j]
                                 + np.float64(np.float32(math.sqrt(v)) * noise[j + shift]))
    return n_clip


@nb.njit(**_SERIAL)
def _decode(zsum, asum, coeff, t_min, c_sum, w_const, part):
    """Undo the weight encoding of one pass and add it, times the input rail's
    coefficient, to the token's partial sums."""
    dt = part.dtype.type
    for j in range(zsum.size):
        z = (zsum[j] - t_min * c_sum * asum) / (1.0 - t_min) + w_const * asum
        part[j] += dt(coeff * z)


@nb.njit(**_SERIAL)
def _start(w_sum, in_const, part):
    dt = part.dtype.type
    for j in range(part.size):
        part[j] = dt(in_const) * w_sum[j]


@nb.njit(**_SERIAL)
def _finish(part, w_scale, y_row):
    for j in range(part.size):
        y_row[j] += part[j] * w_scale[j]


@nb.njit(**_SERIAL)
def _readout_fast_single(t, m, g0, p_low, r_low, asum, lo, step, inv_step, var_col, vconst, w_sum,
                         w_scale, y_row, key, inv_p, top, h0, t_min, c_sum, w_const, coeff,
                         in_const, pass_id, half_n, col0, noise, var):
    """The common case in one loop: one input pass, one signal, one ADC rail
    (offset inputs with balanced or offset weights), so the readout goes
    from the GEMM output to ``y`` without intermediate arrays."""
    nn = w_sum.size
    rank = r_low.shape[0]
    mean = m[0, t]
    if rank > 0:
        for j in range(nn):
            var[j] = 0.0
        for q in range(rank):
            pq = p_low[t, q]
            rq = r_low[q]
            for j in range(nn):
                var[j] += pq * rq[j]
    else:
        for j in range(nn):
            var[j] = g0 * g0 * max(np.float64(mean[j]), 0.0)
    shift = _pair_normals(key, pass_id, half_n, 1, 0, col0, noise)
    dt = y_row.dtype.type
    offset = t_min * c_sum * asum
    inv_span = 1.0 / (1.0 - t_min)
    pedestal = w_const * asum
    n_clip = 0
    for j in range(nn):
        v = max(var[j], 0.0) * inv_p + vconst + var_col[j]
        value = g0 * np.float64(mean[j]) \
            + np.float64(np.float32(math.sqrt(v)) * noise[j + shift])
        if top > 0.0:
            code = np.rint((value - lo[j]) * inv_step[j]) if inv_step[j] != 0.0 else 0.0
            n_clip += (code < 0.0) | (code > top)
            value = lo[j] + min(max(code, 0.0), top) * step[j]
        z = (h0 * value - offset) * inv_span + pedestal
        part = dt(in_const) * w_sum[j] + dt(coeff * z)
        y_row[j] += part * w_scale[j]
    return n_clip


@nb.njit(**_SERIAL)
def _readout_fast_token(t, m, g, p_low, r_low, a_sum, lo, step, inv_step, var_col, var_const,
                        w_sum, w_scale, y, key, inv_p, top, h, t_min, c_sum, w_const, in_coeffs,
                        in_const, t_first, k_tiles, kt, big_n, col0):
    n_in, tokens = a_sum.shape
    nn = w_sum.size
    half_n = (big_n + 1) // 2
    noise = np.empty(2 * ((col0 % 2 + nn + 1) // 2), dtype=np.float32)
    var = np.empty(nn)
    if n_in == 1 and m.shape[0] == 1 and g.shape[0] == 1:
        return _readout_fast_single(t, m, g[0, 0], p_low, r_low, a_sum[0, t], lo[0], step[0],
                                    inv_step[0], var_col[0], var_const[0], w_sum, w_scale,
                                    y[t, col0:col0 + nn], key, inv_p, top, h[0], t_min, c_sum,
                                    w_const, in_coeffs[0], in_const,
                                    _pass_id(t_first + t, k_tiles, kt, 1, 0), half_n, col0,
                                    noise, var)
    part = np.empty(nn, dtype=y.dtype)
    mean_e = np.empty(nn)
    zsum = np.empty(nn)
    _start(w_sum, in_const, part)
    n_clip = 0
    for s in range(n_in):
        pass_id = _pass_id(t_first + t, k_tiles, kt, n_in, s)
        for j in range(nn):
            zsum[j] = 0.0
        n_clip += _readout_fast_pass(m, s * tokens + t, g, p_low, r_low, lo, step, inv_step,
                                     var_col, var_const, inv_p, top, key, pass_id, half_n,
                                     col0, h, noise, var, mean_e, zsum)
        _decode(zsum, a_sum[s, t], in_coeffs[s], t_min, c_sum, w_const, part)
    _finish(part, w_scale, y[t, col0:col0 + nn])
    return n_clip


@guarded
@nb.njit(**_PARALLEL)
def readout_fast(m, g, p_low, r_low, a_sum, lo, step, inv_step, var_col, var_const, w_sum,
                 w_scale, y, clipped, key, inv_p, top, h, t_min, c_sum, w_const, in_coeffs,
                 in_const, t_first, k_tiles, kt, big_n, col0):
    """Gaussian detection, ADC and decoding of one weight block: the hot loop.

    Every Gaussian noise of an ADC readout (shot, dark, read, ENOB) is
    independent given the light, so their sum is drawn as one normal of the
    summed variance.

    m : (n_sig, n_in * T, nn) dtype, the mean signal readouts (GEMM output).
    g : (n_adc, n_sig) float64: ADC rail e reads ``sum_r g[e, r] m[r]``, with
        shot-noise variance ``sum_r g[e, r]**2 m[r]`` (times ``inv_p``)...
    p_low : (n_in * T, rank) float64 and r_low : (rank, nn) float64: ...unless
        rank > 0: then the shot variance is ``p_low @ r_low``, low-rank factors
        of the summed light of balanced rails (and m is their difference).
    a_sum : (n_in, T) float64, summed source levels of each pass.
    lo, step, inv_step, var_col : (n_adc, nn) float64: ADC window start, code
        width (0: a zero-width window), its inverse (0 there) and the ENOB noise
        variance; var_const : (n_adc,) float64, the column-independent one.
    w_sum, w_scale : (nn,) dtype; y : (T, N) dtype, its columns col0 : col0 + nn
        accumulated into.
    clipped : (T,) int64, added to. h : (n_adc,); in_coeffs : (n_in,).
    top : float, the ADC's top code (0: ideal ADC).
    """
    tokens = a_sum.shape[1]
    for t in nb.prange(tokens):
        clipped[t] += _readout_fast_token(
            np.int64(t), m, g, p_low, r_low, a_sum, lo, step, inv_step, var_col, var_const, w_sum,
            w_scale, y, key, inv_p,
            top, h, t_min, c_sum, w_const, in_coeffs, in_const, t_first, k_tiles, kt, big_n, col0)


@nb.njit(**_SERIAL)
def _readout_exact_pass(m, row, lo, hi, enob_std, top, seed, keys, p, dark, read, poisson,
                        balanced, h, pass_id, big_n, col0, zsum):
    """One pass of one token, draw for draw as the reference."""
    n_det, _, nn = m.shape
    n_adc = 1 if balanced else n_det
    finite = p < np.inf
    sqrt_dark = math.sqrt(dark)
    det = np.empty(2)
    n_clip = 0
    for j in range(nn):
        base = pass_id * np.uint64(big_n) + np.uint64(col0 + j)
        for r in range(n_det):
            mean = np.float64(m[r, row, j])
            if finite:
                idx = base * np.uint64(n_det) + np.uint64(r)
                e = max(mean, 0.0) * p
                if poisson:
                    counts = rng.poisson(seed, np.uint64(1), keys[0], idx, e)
                else:
                    counts = e + math.sqrt(e) * rng.normal(keys[0], idx)
                if dark > 0.0:
                    if poisson:
                        counts += rng.poisson_deviation(seed, np.uint64(2), keys[1], idx, dark)
                    else:
                        counts += sqrt_dark * rng.normal(keys[1], idx)
                det[r] = counts / p
            else:
                det[r] = mean
        for e in range(n_adc):
            value = det[0] - det[1] if balanced else det[e]
            idx = base * np.uint64(n_adc) + np.uint64(e)
            if finite and read > 0.0:
                value += read * rng.normal(keys[2], idx) / p
            if enob_std[e, j] > 0.0:
                value += enob_std[e, j] * rng.normal(keys[3], idx)
            value, clip = _adc(value, lo[e, j], hi[e, j], top)
            n_clip += clip
            zsum[j] += h[e] * value
    return n_clip


@nb.njit(**_SERIAL)
def _readout_exact_token(t, m, a_sum, lo, hi, enob_std, w_sum, w_scale, y, seed, keys, p, dark,
                         read, poisson, balanced, top, h, t_min, c_sum, w_const, in_coeffs,
                         in_const, t_first, k_tiles, kt, big_n, col0):
    n_in, tokens = a_sum.shape
    nn = w_sum.size
    part = np.empty(nn, dtype=y.dtype)
    zsum = np.empty(nn)
    _start(w_sum, in_const, part)
    n_clip = 0
    for s in range(n_in):
        pass_id = _pass_id(t_first + t, k_tiles, kt, n_in, s)
        for j in range(nn):
            zsum[j] = 0.0
        n_clip += _readout_exact_pass(m, s * tokens + t, lo, hi, enob_std, top, seed, keys, p,
                                      dark, read, poisson, balanced, h, pass_id, big_n, col0,
                                      zsum)
        _decode(zsum, a_sum[s, t], in_coeffs[s], t_min, c_sum, w_const, part)
    _finish(part, w_scale, y[t, col0:col0 + nn])
    return n_clip


@guarded
@nb.njit(**_PARALLEL)
def readout_exact(m, a_sum, lo, hi, enob_std, w_sum, w_scale, y, clipped, seed, keys, p, dark,
                  read, poisson, balanced, top, h, t_min, c_sum, w_const, in_coeffs, in_const,
                  t_first, k_tiles, kt, big_n, col0):
    """Detection, ADC and decoding of one weight block, draw for draw as the
    numpy reference (``optical.core``): per-rail shot and dark counts, read
    and ENOB noise, each from its own stream at the reference's index.

    m : (n_det, n_in * T, nn) dtype, the mean detector-rail readouts.
    keys : (4,) uint64, stream keys of shot, dark, read and adc noise.
    p : photons per MAC (``inf``: no detector noise); dark, read : electrons.
    poisson : Poisson (True, as ``optical._rng.poisson``) or Gaussian (False) shot and
        dark counts.
    balanced : two rails subtracted before one ADC (else one ADC per rail).
    enob_std : (n_adc, nn) float64, ENOB noise of each column (0: none).
    Other arguments as :func:`readout_fast`.
    """
    tokens = a_sum.shape[1]
    for t in nb.prange(tokens):
        clipped[t] += _readout_exact_token(
            np.int64(t), m, a_sum, lo, hi, enob_std, w_sum, w_scale, y, seed, keys, p, dark, read,
            poisson, balanced, top, h, t_min, c_sum, w_const, in_coeffs, in_const, t_first,
            k_tiles, kt, big_n, col0)


serialise(globals())  # processes filling the kernel cache at once: optical._numba_cache
