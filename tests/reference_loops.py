"""An independent, deliberately plain re-derivation of the noise-free optical
matmul (DAC, mask, encodings, balanced or per-rail detection, ADC windows),
written from the physical description with explicit loops over tokens and
tiles. Used as the truth for ``optical.matmul`` when every noise is off,
and for its count of clipped ADC conversions."""

import math

import numpy as np


def _levels(u, bits):
    if bits is None:
        return u
    top = 2**bits - 1
    return np.round(np.clip(u, 0, 1) * top) / top


def _weight_scales(w, cfg):
    """Abs-max weight scale of each column of each K-tile, by mask.scaling."""
    big_k, big_n = w.shape
    k, n = cfg.core.inputs, cfg.core.outputs
    scales = []
    for k0 in range(0, big_k, k):
        block = np.abs(w[k0:k0 + k])
        if cfg.mask.scaling == "per_tensor":
            s = np.full(big_n, np.abs(w).max())
        elif cfg.mask.scaling == "per_column":
            s = np.abs(w).max(axis=0)
        elif cfg.mask.scaling == "per_tile_column":
            s = block.max(axis=0)
        else:  # per_tile: one scale per core-sized block
            s = np.concatenate([np.full(block[:, n0:n0 + n].shape[1], block[:, n0:n0 + n].max())
                                for n0 in range(0, big_n, n)])
        scales.append(s)  # 0 for an all-zero column: its readouts are dropped
    return scales


def _share(lo, hi, n):
    """One ADC window per N-tile: the union of its columns' windows."""
    lo, hi = lo.copy(), hi.copy()
    for n0 in range(0, len(lo), n):
        lo[n0:n0 + n], hi[n0:n0 + n] = lo[n0:n0 + n].min(), hi[n0:n0 + n].max()
    return lo, hi


def reference_matmul(x, w, cfg, *, return_clipped=False):
    """The noise-free optical ``x @ w`` under ``cfg``, one token, K-tile, pass
    and ADC at a time. With ``return_clipped``, also ``(below, above)``: how
    many ADC conversions rounded to a code under 0 or over the top code."""
    below = above = 0
    x = np.asarray(x, np.float64).reshape(-1, w.shape[0])
    w = np.asarray(w, np.float64)
    big_k, big_n = w.shape
    k = cfg.core.inputs  # N-tiling matters only for shared (per-tile) scales and windows
    t_min = 1.0 / cfg.mask.contrast_ratio
    sw_tiles = _weight_scales(w, cfg)
    v = np.concatenate([w[i * k:(i + 1) * k] / np.where(s > 0, s, 1.0)
                        for i, s in enumerate(sw_tiles)])
    if cfg.encoding.weights == "offset":
        u = [_levels((v + 1) / 2, cfg.mask.bits)]
        vq = 2 * u[0] - 1
    else:
        u = [_levels(np.maximum(v, 0), cfg.mask.bits), _levels(np.maximum(-v, 0), cfg.mask.bits)]
        vq = u[0] - u[1]
    trans = [t_min + (1 - t_min) * ur for ur in u]
    balanced = cfg.encoding.weights == "split" and cfg.detector.balanced
    # ADC-side transmissions: what each ADC sees per unit of source light.
    adc_t = [trans[0] - trans[1]] if balanced else trans
    if cfg.encoding.inputs == "offset":
        mu, var = 0.5, 1 / 12
    else:
        mu, var = 0.25, 5 / 48

    xmax = np.abs(x).max(axis=1) if cfg.dac.scaling == "per_token" else np.full(len(x), np.abs(x).max())
    sx = np.where(xmax > 0, xmax, 1.0)
    y = np.zeros((len(x), big_n))
    for i in range(len(x)):
        xt = x[i] / sx[i]
        for k0 in range(0, big_k, k):
            rows = slice(k0, min(k0 + k, big_k))
            sw = sw_tiles[k0 // k]
            if cfg.encoding.inputs == "offset":
                passes = [(2.0, _levels((xt[rows] + 1) / 2, cfg.dac.bits))]
                y[i] -= vq[rows].sum(axis=0) * sw
            else:
                passes = [(1.0, _levels(np.maximum(xt[rows], 0), cfg.dac.bits)),
                          (-1.0, _levels(np.maximum(-xt[rows], 0), cfg.dac.bits))]
            for coeff, a in passes:
                a_sum = a.sum()
                digitised = []
                for g in adc_t:
                    g = g[rows]
                    readout = a @ g
                    if cfg.adc.bits is not None:
                        floor, ceil = np.minimum(g, 0).sum(0), np.maximum(g, 0).sum(0)
                        if cfg.adc.full_scale == "max":
                            lo, hi = floor, ceil
                        else:
                            half = cfg.adc.headroom * np.sqrt(var * (g**2).sum(0))
                            lo = np.maximum(mu * g.sum(0) - half, floor)
                            hi = np.minimum(mu * g.sum(0) + half, ceil)
                        if cfg.adc.window == "per_tile":
                            lo, hi = _share(lo, hi, cfg.core.outputs)
                        top = 2**cfg.adc.bits - 1
                        step = (hi - lo) / top
                        code = np.round((readout - lo) / np.where(step > 0, step, 1))
                        below += int(np.sum((code < 0) & (step > 0)))
                        above += int(np.sum((code > top) & (step > 0)))
                        readout = lo + np.clip(code, 0, top) * step
                    digitised.append(readout)
                if balanced:
                    dot = digitised[0] / (1 - t_min)
                elif cfg.encoding.weights == "split":
                    dot = (digitised[0] - digitised[1]) / (1 - t_min)
                else:
                    dot = 2 * (digitised[0] - t_min * a_sum) / (1 - t_min) - a_sum
                y[i] += coeff * dot * sw
        y[i] *= xmax[i]  # an all-zero token is encoded as zeros: its output is 0
    assert math.isinf(cfg.source.photons_per_mac)
    return (y, (below, above)) if return_clipped else y
