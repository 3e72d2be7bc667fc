"""The CPU fast path: GEMMs in BLAS or XLA, everything per readout in numba.

``optical.matmul(x, w, config, seed=..., backend="numba")`` runs here. The
physics is that of the numpy reference (``optical.core``), rearranged so that
the only O(T K N) work is one GEMM per rail signal:

- inputs are scaled, encoded and DAC-quantised per K-tile, and multiplied by
  each source's RIN factor per pass (numba, :func:`_numba.source_light`);
- the mean ADC-rail readouts are GEMMs of that light with the transmissions
  (for balanced detection with the rail difference ``T+ - T-``, computed once
  per weight load);
- one fused numba loop per weight block adds the noise, digitises, decodes the
  rails and accumulates the K-tiles (:func:`_numba.readout_fast`).

Two modes:

``exact=False`` (the default): every Gaussian noise of an ADC readout is drawn
as one normal of the summed variance (exact in distribution); the shot-noise
variance of balanced rails comes from low-rank factors of ``T+ + T-``
(:func:`optical.kernels._fastpath.light_factors`, the only approximation,
tested against the exact product); RIN uses fast float32 Box-Muller pairs.
Poisson shot noise is always exact, draw for draw as the reference. The ADC
multiplies by the reciprocal of its step where the reference divides, so a
readout exactly half-way between two codes can round to the other one than
the reference's half-to-even (a code apart, at exact ties only, which
noise-free configs can meet; the JAX backend does the same).

``exact=True``: draw for draw the numpy reference: per-rail GEMMs and the
reference's streams and indices, so the two backends agree to float rounding
(an ADC code may differ where a readout lands within rounding of a code
boundary).

Tokens are processed in fixed blocks of :data:`BLOCK_TOKENS`, aligned to the
first token, and every random number is keyed by its absolute readout index,
so the output depends neither on ``chunk_tokens`` nor on the thread count.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from optical import _memory, _rng
from optical._gemm import row_block, rows_matmul
from optical.config import OpticalConfig
from optical.kernels import _fastpath
from optical.physics import converters
from optical.quant import ProgrammedWeights, adc_rails

if TYPE_CHECKING:
    from optical.core import MatmulStats

__all__ = ["BLOCK_TOKENS", "GEMMS", "accumulate", "engine_matmul", "matmul"]

#: Tokens per block: the unit of every GEMM, fixed so results never depend on chunking.
BLOCK_TOKENS = 1024

#: Stream of the fast path's combined Gaussian readout noise (beside ``_rng.STREAMS``).
COMBINED_STREAM = 6

#: GEMM engines: "blas" (numpy's BLAS) or "xla" (JAX's CPU GEMM, when JAX is installed).
GEMMS = ("auto", "blas", "xla")

# Below this many weights per tile, BLAS is faster than a call into XLA.
_XLA_MIN_TILE = 128 * 128



def matmul(x: np.ndarray, w: np.ndarray | ProgrammedWeights, config: OpticalConfig, *,
           seed: int, return_stats: bool = False, chunk_tokens: int | None = None,
           exact: bool = False) -> np.ndarray | tuple[np.ndarray, MatmulStats]:
    """``optical.matmul(..., backend="numba")``: see :func:`optical.matmul`."""
    from optical.core import matmul as core_matmul

    return core_matmul(x, w, config, seed=seed, return_stats=return_stats,
                       chunk_tokens=chunk_tokens, backend="numba", exact=exact)


def xla_available() -> bool:
    """Whether JAX is installed with its CPU backend (its CPU GEMM is then
    used for float32; ``JAX_PLATFORMS`` may leave the CPU out)."""
    return importlib.util.find_spec("jax") is not None and _host_cpu() is not None


@functools.cache
def _host_cpu():
    """JAX's host CPU device, or None where JAX starts without it."""
    import jax

    try:
        return jax.devices("cpu")[0]
    except Exception:  # noqa: BLE001 - JAX_PLATFORMS=cuda: RuntimeError or AssertionError
        return None


def _choose_gemm(gemm: str, dtype: np.dtype, pw: ProgrammedWeights) -> str:
    if gemm not in GEMMS:
        raise ValueError(f"gemm: {gemm!r} is not valid; valid: {', '.join(map(repr, GEMMS))}")
    if gemm == "xla" and not xla_available():
        raise ValueError("gemm: 'xla' needs JAX with its CPU backend; install optical[jax] "
                         "(and keep 'cpu' in JAX_PLATFORMS)")
    if gemm == "xla" and dtype != np.float32:
        raise ValueError("gemm: 'xla' runs float32 only (JAX without x64); use 'blas'")
    if gemm != "auto":
        return gemm
    tile = min(pw.tiling.tile_k, pw.tiling.k) * min(pw.tiling.tile_n, pw.tiling.n)
    return "xla" if _xla_pays(dtype, tile) else "blas"


def _xla_pays(dtype: np.dtype, weights: int) -> bool:
    """Whether "auto" takes XLA for a GEMM of ``dtype`` against ``weights`` weights."""
    return dtype == np.float32 and weights >= _XLA_MIN_TILE and xla_available()


# --------------------------------------------------------------------------- #
# Per weight load: the plan
# --------------------------------------------------------------------------- #


class _Plan:
    """Everything derived from a programmed matrix for one mode and GEMM engine.

    ``signals[kt][nt]`` are the weight blocks whose GEMMs give the readout
    means: the ADC rails (fast mode: ``T+ - T-`` for balanced detection, else
    each rail) or the detector rails (exact mode, Poisson shot noise).
    """

    def __init__(self, pw: ProgrammedWeights, exact: bool, engine: str) -> None:
        cfg = pw.config
        self.tiling = tl = pw.tiling
        self.dec = dec = _fastpath.Decoding.of(cfg)
        p = cfg.source.photons_per_mac
        self.finite = math.isfinite(p)
        self.poisson = cfg.detector.shot_noise == "poisson" and self.finite
        self.exact = exact or self.poisson
        # The low-rank shot variance is accurate where the offset light dominates
        # (offset-encoded inputs); split inputs take the exact rails.
        self.low_rank = (not self.exact and dec.balanced and self.finite
                         and cfg.encoding.inputs == "offset")
        self.g = np.ones((1, 1)) if self.low_rank else adc_rails(cfg)
        self.engine = engine
        put = _put_xla if engine == "xla" else (lambda a: a)
        t = pw.transmissions
        # Noise-free balanced rails: their difference is all the ADC needs.
        use_diff = self.low_rank or (not self.exact and not self.finite and dec.balanced)
        if use_diff:
            self.g = np.ones((1, 1))
        # The plan lives in _fastpath's cache until the transmissions die, so it
        # holds no view of them (nor a device array that may alias them): BLAS
        # takes each rail's view per call (:meth:`blocks`), XLA a copy.
        self.rail_views = not use_diff and engine != "xla"
        self.signals: list[list[list]] = []
        self.rowsum: list[list[np.ndarray]] = []
        self.factors: list[tuple[np.ndarray, np.ndarray]] = []
        for kt in range(tl.k_tiles):
            ks = tl.k_slice(kt)
            if use_diff:  # T+ - T-, row sums and T+ + T-'s column sums in one pass
                blocks, row_r, colsum = _balanced_rails(t, ks, tl)
                row_s = [[put(b)] for b in blocks]
            else:
                row_s = ([] if self.rail_views else
                         [[put(np.array(t[r, ks, ns])) for r in range(dec.n_det)]
                          for ns in map(tl.n_slice, range(tl.n_tiles))])
                row_r = [t[:, ks, ns].sum(axis=(0, 2), dtype=np.float64)
                         for ns in map(tl.n_slice, range(tl.n_tiles))]
            self.signals.append(row_s)
            self.rowsum.append(row_r)
            if self.low_rank:
                if _fastpath.LIGHT_RANK == 1:
                    rows = ks.stop - ks.start
                    left, right = _fastpath.mean_factors(colsum / rows, rows)
                else:
                    left, right = _fastpath.light_factors(t[0, ks] + t[1, ks])
                self.factors.append((np.ascontiguousarray(left.T), right))

    def blocks(self, t: np.ndarray, kt: int, nt: int) -> list:
        """The weight blocks of tile (kt, nt), ``t`` the transmissions planned."""
        if not self.rail_views:
            return self.signals[kt][nt]
        ks, ns = self.tiling.k_slice(kt), self.tiling.n_slice(nt)
        return [t[r, ks, ns] for r in range(self.dec.n_det)]


#: Columns per task of the one-pass plan kernel (a few tasks even for one N-tile).
_PLAN_CHUNK = 256


def _balanced_rails(t: np.ndarray, ks: slice, tl) -> tuple[list, list, np.ndarray]:
    """K-tile ``ks`` of the rail pair ``t`` (2, K, N): the C-contiguous blocks
    ``T+ - T-`` of every N-tile, each N-tile's row sums of both rails (float64),
    and the column sums of ``T+ + T-`` (float64): :func:`_numba.balanced_rails`."""
    from optical.kernels import _numba

    rows = ks.stop - ks.start
    chunks, offsets = [], [0]
    for nt in range(tl.n_tiles):
        ns = tl.n_slice(nt)
        chunks += [(n0, min(n0 + _PLAN_CHUNK, ns.stop), nt, ns.start)
                   for n0 in range(ns.start, ns.stop, _PLAN_CHUNK)]
        offsets.append(offsets[-1] + rows * (ns.stop - ns.start))
    chunks = np.array(chunks, dtype=np.int64)
    offsets = np.array(offsets, dtype=np.int64)
    diff = _memory.empty(int(offsets[-1]), t.dtype)
    rowpart = np.empty((len(chunks), rows))
    colsum = np.zeros(t.shape[2])
    _numba.balanced_rails(np.ascontiguousarray(t), ks.start, ks.stop, chunks, offsets, diff,
                          rowpart, colsum)
    blocks, row_r = [], []
    for nt in range(tl.n_tiles):
        ns = tl.n_slice(nt)
        blocks.append(diff[offsets[nt]:offsets[nt + 1]].reshape(rows, ns.stop - ns.start))
        row_r.append(rowpart[chunks[:, 2] == nt].sum(axis=0))
    return blocks, row_r, colsum


def _put_xla(block: np.ndarray):
    """``block`` on the host's CPU device: this is the CPU backend, whatever
    JAX's default device (a GPU would take every block there and back)."""
    import jax

    return jax.device_put(np.ascontiguousarray(block), _host_cpu())


_XLA_GEMM: dict[int, Callable] = {}
#: XLA's CPU GEMM takes another path for a few rows (here up to 50), whose
#: last bits differ: its operands get at least this many rows, zero-padded.
XLA_MIN_ROWS = 64
#: Above XLA_MIN_ROWS, rows are padded to powers of two up to this, then to
#: multiples of it: a handful of shapes to compile, not one per token count.
_XLA_ROW_STEP = 256


def xla_rows(rows: int) -> int:
    """The rows an XLA GEMM of ``rows`` rows is run with (zero-padded)."""
    if rows <= _XLA_ROW_STEP:
        return max(XLA_MIN_ROWS, 1 << (rows - 1).bit_length())
    return -(-rows // _XLA_ROW_STEP) * _XLA_ROW_STEP


def _xla_padded(a: np.ndarray) -> np.ndarray:
    """``a`` (rows, k), C-contiguous, zero-padded to :func:`xla_rows` rows."""
    rows = xla_rows(a.shape[0])
    if rows == a.shape[0]:
        return np.ascontiguousarray(a)
    padded = np.zeros((rows, a.shape[1]), dtype=a.dtype)
    padded[:a.shape[0]] = a
    return padded


def _xla_gemm(n: int) -> Callable:
    if n not in _XLA_GEMM:
        import jax
        import jax.numpy as jnp

        # Full float32 products wherever it runs (a GPU's default is TF32).
        hp = jax.lax.Precision.HIGHEST
        _XLA_GEMM[n] = jax.jit(lambda a, *ws: jnp.stack([jnp.matmul(a, w, precision=hp)
                                                         for w in ws]))
    return _XLA_GEMM[n]


def engine_matmul(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """``a @ b`` (2-D) on the engine ``accumulate(gemm="auto")`` would take for
    these operands: XLA's GEMM for float32 when JAX is installed and ``b``
    has at least 128 x 128 entries (rows zero-padded as the fast path's,
    :func:`xla_rows`: the result then fixed per install), else BLAS in fixed
    row blocks of ``block`` (:func:`optical._gemm.rows_matmul`)."""
    if a.dtype == b.dtype and _xla_pays(b.dtype, b.size):
        # Indexed on the host: indexing the device array is a dispatch of its own.
        out = _xla_gemm(1)(_put_xla(_xla_padded(a)), _put_xla(b))
        return np.asarray(out)[0, :a.shape[0]]
    return rows_matmul(a, b, block)


def _gemm(plan: _Plan, light: np.ndarray, blocks: list, out: np.ndarray) -> np.ndarray:
    """Mean readouts (len(blocks), rows, nn) of ``light`` through the weight blocks."""
    if plan.engine == "xla":
        means = np.asarray(_xla_gemm(len(blocks))(_put_xla(_xla_padded(light)), *blocks))
        return means if means.shape[1] == light.shape[0] else \
            np.ascontiguousarray(means[:, :light.shape[0]])
    # Fixed row blocks, one BLAS thread each: OpenBLAS's last bits otherwise
    # depend on its thread count (optical._gemm).
    rows = row_block(light.shape[0])
    for i, block in enumerate(blocks):
        out[i] = rows_matmul(light, block, rows)
    view = out.view()
    view.flags.writeable = False
    return view


# --------------------------------------------------------------------------- #
# The tiled matmul
# --------------------------------------------------------------------------- #


def _check_accumulate(x2: object, scale: object, pw: object, config: OpticalConfig,
                      totals: object) -> None:
    """What :func:`accumulate` needs of its arguments before its compiled loops
    index them: TypeError or ValueError naming the argument."""
    if not isinstance(pw, ProgrammedWeights):
        raise TypeError(f"pw: expected ProgrammedWeights, got {type(pw).__name__}")
    if config is not pw.config:  # (optical.matmul has compared them: ~0.2 ms, not twice)
        pw.check_compatible(config)
    for name, a, ndim in (("x2", x2, 2), ("scale", scale, 1), ("totals", totals, 1)):
        if not isinstance(a, np.ndarray) or a.ndim != ndim:
            raise TypeError(f"{name}: expected a {ndim}-d numpy array, got "
                            + (f"shape {a.shape}" if isinstance(a, np.ndarray)
                               else type(a).__name__))
    if x2.dtype != pw.dtype or scale.dtype != pw.dtype:
        raise TypeError(f"x2 ({x2.dtype}) and scale ({scale.dtype}) must have the "
                        f"programmed weights' dtype, {pw.dtype}")
    if x2.shape[1] != pw.tiling.k:
        raise ValueError(f"x2 has {x2.shape[1]} features but the programmed weights "
                         f"have {pw.tiling.k} optical rows")
    if scale.shape != (x2.shape[0],):
        raise ValueError(f"scale has shape {scale.shape}; expected ({x2.shape[0]},), "
                         "one per token of x2")
    if totals.shape != (3,) or totals.dtype != np.float64 or not totals.flags.writeable:
        raise ValueError(f"totals must be a writeable float64 array of shape (3,), got "
                         f"{totals.dtype} {totals.shape}")


def accumulate(x2: np.ndarray, scale: np.ndarray, pw: ProgrammedWeights, config: OpticalConfig,
               seed: int, totals: np.ndarray, *, exact: bool = False,
               gemm: str = "auto") -> np.ndarray:
    """Sum over K-tiles of the decoded, rescaled readouts of every token (the
    input scale not yet applied): the numba counterpart of the reference's
    per-chunk ``_accumulate``, over all tokens at once.

    ``x2`` (T, K) holds the tokens and ``scale`` (T,) the divisor of each
    (its input range; :func:`optical.matmul` passes them C-ordered and
    checked); both of ``pw``'s dtype, with ``K = pw.tiling.k``.
    ``totals`` (3,) float64 gets the detected photons [0] and the clipped
    conversions [2] added to it. The compiled loops index these arrays
    unchecked, so their shapes and dtypes are checked here (ValueError,
    TypeError), and ``pw`` against ``config``.
    """
    from optical.kernels import _numba

    _check_accumulate(x2, scale, pw, config, totals)

    dtype = x2.dtype
    engine = _choose_gemm(gemm, dtype, pw)
    plan = _fastpath.derived(pw, ("numba", bool(exact), engine, pw.config),
                             lambda p: _Plan(p, bool(exact), engine))
    # ADC windows are read from pw at every call (calibration may replace them).
    adc_lo, adc_hi, enob_std, top = _fastpath.adc_noise(pw)
    tl, dec = plan.tiling, plan.dec
    src, det = config.source, config.detector
    p = src.photons_per_mac
    dac_top = dtype.type(converters.top_code(config.dac.bits))
    offset_inputs = config.encoding.inputs == "offset"
    keys = np.array([_rng.stream_key(seed, _rng.STREAMS[s])
                     for s in ("shot", "dark", "read", "adc", "rin")], dtype=np.uint64)
    combined_key = _rng.stream_key(seed, COMBINED_STREAM)
    rin = src.rin_sigma
    inv_p = 1.0 / p if plan.finite else 0.0
    w_sum = pw.weight_sums.astype(dtype, copy=False)
    w_scale = pw.scale.astype(dtype, copy=False)
    if plan.finite:
        dark_var = (2 if dec.balanced else 1) * det.dark_electrons * inv_p**2
        var_const = np.full(dec.n_adc, dark_var + (det.read_noise_electrons * inv_p) ** 2)
    else:
        var_const = np.zeros(dec.n_adc)
    enob_var = enob_std ** 2
    empty_p, empty_r = np.zeros((0, 0)), np.zeros((0, 0))

    x2 = np.ascontiguousarray(x2)
    tokens, n = x2.shape[0], tl.n
    y = np.zeros((tokens, n), dtype=dtype)
    photons = np.zeros(tokens)
    clipped = np.zeros(tokens, dtype=np.int64)
    for b0 in range(0, tokens, BLOCK_TOKENS):
        b1 = min(b0 + BLOCK_TOKENS, tokens)
        tb = b1 - b0
        xb, sb, yb = x2[b0:b1], scale[b0:b1], y[b0:b1]
        clip_b = np.zeros(tb, dtype=np.int64)
        light_rows = np.zeros(dec.n_in * tb)
        for kt in range(tl.k_tiles):
            ks = tl.k_slice(kt)
            kk = ks.stop - ks.start
            levels = np.empty((dec.n_in, tb, kk), dtype=dtype)
            a_sum = np.empty((dec.n_in, tb))
            left_t, right = plan.factors[kt] if plan.low_rank else (empty_p, empty_r)
            p_low = np.empty((dec.n_in * tb, left_t.shape[0]))
            _numba.encode_levels(xb, ks.start, sb, offset_inputs, dac_top, levels, a_sum, left_t,
                                 p_low)
            light = np.empty((dec.n_in * tb, kk), dtype=dtype)
            for nt in range(tl.n_tiles):
                ns = tl.n_slice(nt)
                nn = ns.stop - ns.start
                _numba.source_light(levels, light, plan.rowsum[kt][nt], light_rows, keys[4], rin,
                                    plan.exact, b0, tl.k_tiles, kt, tl.n_tiles, nt, tl.tile_k)
                if plan.finite:
                    photons[b0:b1] += light_rows.reshape(dec.n_in, tb).sum(axis=0)
                blocks = plan.blocks(pw.transmissions, kt, nt)
                out = np.empty((len(blocks), dec.n_in * tb, nn), dtype=dtype)
                means = _gemm(plan, light, blocks, out)
                lo = np.ascontiguousarray(adc_lo[kt][:, ns])
                hi = np.ascontiguousarray(adc_hi[kt][:, ns])
                common = (w_sum[kt, ns], w_scale[kt, ns], yb, clip_b)
                decode = (dec.h, dec.t_min, dec.c_sum, dec.w_const, dec.in_coeffs, dec.in_const,
                          b0, tl.k_tiles, kt, n, ns.start)
                if plan.exact:
                    _numba.readout_exact(
                        means, a_sum, lo, hi, np.ascontiguousarray(enob_std[kt][:, ns]),
                        *common, np.uint64(seed), keys[:4], float(p), det.dark_electrons,
                        det.read_noise_electrons, plan.poisson, dec.balanced, top, *decode)
                else:
                    p_arg, r_arg = empty_p, empty_r
                    if plan.low_rank:
                        p_arg, r_arg = p_low, np.ascontiguousarray(right[:, ns])
                    step = (hi - lo) / top if top else np.zeros_like(lo)
                    inv_step = np.divide(1.0, step, out=np.zeros_like(step), where=step > 0)
                    _numba.readout_fast(
                        means, plan.g, p_arg, r_arg, a_sum, lo, step, inv_step,
                        np.ascontiguousarray(enob_var[kt][:, ns]), var_const, *common,
                        combined_key, inv_p, top, *decode)
        clipped[b0:b1] += clip_b
    if plan.finite:
        totals[0] += p * photons.sum()
    elif x2.shape[0]:  # infinite photons, but only where light was sent (as numpy)
        totals[0] = math.inf
    totals[2] += clipped.sum()
    return y
