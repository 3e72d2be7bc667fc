"""Pre-distortion of the mask for a known illumination envelope and crosstalk.

The light that reaches detector ``m`` from source ``i`` does not see the
transmission ``T[i, m]`` alone: the source's light spreads over neighbouring
mask rows, each mask pixel is lit by the local illumination envelope ``E``,
and each column's light spreads over neighbouring detectors. Within one
core-sized tile, with ``h`` the kernels' half-length,

``T_eff[i, m] = sum_{d, e} row_kernel[h + d] col_kernel[h + e] E[i + d, m - e] T[i + d, m - e]``

(zero outside the tile): a linear map ``F``, applied once per weight load.
:class:`SeparableCoupling` is that map. :func:`pre_distort` chooses mask
levels whose effective tile is closest to the intended one scaled by a gain
``g`` per (K-tile, column) (the digital side divides ``g`` out):

- split weights: only the difference of the two rails reaches the result
  (their common part cancels), so it solves ``F(d) = g (1 - t_min) v`` for the
  rail difference ``d`` in ``[-(1 - t_min), 1 - t_min]`` and puts ``max(d, 0)``
  on one rail and ``max(-d, 0)`` on the other: light leaking onto a zero
  weight is cancelled through the other rail;
- offset weights: it solves ``F(t) = t_min + (1 - t_min) (g v + 1) / 2`` for
  ``t`` in ``[t_min, 1]``; the mid-range pedestal must be reached by the
  dimmest pixel too, which costs more gain.

:func:`solve` is projected Jacobi iteration, a contraction when each pixel
keeps more of its own light than it receives from its neighbours;
:func:`gain` is the largest ``g`` for which every pixel's target stays
reachable even when its neighbours leak the most (or the least) light.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["SeparableCoupling", "gain", "solve"]


@dataclasses.dataclass(frozen=True, eq=False)
class SeparableCoupling:
    """Envelope and crosstalk of the optics over one core-sized tile.

    Attributes
    ----------
    envelope : ndarray, shape (tile_k, tile_n) or broadcastable, dimensionless
        Relative illumination of each mask pixel of a tile (1 = nominal).
    row_kernel : ndarray, shape (2h + 1,), dimensionless
        ``row_kernel[h + d]``: fraction of a source's light on mask row ``i + d``.
    col_kernel : ndarray, shape (2h + 1,), dimensionless
        ``col_kernel[h + e]``: fraction of a mask column's light on detector ``m + e``.
    """

    envelope: np.ndarray
    row_kernel: np.ndarray
    col_kernel: np.ndarray

    def __post_init__(self) -> None:
        for name in ("row_kernel", "col_kernel"):
            kernel = np.asarray(getattr(self, name), dtype=np.float64)
            if kernel.ndim != 1 or kernel.size % 2 == 0 or np.any(kernel < 0):
                raise ValueError(f"{name}: expected a 1-D non-negative kernel of odd length, "
                                 f"got {kernel!r}")
            object.__setattr__(self, name, kernel)
        envelope = np.asarray(self.envelope, dtype=np.float64)
        if envelope.ndim > 2 or np.any(envelope < 0) or not np.isfinite(envelope).all():
            raise ValueError("envelope: expected finite non-negative values of at most "
                             "2 dimensions (tile rows, tile columns)")
        object.__setattr__(self, "envelope", envelope)

    def diagonal(self, tile_k: int, tile_n: int) -> np.ndarray:
        """Self-coupling of every pixel of a tile, shape (tile_k, tile_n)."""
        centre = self.row_kernel[self.row_kernel.size // 2] * self.col_kernel[
            self.col_kernel.size // 2]
        return centre * np.broadcast_to(self.envelope, (tile_k, tile_n))

    def apply(self, t: np.ndarray, tiling) -> np.ndarray:
        """Effective transmissions of mask transmissions ``t`` (..., K, N),
        tile by tile; same shape and dtype."""
        return _from_tiles(self._apply_tiles(_to_tiles(t, tiling)), tiling)

    def leakage(self, tile_k: int, tile_n: int) -> np.ndarray:
        """Light each pixel of a tile receives from all its neighbours when
        every pixel is fully open, shape (tile_k, tile_n)."""
        full = self._apply_tiles(np.ones((1, tile_k, 1, tile_n)))[0, :, 0, :]
        return full - self.diagonal(tile_k, tile_n)

    def _apply_tiles(self, tiles: np.ndarray) -> np.ndarray:
        """The map on arrays laid out as (..., k_tiles, tile_k, n_tiles, tile_n)."""
        tile_k, tile_n = tiles.shape[-3], tiles.shape[-1]
        env = np.broadcast_to(self.envelope, (tile_k, tile_n)).astype(tiles.dtype)
        out = _correlate(tiles * env[:, None, :], self.row_kernel.astype(tiles.dtype), axis=-3,
                         sign=1)
        return _correlate(out, self.col_kernel.astype(tiles.dtype), axis=-1, sign=-1)


def _to_tiles(a: np.ndarray, tiling) -> np.ndarray:
    """(..., K, N) -> zero-padded (..., k_tiles, tile_k, n_tiles, tile_n)."""
    lead = a.shape[:-2]
    padded = np.zeros((*lead, tiling.k_tiles * tiling.tile_k, tiling.n_tiles * tiling.tile_n),
                      dtype=a.dtype)
    padded[..., :tiling.k, :tiling.n] = a
    return padded.reshape(*lead, tiling.k_tiles, tiling.tile_k, tiling.n_tiles, tiling.tile_n)


def _from_tiles(tiles: np.ndarray, tiling) -> np.ndarray:
    """Inverse of :func:`_to_tiles` (padding dropped)."""
    lead = tiles.shape[:-4]
    padded = tiles.reshape(*lead, tiling.k_tiles * tiling.tile_k, tiling.n_tiles * tiling.tile_n)
    return np.ascontiguousarray(padded[..., :tiling.k, :tiling.n])


def _correlate(a: np.ndarray, kernel: np.ndarray, axis: int, sign: int) -> np.ndarray:
    """``out[i] = sum_d kernel[h + d] a[i + sign * d]`` along ``axis``, zero outside."""
    h = kernel.size // 2
    a = np.moveaxis(a, axis, -1)
    out = kernel[h] * a
    size = a.shape[-1]
    for d in range(1, min(h, size - 1) + 1):
        # out[i] gets a[i + d] with weight `ahead` and a[i - d] with weight `behind`.
        ahead, behind = ((kernel[h + d], kernel[h - d]) if sign > 0
                         else (kernel[h - d], kernel[h + d]))
        out[..., :size - d] += ahead * a[..., d:]
        out[..., d:] += behind * a[..., :size - d]
    return np.moveaxis(out, -1, axis)


def _tile_field(field: np.ndarray, tiling) -> np.ndarray:
    """A per-pixel field of one tile (tile_k, tile_n) laid over a (K, N) matrix."""
    layout = (tiling.k_tiles, tiling.tile_k, tiling.n_tiles, tiling.tile_n)
    return _from_tiles(np.broadcast_to(field[:, None, :], layout), tiling)


def gain(coupling: SeparableCoupling, tiling, min_transmission: float,
         scheme: str) -> np.ndarray:
    """Largest target scale of each K-tile column that every pixel can reach.

    With self-coupling ``D`` and leakage ``L`` (from fully open neighbours)
    per pixel: split weights need ``|d| <= 1 - t_min`` where
    ``D d = g (1 - t_min) v - leak`` and ``|leak| <= L (1 - t_min)``, so
    ``g <= D - L``; offset weights need the top target
    ``t_min + (1 - t_min)(1 + g) / 2 <= D + L t_min`` (neighbours closed) and
    the bottom one ``t_min + (1 - t_min)(1 - g) / 2 >= D t_min + L``
    (neighbours open). Shape (k_tiles, N), in (0, 1].

    Raises
    ------
    ValueError
        If no positive gain works (the optics lose or leak too much light).
    """
    t_min = min_transmission
    diag = coupling.diagonal(tiling.tile_k, tiling.tile_n)
    leak = coupling.leakage(tiling.tile_k, tiling.tile_n)
    if scheme == "split":
        reach = diag - leak
    else:
        top = 2 * (diag + leak * t_min - t_min) / (1 - t_min) - 1
        bottom = 1 - 2 * (diag * t_min + leak - t_min) / (1 - t_min)
        reach = np.minimum(top, bottom)
    out = np.empty((tiling.k_tiles, tiling.n))
    for kt in range(tiling.k_tiles):
        rows = tiling.k_slice(kt).stop - tiling.k_slice(kt).start
        for nt in range(tiling.n_tiles):
            ns = tiling.n_slice(nt)
            out[kt, ns] = reach[:rows, :ns.stop - ns.start].min(axis=0)
    if np.any(out <= 0):
        raise ValueError("mask.compensate: the optics' envelope and crosstalk leave no gain "
                         f"at which every weight can be reached with {scheme} weights and "
                         f"min_transmission {t_min}; reduce the crosstalk or turn compensation off")
    return np.minimum(out, 1.0)


def solve(target: np.ndarray, coupling: SeparableCoupling, tiling, lo: float, hi: float, *,
          tol: float = 1e-6, max_iter: int = 200) -> np.ndarray:
    """Values in ``[lo, hi]`` whose effective tile is closest to ``target``.

    Projected Jacobi: ``t <- clip(t + (target - F(t)) / D, lo, hi)``, from
    ``target / D``, until no value moves by more than ``tol``.

    Parameters
    ----------
    target : ndarray, shape (..., K, N), dimensionless
    coupling : SeparableCoupling
    tiling : optical.quant.Tiling
    lo, hi : float
        The box the values must stay in.
    tol : float
    max_iter : int

    Returns
    -------
    ndarray, shape and dtype of ``target``
    """
    dtype = target.dtype
    inv = _tile_field(1.0 / coupling.diagonal(tiling.tile_k, tiling.tile_n), tiling).astype(dtype)
    t = np.clip(target * inv, lo, hi).astype(dtype)
    for _ in range(max_iter):
        step = np.clip(t + (target - coupling.apply(t, tiling)) * inv, lo, hi)
        moved = float(np.max(np.abs(step - t))) if step.size else 0.0
        t = step
        if moved < tol:
            break
    return t


def pre_distort(v: np.ndarray, gain_rows: np.ndarray, coupling: SeparableCoupling, tiling,
                min_transmission: float, scheme: str) -> np.ndarray:
    """Mask levels (rails, K, N) in [0, 1], not yet quantised, whose effective
    tile shows the normalised weights ``v`` times ``gain_rows`` (the gain of
    each row's K-tile column, shape (K, N))."""
    t_min = min_transmission
    span = 1.0 - t_min
    if scheme == "split":
        d = solve(v * gain_rows * v.dtype.type(span), coupling, tiling, -span, span)
        return np.stack([np.maximum(d, 0), np.maximum(-d, 0)]) / v.dtype.type(span)
    target = t_min + span * (v * gain_rows + 1) / 2
    t = solve(target.astype(v.dtype), coupling, tiling, t_min, 1.0)
    return ((t - t_min) / span)[None]
