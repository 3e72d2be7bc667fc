"""One optical pass and the tiled optical matmul: the readable numpy reference.

``y = matmul(x, w, config, seed=...)`` computes ``x @ w`` the way the
hardware does. The (K, N) weight matrix is cut into ``core.inputs x
core.outputs`` tiles, each loaded on the mask once; every token passes through
every tile. One pass of a token through a tile:

1. the token's normalised inputs in [-1, 1] are encoded as one or two rails of
   source levels (each rail a separate pass) and DAC-quantised;
2. each source's light is scaled by its relative intensity noise;
3. the light of source j crosses mask row j; detector rail r of column n
   collects ``photons_per_mac * sum_j a_j T_rjn`` photoelectrons on average;
4. shot noise, dark counts and read noise; balanced rails are subtracted;
5. the ADC digitises each readout in the column's window (ENOB noise, clipping);
6. the digital side undoes the rail encodings and each K-tile's weight scales
   and accumulates the partial sums of the K-tiles in the working dtype.

All readouts are kept in units of full-scale MACs (photoelectrons divided by
``photons_per_mac``), so the ideal machine (``photons_per_mac = inf``) is the
same code with every noise term zero.

Noise comes from the counter-based generator in ``optical._rng`` keyed by
(seed, readout index): the output does not depend on ``chunk_tokens``.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np

from optical import _rng, kernels, outliers
from optical._gemm import row_block, rows_matmul
from optical._validation import (
    check_bool,
    check_float_array,
    check_nonnegative_int,
    check_operands,
    check_positive_int,
    check_seed,
    is_jax_value,
)
from optical.config import OpticalConfig, check_config
from optical.physics import converters, encoding, noise
from optical.quant import ProgrammedWeights, adc_rails, calibration_needs, program

__all__ = ["MatmulStats", "Schedule", "matmul", "schedule"]

#: Default bound on the float elements of one chunk's largest temporary.
_CHUNK_ELEMENTS = 1 << 22


@dataclasses.dataclass(frozen=True)
class Schedule:
    """What one optical matmul does on the hardware, counted from shapes alone.

    Attributes
    ----------
    tokens : int
        Input vectors (rows of the flattened ``x``).
    k_tiles, n_tiles : int
        Tiles along the reduction and the output dimension.
    input_passes : int
        Passes per token per tile (2 for split inputs, else 1).
    passes : int
        Optical passes: ``tokens * k_tiles * n_tiles * input_passes``.
    weight_loads : int
        Tiles written to the mask: ``k_tiles * n_tiles``.
    dac_conversions : int
        One per source per pass, for the rows a K-tile really has (a partial
        last tile's missing rows are dark): ``tokens * input_passes *
        n_tiles * K``, each input converted again for every N-tile.
    adc_conversions : int
        One per ADC rail per real column per pass: ``tokens * k_tiles *
        input_passes * N * adc_rails`` (2 for split weights read on
        unbalanced detectors, else 1).
    detector_readouts : int
        One per detector rail per real column per pass: ``tokens * k_tiles *
        input_passes * N * weight_rails`` (2 for split weights, else 1).
    macs : int
        Multiply-accumulates of the logical matmul, ``tokens * K * N``.
    """

    tokens: int
    k_tiles: int
    n_tiles: int
    input_passes: int
    passes: int
    weight_loads: int
    dac_conversions: int
    adc_conversions: int
    detector_readouts: int
    macs: int

    def to_dict(self) -> dict[str, float | int]:
        """Every count by its field name (the keys of ``MatmulStats`` they share)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class MatmulStats(Schedule):
    """A :class:`Schedule` plus what the data did on it.

    Attributes
    ----------
    detected_photons : float, photons
        Expected total of detected photons over the whole call: the sum of every
        readout's mean count (``inf`` for the ideal source). With RIN on, the
        mean given the sources' RIN draws, so it moves with the seed (~1e-4
        relative at iris-like's RIN); without RIN it depends on the inputs alone.
    mean_photoelectrons : float, electrons
        Mean photoelectrons per detector readout.
    clipped_fraction : float
        Fraction of ADC conversions that fell outside the window (a window
        of zero width, as "max" gives a column of zero weights, counts
        none; inputs clipped at a static DAC range are counted in
        ``dac_clipped_fraction``).
    digital_channels : int
        Input channels multiplied digitally (``outliers.policy``). With a
        static bypass their mask rows are not programmed, and the counts above
        are those of the optical part, ``schedule(tokens, K - digital_channels, N)``.
    digital_macs : int
        Multiply-accumulates done digitally, ``tokens * digital_channels * N``.
    digital_mac_fraction : float
        ``digital_channels / K``: the share of the logical matmul's MACs done digitally.
    dac_clipped_fraction : float
        Fraction of the DAC conversions whose input lay beyond a static input
        range (``dac.scaling`` "static", or a programmed ``input_range``) and
        was clipped to its end: the inputs the optics carry, each counted once
        per conversion of it. 0 under abs-max scaling, which clips nothing.
        Counted on the host as ``|x / range| > 1`` in ``x``'s dtype, the same
        on every backend (JAX's pass, which multiplies by a reciprocal, may
        clip a value within an ulp of the range otherwise: no output moves).
    """

    detected_photons: float = 0.0
    mean_photoelectrons: float = 0.0
    clipped_fraction: float = 0.0
    digital_channels: int = 0
    digital_macs: int = 0
    digital_mac_fraction: float = 0.0
    dac_clipped_fraction: float = 0.0


def schedule(tokens: int, k: int, n: int, config: OpticalConfig) -> Schedule:
    """Count the passes, loads and conversions of a (tokens, k) @ (k, n) matmul.

    The same counting :func:`matmul` reports in its stats, without running it,
    for the channels the optics carry: with static outlier channels bypassing
    the optics (``outliers.policy = "static"``), a run reports fewer DAC
    conversions and MACs, since its bypassed channels are known only from
    the data (the dynamic policy keeps the schedule's counts: the whole
    matrix stays on the mask, the outlier inputs zeroed there).

    Parameters
    ----------
    tokens, k, n : int
        Rows of the input, its features (the weights' rows), and the weights'
        columns; non-negative.
    config : OpticalConfig
        Sets the core's tile (``core.inputs`` x ``core.outputs``) and the rails
        of the encodings and the ADCs.

    Returns
    -------
    Schedule
        Passes, weight loads, DAC and ADC conversions, detector readouts and
        MACs.

    Raises
    ------
    TypeError
        ``config`` is not an OpticalConfig.
    ValueError
        ``tokens``, ``k`` or ``n`` is not a non-negative integer.
    """
    check_config(config)
    tokens, k, n = (check_nonnegative_int(value, name)
                    for name, value in (("tokens", tokens), ("k", k), ("n", n)))
    k_tiles = -(-k // config.core.inputs)
    n_tiles = -(-n // config.core.outputs)
    n_in = encoding.n_rails(config.encoding.inputs)
    n_det = encoding.n_rails(config.encoding.weights)
    n_adc = adc_rails(config).shape[0]
    return Schedule(
        tokens=tokens, k_tiles=k_tiles, n_tiles=n_tiles, input_passes=n_in,
        passes=tokens * k_tiles * n_tiles * n_in, weight_loads=k_tiles * n_tiles,
        dac_conversions=tokens * n_in * n_tiles * k,
        adc_conversions=tokens * k_tiles * n_in * n * n_adc,
        detector_readouts=tokens * k_tiles * n_in * n * n_det, macs=tokens * k * n,
    )


def input_scale(x2: np.ndarray, policy: str) -> np.ndarray:
    """Per-token scale that maps each row of ``x2`` into [-1, 1] (shape (T,)):
    its abs-max, 0 for an all-zero row (the digital side multiplies the
    readouts by it, so such a token's output is exactly 0, whatever its
    units; it is encoded as zeros, see :func:`_divisor`)."""
    if policy == "per_token":
        absmax = np.max(np.abs(x2), axis=1)
    elif policy == "per_tensor":
        absmax = np.full(x2.shape[0], np.max(np.abs(x2)) if x2.size else 0.0)
    else:
        raise ValueError(f"dac.scaling: {policy!r} is not valid")
    return absmax.astype(x2.dtype)


def dac_clipped(x2: np.ndarray, input_range: float | None) -> int:
    """How many entries of ``x2`` a static input range clips: those whose
    normalised value ``x / input_range`` lies beyond [-1, 1] (0 for
    ``input_range`` None: abs-max scaling clips nothing)."""
    if input_range is None or not x2.size:
        return 0
    return int(np.count_nonzero(np.abs(x2 / x2.dtype.type(input_range)) > 1))


def _divisor(scale: np.ndarray) -> np.ndarray:
    """What the inputs are divided by: ``scale``, with 1 for a zero scale
    (an all-zero token, whose normalised input is then 0)."""
    return np.where(scale > 0, scale, 1).astype(scale.dtype)


def _check_calibrates_on(shape: tuple[int, ...], x: np.ndarray | None,
                        needs: list[str]) -> None:
    """Raw weights are calibrated on the call's own ``x`` for the settings
    ``needs``: ValueError for an ``x`` without tokens or, when its values are
    known (``x`` not None; a traced one is not), without a non-zero entry."""
    if not needs:
        return
    what = ("holds no tokens" if math.prod(shape[:-1]) == 0 else
            "is all zero" if x is not None and x.size and not np.any(x) else None)
    if what is not None:
        raise ValueError(f"x: shape {tuple(shape)} {what}, and {' and '.join(needs)} is "
                         "calibrated on x when w is raw weights; program w with held-out "
                         "inputs (optical.program(w, config, calibration=...)) and pass "
                         "the result")


def matmul(x: np.ndarray, w: np.ndarray | ProgrammedWeights, config: OpticalConfig, *,
           seed: int, return_stats: bool = False, chunk_tokens: int | None = None,
           backend: str = "auto",
           exact: bool = False) -> np.ndarray | tuple[np.ndarray, MatmulStats]:
    """``x @ w`` on the optical core.

    Parameters
    ----------
    x : ndarray, shape (..., K), float32 or float64
    w : ndarray, shape (K, N), or ProgrammedWeights
        Raw weights are programmed on every call; pass the result of
        :func:`optical.program` to program once and stream many inputs. With
        raw weights, the settings that need calibration inputs (a static input
        range, calibrated ADC windows, static outlier channels; see
        :func:`optical.quant.calibration_needs`) are calibrated on ``x``
        itself, an optimistic oracle: program with held-out calibration inputs
        for the mapping a deployed machine would have. With outlier channels
        (``outliers.policy``) those rows are multiplied digitally.
    config : OpticalConfig
    seed : int
        In [0, 2**64) ([0, 2**32) on the JAX backend, whose keys are 32-bit);
        the output is a function of (x, w, config, seed). The noise is keyed
        by (seed, each token's row, column): two calls of one seed draw the
        same noise for their row 0, row 1, ..., whatever their inputs (on
        iris-like without an ADC, noise correlated 0.999 between two
        unrelated inputs). Give each call its
        own seed when streaming batches whose noise should be independent
        (``chunk_tokens`` keeps each row's own noise; row blocks passed as
        separate calls of one seed do not).
    return_stats : bool
        Also return a :class:`MatmulStats`.
    chunk_tokens : int, optional
        Tokens processed at a time (memory bound; rounded up to a multiple of
        the GEMM row block); does not change the result on the numpy and
        numba backends (the numba one works in fixed blocks of tokens
        whatever it says). On the JAX backend it is the jitted chunk's size:
        the noise is the same, XLA's float32 rounding may differ (see
        :func:`optical.kernels.jax_backend.matmul`).
    backend : {"auto", "numpy", "numba", "jax"}
        Where it runs (see :mod:`optical.kernels`): "numpy" is the readable
        reference; "auto" takes "jax" for JAX arrays, else "numba" (or
        "numpy" for cores of fewer than ``kernels.MIN_FAST_TILE`` weights).
    exact : bool
        On the numba backend, reproduce the reference's noise draw for draw
        rather than in distribution (to float32 rounding of the means: a
        Poisson count above a mean of 10 whose mean is an ulp off can be
        redrawn, a few outputs in 1e4 at 1e3 photons per MAC; none in
        float64 where measured); on numba and JAX, compute the shot noise of
        balanced rails without the low-rank approximation and draw every
        noise separately (slower; JAX's draws still differ from the
        reference's, in distribution alike). The numpy backend is always exact.

    Returns
    -------
    y : ndarray (a jax.Array on the JAX backend), shape (..., N), dtype of ``x``
        (which ``w`` must share)
    stats : MatmulStats, if ``return_stats``

    Raises
    ------
    TypeError
        ``x`` or ``w`` not a float32/float64 array (or of different dtypes),
        ``config`` not an OpticalConfig, a seed that is not an integer, a
        non-bool ``exact`` or ``return_stats``; a JAX seed or a traced JAX
        ``w`` on the numpy or numba backend (they say ``backend='jax'``).
    ValueError
        Shapes that do not chain (``x``'s last axis is not ``w``'s K), NaN or
        inf in ``x`` or ``w``, a seed out of range, ``chunk_tokens`` < 1, an
        unknown or unavailable ``backend`` (or a JAX ``x`` given to the numpy
        or numba backend, which runs on the host), ``ProgrammedWeights`` programmed
        for another config, or raw weights whose calibration on ``x`` cannot
        work (e.g. an all-zero ``x``).

    Notes
    -----
    Gradients: on the JAX backend ``jax.grad`` with respect to ``x`` (and
    ``w``, when no setting needs calibration inputs) gives the
    straight-through estimate ``dL/dx = dL/dy @ W_eff.T``, with the
    quantisers taken as the identity and the noise as a constant; see
    :mod:`optical.kernels.jax_backend` for what is refused under tracing.
    The numpy and numba backends are not differentiable.

    Range: each K-tile's decoded sum is multiplied by its weight scale before
    the outputs take their input scale, so weights within a factor of ~K of
    the dtype's largest value (float32: |w| ~ 1e36 and up) can overflow to
    inf (NaN where two K-tiles' infinities meet) although ``x @ w`` fits, and
    subnormal weights lose digits; products beyond the dtype's range are inf,
    as in ``x @ w``.
    """
    check_config(config)
    return_stats = check_bool(return_stats, "return_stats")
    backend = kernels.resolve(backend, x, config)
    if backend == "jax":
        from optical.kernels import jax_backend
        return jax_backend.matmul(x, w, config, seed=seed, return_stats=return_stats,
                                  chunk_tokens=chunk_tokens, exact=exact)
    if is_jax_value(seed):  # (under vmap or jit: a tracer) numpy and numba take ints
        raise TypeError(f"seed: a JAX {type(seed).__name__} runs on the JAX backend alone, "
                        f"not {backend!r}: pass backend='jax' (or a JAX x, which "
                        "backend='auto' runs there)")
    if is_jax_value(w) and isinstance(w, sys.modules["jax"].core.Tracer):
        raise TypeError(f"w: a traced JAX value ({type(w).__name__}: jax.grad, jit or vmap "
                        f"with respect to w) runs on the JAX backend alone, not {backend!r}: "
                        "pass backend='jax'")
    seed = check_seed(seed)
    x = check_float_array(x, "x", min_ndim=1)
    if isinstance(w, ProgrammedWeights):
        w.check_compatible(config)
        check_operands(x.shape, x.dtype, w.shape[0], w.dtype)
        programmed = w
    else:
        w = check_float_array(w, "w", ndim=2)
        check_operands(x.shape, x.dtype, w.shape[0], w.dtype)  # before programming it
        # Settings that need calibration inputs are calibrated on this call's own
        # inputs: an oracle, the best calibration can do (held-out data: program()).
        needs = calibration_needs(config)
        _check_calibrates_on(x.shape, x, needs)
        programmed = program(w, config, calibration=x if needs else None, oracle=True)
    k, n = programmed.shape
    if chunk_tokens is not None:
        chunk_tokens = check_positive_int(chunk_tokens, "chunk_tokens")
    exact = check_bool(exact, "exact")
    if programmed.bypass is not None:  # outlier channels run digitally, the rest optically
        return outliers.bypass_matmul(
            x, programmed, config, return_stats=return_stats,
            optical=lambda xo, po: matmul(xo, po, config, seed=seed, return_stats=True,
                                          chunk_tokens=chunk_tokens, backend=backend,
                                          exact=exact))

    # C order: the reference's row sums of DAC levels (offset weights) would
    # otherwise add in another order for a Fortran-ordered float64 x.
    x2 = np.ascontiguousarray(x.reshape(-1, k))
    tokens = x2.shape[0]
    if programmed.input_range is None:
        scale = input_scale(x2, config.dac.scaling)
    else:
        scale = np.full(tokens, programmed.input_range, dtype=x.dtype)
    totals = np.zeros(3)  # detected photons, readouts, clipped ADC conversions
    if backend == "numba":
        from optical.kernels import numba_backend
        y = numba_backend.accumulate(x2, _divisor(scale), programmed, config, seed, totals,
                                     exact=exact)
    else:
        y = np.zeros((tokens, n), dtype=x.dtype)
        photons = np.zeros(tokens)  # per token, summed once at the end (chunking-independent)
        block = row_block(tokens)
        if chunk_tokens is None:
            rails = encoding.n_rails(config.encoding.weights)
            chunk_tokens = max(1, _CHUNK_ELEMENTS // (rails * min(n, config.core.outputs)))
        # Chunks start on GEMM row-block boundaries so that every row meets the
        # same GEMM whatever the chunking (see optical._gemm).
        chunk_tokens = -(-chunk_tokens // block) * block
        for start in range(0, tokens, chunk_tokens):
            stop = min(start + chunk_tokens, tokens)
            # Clipping only bites for a static input range: abs-max scaling is exact.
            xn = np.clip(x2[start:stop] / _divisor(scale[start:stop])[:, None], -1, 1)
            y[start:stop] = _accumulate(xn, start, block, programmed, config, seed, totals,
                                        photons[start:stop])
        if math.isfinite(totals[0]):
            totals[0] = np.add.reduce(photons)
    y *= scale[:, None]
    y = y.reshape(*x.shape[:-1], n)
    if not return_stats:
        return y
    stats = _stats(tokens, programmed, config, totals)
    if programmed.input_range is None or not x2.size:
        return y, stats
    return y, dataclasses.replace(
        stats, dac_clipped_fraction=dac_clipped(x2, programmed.input_range) / x2.size)


def _accumulate(xn: np.ndarray, t0: int, block: int, pw: ProgrammedWeights,
                config: OpticalConfig, seed: int, totals: np.ndarray,
                photons: np.ndarray) -> np.ndarray:
    """Sum over K-tiles of the decoded, rescaled readouts for a chunk of
    normalised inputs (the input scale is not yet applied); each token's
    detected photons are added to ``photons`` (T,)."""
    tiling = pw.tiling
    dtype = xn.dtype
    p = config.source.photons_per_mac
    t_min = config.mask.min_transmission
    in_coeffs, in_const = encoding.rail_coefficients(config.encoding.inputs)
    w_coeffs, w_const = encoding.rail_coefficients(config.encoding.weights)
    g = adc_rails(config)
    # ADC rail e carries sum_r g_er * rail_r; decoding weighs it by h_e so that
    # sum_e h_e g_er = c_r (the weight encoding's rail coefficients).
    h = np.asarray(w_coeffs) @ np.linalg.pinv(g)
    c_sum = float(np.sum(w_coeffs))
    n_in, n_det, n_adc = len(in_coeffs), g.shape[1], g.shape[0]
    rin = config.source.rin_sigma
    tokens_idx = np.arange(t0, t0 + xn.shape[0], dtype=np.uint64)[:, None]
    acc = np.zeros((xn.shape[0], tiling.n), dtype=dtype)

    for kt in range(tiling.k_tiles):
        ks = tiling.k_slice(kt)
        levels = converters.quantize_levels(encoding.encode(xn[:, ks], config.encoding.inputs),
                                            config.dac.bits)  # (n_in, T, k)
        part = np.zeros_like(acc)
        if in_const:
            part += dtype.type(in_const) * pw.weight_sums[kt][None, :]
        for s in range(n_in):
            a = levels[s]
            # Cast first: a buffered casting sum groups rows by buffer, not by row.
            a_sum = a.astype(np.float64).sum(axis=1)[:, None]
            pass_id = (tokens_idx * np.uint64(tiling.k_tiles) + np.uint64(kt)) \
                * np.uint64(n_in) + np.uint64(s)  # (T, 1)
            for nt in range(tiling.n_tiles):
                ns = tiling.n_slice(nt)
                cols = np.arange(ns.start, ns.stop, dtype=np.uint64)[None, :]
                a_pass = a
                if rin > 0:
                    rows = np.arange(ks.stop - ks.start, dtype=np.uint64)[None, :]
                    rin_idx = (pass_id * np.uint64(tiling.n_tiles) + np.uint64(nt)) \
                        * np.uint64(tiling.tile_k) + rows
                    a_pass = a * noise.rin_factors(rin, seed=seed, index=rin_idx).astype(dtype)
                mean = np.stack([rows_matmul(a_pass, pw.transmissions[r, ks, ns], block)
                                 for r in range(n_det)])
                readout_base = pass_id * np.uint64(tiling.n) + cols  # (T, n)
                det = _detect(mean, readout_base, n_det, p, config, seed, totals, photons)
                adc_in = np.einsum("er,rtn->etn", g, det)
                value = _digitise(adc_in, readout_base, pw.adc_lo[kt][:, ns],
                                  pw.adc_hi[kt][:, ns], n_adc, p, config, seed, totals)
                # Undo the weight encoding: sum_j a_j v_jn for this pass.
                z = np.einsum("e,etn->tn", h, value)
                z = (z - t_min * c_sum * a_sum) / (1 - t_min) + w_const * a_sum
                part[:, ns] += (in_coeffs[s] * z).astype(dtype)
        acc += part * pw.scale[kt][None, :]
    return acc


def _detect(mean: np.ndarray, base: np.ndarray, n_det: int, p: float,
            config: OpticalConfig, seed: int, totals: np.ndarray,
            photons: np.ndarray) -> np.ndarray:
    """Noisy detector rails (n_det, T, n) in full-scale-MAC units."""
    totals[1] += mean.size
    if not math.isfinite(p):
        totals[0] = math.inf
        return mean.astype(np.float64)
    electrons = np.maximum(mean.astype(np.float64), 0.0) * p
    photons += electrons.sum(axis=(0, 2))
    index = base[None] * np.uint64(n_det) + np.arange(n_det, dtype=np.uint64)[:, None, None]
    det = config.detector
    counts = noise.shot_noise(electrons, model=det.shot_noise, seed=seed, index=index)
    counts += noise.dark_noise(det.dark_electrons, model=det.shot_noise, seed=seed, index=index)
    return counts / p


def _digitise(adc_in: np.ndarray, base: np.ndarray, lo: np.ndarray, hi: np.ndarray,
              n_adc: int, p: float, config: OpticalConfig, seed: int,
              totals: np.ndarray) -> np.ndarray:
    """Read noise, ENOB noise and ADC quantisation of (n_adc, T, n) readouts."""
    index = base[None] * np.uint64(n_adc) + np.arange(n_adc, dtype=np.uint64)[:, None, None]
    if math.isfinite(p):
        adc_in = adc_in + noise.read_noise(config.detector.read_noise_electrons, seed=seed,
                                           index=index) / p
    bits = config.adc.bits
    if bits is None:
        return adc_in
    lo, hi = lo[:, None, :], hi[:, None, :]
    sigma = converters.enob_noise_std(lo, hi, bits, config.adc.enob)
    if np.any(sigma > 0):
        adc_in = adc_in + sigma * _rng.normal(_rng.stream_key(seed, _rng.STREAMS["adc"]), index)
    value, clipped = converters.adc_quantize(adc_in, lo, hi, bits)
    totals[2] += np.count_nonzero(clipped)
    return value


def _stats(tokens: int, pw: ProgrammedWeights, config: OpticalConfig,
           totals: np.ndarray) -> MatmulStats:
    counts = schedule(tokens, pw.tiling.k, pw.tiling.n, config)
    readouts, adc = counts.detector_readouts, counts.adc_conversions
    return MatmulStats(
        **counts.to_dict(),
        detected_photons=float(totals[0]),
        mean_photoelectrons=float(totals[0] / readouts) if readouts else 0.0,
        clipped_fraction=float(totals[2] / adc) if adc else 0.0,
    )
