"""How :mod:`optical.physics.crosstalk` applies its kernels to a programmed
mask: the fast path behind :func:`~optical.physics.crosstalk.effective_tile`
and :func:`~optical.physics.crosstalk.effective_transmissions` (inputs checked
there), and the kernels' taps that :mod:`optical.kernels._program` compiles.

Every pass is a shifted multiply-add over one flat buffer laid out as the mask
is (rails interleaved, each N-tile followed by ``radius`` dark columns), so no
shift couples two tiles or two rows; rows are processed in blocks of about
:data:`BLOCK_ELEMENTS` elements to stay in cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from optical.physics.crosstalk import Kernels

#: Elements per block of rows when applying the kernels (keeps passes in cache).
BLOCK_ELEMENTS = 1 << 18


def apply_tiled(t: np.ndarray, kern: Kernels, tiling, out: np.ndarray | None = None
               ) -> np.ndarray:
    """:func:`~optical.physics.crosstalk.effective_transmissions` with the kernels given and ``t``
    (rails, K, N) already checked: each tile of ``tiling`` on its own."""
    k_bounds = [(s.start, s.stop) for s in map(tiling.k_slice, range(tiling.k_tiles))]
    n_bounds = [(s.start, s.stop) for s in map(tiling.n_slice, range(tiling.n_tiles))]
    return apply(t, kern, k_bounds, n_bounds, 0, out)


def check_transmissions(transmissions: object, rails: int) -> np.ndarray:
    if not isinstance(transmissions, np.ndarray):
        raise TypeError(f"transmissions: expected a numpy.ndarray, got "
                        f"{type(transmissions).__name__}")
    t = transmissions
    if t.dtype not in (np.float32, np.float64):
        raise TypeError(f"transmissions: dtype {t.dtype} is not supported; use float32 or "
                        "float64")
    if t.ndim != 3 or t.shape[0] != rails:
        raise ValueError(f"transmissions: expected shape (rails={rails}, k, n), got {t.shape}")
    if t.size and not (np.isfinite(t).all() and np.min(t) >= 0):
        raise ValueError("transmissions: must be finite and non-negative")
    return t


def apply(t: np.ndarray, kern: Kernels, k_bounds: list[tuple[int, int]],
           n_bounds: list[tuple[int, int]], column_offset: int,
           out: np.ndarray | None = None) -> np.ndarray:
    """The fast path, blocked over rows so that every pass runs in cache.

    Each block of rows is laid out as the mask is: rails interleaved, each
    N-tile followed by ``radius`` dark columns, the rows end to end in one flat
    buffer, so that every shift along a row is a shift of the flat buffer and
    never couples two tiles or two rows. The envelope enters as its modulus
    ``|e|``: phase differences of the fan-out beam between pixels within the
    kernel radius are neglected. ``out`` may be ``t`` itself (in place).
    """
    rails, r = kern.rails, kern.radius
    dtype = t.dtype
    lags = output_taps(np.real(kern.output_mutual), dtype)
    input_taps = taps(kern.input_coupling, dtype)
    widths = [rails * (hi - lo) for lo, hi in n_bounds]
    offsets = np.concatenate([[0], np.cumsum([w + r for w in widths])]).astype(int)
    row_len = int(offsets[-1])
    envelope = np.abs(kern.envelope_field)
    s_row = np.zeros(row_len, dtype=dtype)
    for off, w in zip(offsets, widths, strict=False):
        start = rails * column_offset
        s_row[off:off + w] = envelope[start:start + w]

    if out is None:
        out = np.empty_like(t)
    in_place = out is t
    block = max(1, BLOCK_ELEMENTS // row_len)
    rows_max = block + 2 * r
    margin = 2 * r
    size = rows_max * row_len
    v = np.zeros(size + 2 * margin, dtype=dtype)   # v = |e| sqrt(t); then v * v
    pair = np.zeros_like(v)
    q = np.zeros_like(v)
    scratch = np.zeros_like(v)
    tb = np.empty((block, row_len), dtype=dtype)
    saved = np.empty((rails, r, t.shape[2]), dtype=dtype) if in_place and r else None

    for k_lo, k_hi in k_bounds:
        for a in range(k_lo, k_hi, block):
            b = min(a + block, k_hi)
            ha, hb = max(k_lo, a - r), min(k_hi, b + r)
            h = hb - ha
            inner = slice(margin, margin + h * row_len)
            vb = v[inner].reshape(h, row_len)
            for off, (lo, hi) in zip(offsets, n_bounds, strict=False):
                for rail in range(rails):
                    dest = vb[:, off + rail:off + rails * (hi - lo):rails]
                    if in_place and ha < a:  # rows above a were overwritten: use the saved copy
                        dest[:a - ha] = saved[rail, r - (a - ha):, lo:hi]
                        dest[a - ha:] = t[rail, a:hb, lo:hi]
                    else:
                        dest[:] = t[rail, ha:hb, lo:hi]
            output_form(v, q, pair, scratch, inner, s_row, lags)
            # Input coupling: T[i] = sum_d c_in[d] Q[i + d], rows of this K-tile only.
            qb = q[inner].reshape(h, row_len)
            tbb = tb[:b - a]
            np.multiply(qb[a - ha:b - ha], input_taps[0][1], out=tbb)
            for d, weight in input_taps[1:]:
                lo, hi = max(a, ha - d), min(b, hb - d)
                if hi > lo:
                    buf = scratch[:(hi - lo) * row_len].reshape(hi - lo, row_len)
                    np.multiply(qb[lo + d - ha:hi + d - ha], weight, out=buf)
                    tbb[lo - a:hi - a] += buf
            if saved is not None and b < k_hi:
                # Keep the original of the last r rows before b (a rolling window
                # when blocks are shorter than the kernel).
                n_new = min(r, b - a)
                saved[:, :r - n_new] = saved[:, n_new:].copy()
                saved[:, r - n_new:] = t[:, b - n_new:b]
            for off, (lo, hi) in zip(offsets, n_bounds, strict=False):
                for rail in range(rails):
                    out[rail, a:b, lo:hi] = tbb[:, off + rail:off + rails * (hi - lo):rails]
    return out


def taps(kernel: np.ndarray, dtype) -> list[tuple[int, object]]:
    """``(shift, weight)`` of a centred kernel, the centre first; taps below the
    dtype's resolution relative to the centre change nothing and are dropped."""
    r = (kernel.size - 1) // 2
    floor = np.finfo(dtype).eps / 2 * abs(kernel[r])
    every = [(d, dtype.type(kernel[r + d])) for d in range(-r, r + 1)]
    return sorted([tp for tp in every if abs(tp[1]) > floor or tp[0] == 0],
                  key=lambda tp: tp[0] != 0)


def output_taps(m: np.ndarray, dtype) -> list[list[tuple[tuple[int, ...], object]]]:
    """For each lag L, the taps of ``Q[n] += w * P_L[n + d]`` grouped by weight:
    ``[(shifts, w), ...]`` with ``P_L[m] = v[m] v[m + L]``. Pairs mirrored
    about the detector, ``(d, d + L)`` and ``(-d - L, -d)``, share a weight
    for the even pupils of the model, so each group costs one multiply."""
    r = (m.shape[0] - 1) // 2
    symmetric = np.allclose(m, m[::-1, ::-1], rtol=1e-9, atol=1e-15 * np.abs(m).max())
    if symmetric:
        m = (m + m[::-1, ::-1]) / 2
    lags = []
    for lag in range(2 * r + 1):
        scale = 1 if lag == 0 else 2  # (d, d + L) and (d + L, d) contribute alike
        groups: dict[int, tuple[list[int], float]] = {}
        for d in range(-r, r + 1 - lag):
            weight = scale * m[r + d, r + d + lag]
            mirror = -d - lag
            key = min(d, mirror) if symmetric else d
            shifts, _ = groups.setdefault(key, ([], weight))
            if d not in shifts:
                shifts.append(d)
        lags.append([(tuple(sh), dtype.type(w)) for sh, w in groups.values() if w != 0])
    return lags


def output_form(v: np.ndarray, q: np.ndarray, pair: np.ndarray, scratch: np.ndarray,
                 inner: slice, s_row: np.ndarray, lags) -> None:
    """``Q[n] = sum_{d, d'} M[d, d'] v[n+d] v[n+d']`` with ``v = |e| sqrt(t)``,
    on the flat buffers' ``inner`` range (``v`` holds t on entry)."""
    lo, hi = inner.start, inner.stop
    rows = (hi - lo) // s_row.size
    body = v[inner].reshape(rows, s_row.size)
    if len(lags) == 1:  # radius 0: Q = M00 |e|^2 t
        np.multiply(body, s_row * s_row * lags[0][0][1], out=q[inner].reshape(body.shape))
        return
    np.sqrt(body, out=body)
    body *= s_row
    first = True
    for lag, groups in enumerate(lags):
        if lag == 0:
            np.multiply(v[inner], v[inner], out=pair[inner])
        else:
            np.multiply(v[inner], v[lo + lag:hi + lag], out=pair[inner])
        for shifts, weight in groups:
            target = q[inner] if first else scratch[inner]
            if len(shifts) == 1:
                d = shifts[0]
                np.multiply(pair[lo + d:hi + d], weight, out=target)
            else:
                d0, d1 = shifts
                np.add(pair[lo + d0:hi + d0], pair[lo + d1:hi + d1], out=target)
                target *= weight
            if not first:
                q[inner] += target
            first = False
