"""Pre-distortion of the mask for a known illumination envelope and crosstalk.

The light that reaches detector ``m`` from source ``i`` does not see the
transmission ``T[i, m]`` alone: the source's light spreads over neighbouring
mask rows, each pixel is lit by the local illumination envelope, and each
column's light spreads over neighbouring detectors. Program time knows that
map ``F`` from the mask's transmissions (rails, K, N) to the effective ones
the detectors see, tile by tile; :func:`pre_distort` inverts it.

Any *optics* object serves that offers

- ``apply(t, tiling)``: the effective transmissions of mask transmissions
  ``t`` of shape (rails, K, N) (linear or not, rails coupled or not);
- ``diagonal(tiling)``: each pixel's self-coupling ``D``, the derivative of
  its own effective transmission with respect to its transmission, an array
  broadcastable to (rails, K, N).

:class:`SeparableCoupling` is the linear, separable case (an envelope over the
tile, a row kernel and a column kernel, rails independent); the lens physics
supplies the full one.

:func:`pre_distort` asks for the intended effective tile scaled by a gain
``g`` per (K-tile, column) (the digital side divides ``g`` out):

- split weights: only the difference of the two rails reaches the result,
  so it solves ``F(t)[+] - F(t)[-] = g (1 - t_min) v`` for a signed ``d`` in
  ``[-(1 - t_min), 1 - t_min]`` with ``t+ = t_min + max(d, 0)`` and
  ``t- = t_min + max(-d, 0)``: light leaking onto a zero weight is cancelled
  through the other rail;
- offset weights: it solves ``F(t) = t_min + (1 - t_min) (g v + 1) / 2`` for
  ``t`` in ``[t_min, 1]``; the mid-range pedestal must be reached by the
  dimmest pixel too, which costs more gain.

Both by projected Jacobi iteration, ``x <- clip(x + residual / D)``, a
contraction when each pixel keeps more of its own light than it receives
from its neighbours. :func:`gain` is a ``g`` for which every pixel's target
stays reachable even when its neighbours leak the most (or the least) light.
"""

from __future__ import annotations

import dataclasses
import numbers
import weakref
from typing import TYPE_CHECKING, Protocol

import numpy as np

from optical.physics import converters, crosstalk

if TYPE_CHECKING:
    from optical.quant import Tiling

__all__ = ["LEVEL_FRACTION", "MAX_ITERATIONS", "TOLERANCE", "Optics", "SeparableCoupling",
           "gain", "pre_distort", "tolerance"]


class Optics(Protocol):
    """The forward map compensation inverts (see the module docstring):
    :class:`SeparableCoupling`, or the lens physics. It may also define
    ``leak_parts(tiling)`` (see :func:`gain`)."""

    def apply(self, t: np.ndarray, tiling: Tiling) -> np.ndarray:
        """Effective transmissions of mask transmissions ``t`` (rails, K, N)."""
        ...

    def diagonal(self, tiling: Tiling) -> np.ndarray:
        """Each pixel's self-coupling, broadcastable to (rails, K, N)."""
        ...


@dataclasses.dataclass(frozen=True, eq=False)
class SeparableCoupling:
    """Linear envelope and crosstalk over one core-sized tile, rails independent:

    ``T_eff[i, m] = sum_{d, e} row_kernel[h + d] col_kernel[h + e] E[i + d, m - e] T[i + d, m - e]``

    (``h`` the kernels' half-length; zero outside the tile).

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
            if kernel.ndim != 1 or kernel.size % 2 == 0 or not np.all(kernel >= 0) \
                    or not np.isfinite(kernel).all():
                raise ValueError(f"{name}: expected a 1-D finite non-negative kernel of odd "
                                 f"length, got {kernel!r}")
            object.__setattr__(self, name, kernel)
        envelope = np.asarray(self.envelope, dtype=np.float64)
        if envelope.ndim > 2 or np.any(envelope < 0) or not np.isfinite(envelope).all():
            raise ValueError("envelope: expected finite non-negative values of at most "
                             "2 dimensions (tile rows, tile columns)")
        object.__setattr__(self, "envelope", envelope)

    def diagonal(self, tiling: Tiling) -> np.ndarray:
        """Self-coupling of every pixel, shape (K, N)."""
        centre = (self.row_kernel[self.row_kernel.size // 2]
                  * self.col_kernel[self.col_kernel.size // 2])
        env = np.broadcast_to(self.envelope, (tiling.tile_k, tiling.tile_n))
        layout = (tiling.k_tiles, tiling.tile_k, tiling.n_tiles, tiling.tile_n)
        return _from_tiles(np.broadcast_to(centre * env[:, None, :], layout), tiling)

    def apply(self, t: np.ndarray, tiling: Tiling) -> np.ndarray:
        """Effective transmissions of mask transmissions ``t`` (..., K, N),
        tile by tile; same shape and dtype."""
        tiles = _to_tiles(t, tiling)
        env = np.broadcast_to(self.envelope, (tiling.tile_k, tiling.tile_n)).astype(t.dtype)
        out = _correlate(tiles * env[:, None, :], self.row_kernel.astype(t.dtype), axis=-3,
                         sign=1)
        out = _correlate(out, self.col_kernel.astype(t.dtype), axis=-1, sign=-1)
        return _from_tiles(out, tiling)


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


#: Each tile shape's reach (``_tile_reach``), per lens kernels (dropped with them).
_REACH: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: Reaches kept per kernels, the oldest dropped first: a key holds the mask
#: contrast, so a contrast sweep on one lens added one for good per value.
_REACH_ENTRIES = 128


def _check_mask(min_transmission: object, scheme: object) -> float:
    """``min_transmission`` as a float in [0, 1), and ``scheme`` "split" or
    "offset", or ValueError naming the one that is not (an unknown scheme
    was taken for offset weights: one rail, the offset bound)."""
    if scheme not in ("split", "offset"):
        raise ValueError(f"scheme: {scheme!r} is not valid; valid: 'split', 'offset'")
    if isinstance(min_transmission, bool) or not isinstance(min_transmission, numbers.Real) \
            or not 0 <= min_transmission < 1:
        raise ValueError(f"min_transmission: {min_transmission!r} must be a number in [0, 1) "
                         "(a closed pixel's transmission, 1 / mask.contrast_ratio)")
    return float(min_transmission)


def gain(optics: Optics, tiling: Tiling, min_transmission: float, scheme: str,
         rails: int) -> np.ndarray:
    """A target scale of each K-tile column that every pixel can reach,
    whatever its neighbours show.

    Each pixel's effective transmission is ``D t + leak``: its self-coupling
    ``D`` times its own transmission, plus the light its neighbours put on
    it. With every transmission in ``[t_min, 1]``, that leak lies in
    ``[t_min P - N, P - t_min N]``, where ``P`` and ``N`` are the light of
    the coupling's positive and negative terms on an open mask (less ``D``):
    ``optics.leak_parts(tiling)`` where the optics define it (the lens relay
    has negative interference terms), else ``F(open) - D`` and 0, as for
    linear optics whose coupling terms are all non-negative. Then

    - split weights: reaching ``v = +1`` (``t+ = 1``, ``t- = t_min``) needs
      ``D+ - t_min D- + least+ - most- >= g (1 - t_min)``, and ``v = -1``
      the same with the rails swapped (the rails of an output differ at the
      tile's edges and under the envelope);
    - offset weights: the top target ``t_min + (1 - t_min)(1 + g) / 2`` must
      be at most ``D + least`` (the pixel open) and the bottom one
      ``t_min + (1 - t_min)(1 - g) / 2`` at least ``D t_min + most`` (the
      pixel closed).

    The result is the largest ``g`` these bounds allow (a pixel's
    neighbours cannot all be at their worst for every term at once, so the
    true reach may be slightly larger). Shape (k_tiles, N), in (0, 1].

    Raises
    ------
    ValueError
        If no positive gain works (the optics lose or leak too much light),
        or for a ``scheme`` or ``min_transmission`` out of range.
    """
    t_min = _check_mask(min_transmission, scheme)
    out = np.empty((tiling.k_tiles, tiling.n))
    # The optics act within each tile alone, so an open mask leaks the same
    # light into every tile of the same shape: evaluate one tile per shape
    # (full, and partial at the matrix edges) instead of the whole matrix.
    # Lens optics are their kernels alone: keep each shape's reach with them,
    # for every later weight load of the same machine.
    kernels = getattr(optics, "kernels", None)
    reach_of: dict[tuple, np.ndarray] = (
        _REACH.setdefault(kernels, {}) if isinstance(kernels, crosstalk.Kernels) else {})
    for i in range(tiling.k_tiles):
        ks = tiling.k_slice(i)
        for j in range(tiling.n_tiles):
            ns = tiling.n_slice(j)
            shape = (ks.stop - ks.start, ns.stop - ns.start)
            key = (*shape, tiling.tile_k, tiling.tile_n, float(t_min), scheme, rails)
            # Read once: another thread may evict the key between a check and a read.
            reach = reach_of.get(key)
            if reach is None:
                reach = _tile_reach(optics, type(tiling)(*shape, tiling.tile_k, tiling.tile_n),
                                    t_min, scheme, rails)
                reach.flags.writeable = False
                while len(reach_of) >= _REACH_ENTRIES:
                    try:
                        reach_of.pop(next(iter(reach_of)), None)
                    except (RuntimeError, StopIteration):  # another thread's change
                        break
                reach_of[key] = reach
            out[i, ns] = reach
    if not np.all(out > 0):  # (NaN too: optics whose light is not finite)
        raise ValueError("mask.compensate: the optics' envelope and crosstalk leave no gain "
                         f"at which every weight can be reached with {scheme} weights and "
                         f"min_transmission {t_min}; reduce the crosstalk or turn compensation off")
    return np.minimum(out, 1.0)


def _tile_reach(optics, tile, t_min: float, scheme: str, rails: int) -> np.ndarray:
    """The gain every pixel of one tile (a one-tile ``Tiling``) can reach, per
    column (the bounds of :func:`gain`)."""
    shape = (rails, tile.k, tile.n)
    diag = np.broadcast_to(optics.diagonal(tile), shape).astype(np.float64)
    parts = getattr(optics, "leak_parts", None)
    if parts is not None:
        positive, negative = (np.broadcast_to(p, shape) for p in parts(tile))
    else:  # linear, non-negative coupling terms: an open mask leaks the most
        positive, negative = np.abs(optics.apply(np.ones(shape), tile) - diag), 0.0
    most = positive - t_min * negative      # the most light the neighbours put on a pixel
    least = t_min * positive - negative     # ... and the least
    span = 1 - t_min
    if scheme == "split":
        plus = diag[0] - t_min * diag[1] + least[0] - most[1]
        minus = diag[1] - t_min * diag[0] + least[1] - most[0]
        reach = np.minimum(plus, minus) / span
    else:
        top = 2 * (diag + least - t_min) / span - 1
        bottom = 1 - 2 * (diag * t_min + most - t_min) / span
        reach = np.minimum(top, bottom)
    return reach.reshape(-1, tile.n).min(axis=0)


#: Pre-distortion stops when no value of a tile moves by more than this
#: (a continuous mask; see :func:`tolerance`) ...
TOLERANCE = 1e-6
#: ... or after this many Jacobi steps.
MAX_ITERATIONS = 200
#: For a mask of ``bits``, the step below which it stops is this fraction of
#: one mask level: the solution is then rounded to that grid, so converging
#: further only decides which way a value within a hair of a rounding edge
#: goes (measured on a Llama-3.1-8B layer's lens pre-distortion: every tile
#: stops after two steps instead of three, and 1.0e-5 to 1.3e-5 of the
#: weights land one level away from the fully converged mask).
LEVEL_FRACTION = 1 / 32


def tolerance(bits: int | None, min_transmission: float) -> float:
    """The step below which :func:`pre_distort` stops for a mask of ``bits``
    (None: continuous, :data:`TOLERANCE`): :data:`LEVEL_FRACTION` of one
    level, ``(1 - min_transmission) / (2**bits - 1)`` in transmission, and
    never below :data:`TOLERANCE`.

    The Jacobi map of the crosstalk is a strong contraction (each step
    shrinks the change ~100x on the lens model), so where it stops the
    solution is within a small fraction of this step of the fixed point.
    It contracts less near the crosstalk at which :func:`gain` finds no gain
    left, and with a dark pixel's steep field under coherent crosstalk: there
    it can stop at :data:`MAX_ITERATIONS` short of the tolerance, the mask
    then showing the weights to ~65 dB (noise-free) rather than ~100 dB. Near
    that limit the gain itself is the larger cost: the digital side divides
    it out, and with it the signal against the noise (iris-like 64 x 32
    tiles at a gain of 0.002, a 15.7 um beam waist: -27 dB SQNR, against
    17.5 dB at 10 um; the gain is folded into ``ProgrammedWeights.scale``)."""
    t_min = _check_mask(min_transmission, "split")
    if bits is None:
        return TOLERANCE
    return max(TOLERANCE, LEVEL_FRACTION * (1 - t_min) / converters.top_code(bits))


def pre_distort(v: np.ndarray, gain_rows: np.ndarray, optics: Optics, tiling: Tiling,
                min_transmission: float,
                scheme: str, *, tol: float = TOLERANCE,
                max_iter: int = MAX_ITERATIONS) -> np.ndarray:
    """Mask levels (rails, K, N) in [0, 1], not yet quantised, whose effective
    tile shows the normalised weights ``v`` (K, N) times ``gain_rows`` (the gain
    of each row's K-tile column, shape (K, N)); a ``gain_rows`` above
    :func:`gain`'s asks for more than the optics can show, and the levels are
    then clipped to [0, 1] short of it.

    Each tile is solved on its own, as the optics act within it alone, and
    iterates until none of its values moves by more than ``tol`` (at most
    ``max_iter`` times): a tile's mask depends on that tile's weights only.

    Raises
    ------
    ValueError
        For a ``scheme`` or ``min_transmission`` out of range, or ``v`` and
        ``gain_rows`` not finite arrays of the tiling's (K, N) (NaN came
        back as levels of NaN).
    """
    _check_mask(min_transmission, scheme)
    for name, a in (("v", v), ("gain_rows", gain_rows)):
        if not isinstance(a, np.ndarray) or a.shape != (tiling.k, tiling.n) \
                or not np.isfinite(a).all():
            got = f"shape {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
            raise ValueError(f"{name}: expected a finite array of the tiling's shape "
                             f"({tiling.k}, {tiling.n}), got {got}"
                             + (" with NaN or infinite values" if isinstance(a, np.ndarray)
                                and a.shape == (tiling.k, tiling.n) else ""))
    out = np.empty((2 if scheme == "split" else 1, *v.shape), dtype=v.dtype)
    for i in range(tiling.k_tiles):
        ks = tiling.k_slice(i)
        for j in range(tiling.n_tiles):
            ns = tiling.n_slice(j)
            tile = type(tiling)(ks.stop - ks.start, ns.stop - ns.start, tiling.tile_k,
                                tiling.tile_n)
            out[:, ks, ns] = _pre_distort_tile(v[ks, ns], gain_rows[ks, ns], optics, tile,
                                               min_transmission, scheme, tol, max_iter)
    return out


def _pre_distort_tile(v: np.ndarray, gain_rows: np.ndarray, optics, tile, min_transmission: float,
                      scheme: str, tol: float, max_iter: int) -> np.ndarray:
    """:func:`pre_distort` of one tile (``tile`` a one-tile ``Tiling``)."""
    dtype = v.dtype
    t_min = dtype.type(min_transmission)
    span = 1 - t_min
    n_rails = 2 if scheme == "split" else 1
    diag = np.broadcast_to(optics.diagonal(tile), (n_rails, *v.shape)).astype(dtype)
    if scheme == "split":
        target = v * gain_rows * span

        def mask(d):
            return np.stack([t_min + np.maximum(d, 0), t_min + np.maximum(-d, 0)])

        def step(d):
            effective = optics.apply(mask(d), tile)
            # d > 0 drives the positive rail, d < 0 the negative one.
            return (target - (effective[0] - effective[1])) / np.where(d >= 0, diag[0], diag[1])

        x, lo, hi = target / diag[0], -span, span
    else:
        target = (t_min + span * (v * gain_rows + 1) / 2)[None]

        def mask(t):
            return t

        def step(t):
            return (target - optics.apply(t, tile)) / diag

        x, lo, hi = target / diag, t_min, dtype.type(1)
    x = np.clip(x, lo, hi).astype(dtype)
    for _ in range(max_iter):
        moved = np.clip(x + step(x), lo, hi)
        change = float(np.max(np.abs(moved - x))) if x.size else 0.0
        x = moved
        if change < tol:
            break
    return (mask(x) - t_min) / span
