"""The optical matmul in JAX: ``jit``, GPU, ``vmap`` over seeds and noise levels,
straight-through gradients.

``optical.matmul(x, w, config, seed=...)`` with a JAX array ``x`` runs here,
as does :func:`matmul` below, which also accepts a traced ``seed`` and
traced noise ``params`` so that sweeps run in one process::

    f = lambda s: jax_backend.matmul(x, w, cfg, seed=s)
    ys = jax.jit(jax.vmap(f))(jnp.arange(8))                       # 8 seeds
    g = lambda p: jax_backend.matmul(x, w, cfg, seed=0,
                                     params={"source.photons_per_mac": p})
    ys = jax.vmap(g)(jnp.array([10.0, 100.0, 1000.0]))            # 3 photon budgets

The physics is that of the numpy reference (``optical.core``) in the same
fast-path form as the numba backend: one GEMM per signal rail, the Gaussian
noises of a readout drawn as one normal, the shot noise of balanced rails from
the low-rank factors of ``T+ + T-`` unless ``exact=True``. Random numbers come
from ``jax.random`` (threefry) keyed by (seed, noise, token), so a token's
noise does not depend on the other tokens or on ``chunk_tokens``; the draws
differ from the numpy and numba backends', which agree with these in
distribution. The token is its index within the call: ``vmap`` over ``x``
makes each lane a call of its own, so lanes given one seed draw the same
noise. Pass a batch as leading axes of ``x`` instead (shape (B, T, K)), or
fold the lane's index into its seed.

Gradients (``jax.grad`` with respect to ``x`` and ``w``) are the
straight-through estimate: the backward pass treats every quantiser (DAC,
mask, ADC rounding and clipping) and the programming of the mask as the
identity and the noise as a constant, so ``dL/dx = dL/dy @ W_eff.T`` and
``dL/dw = x.T @ dL/dy``, with ``W_eff`` the linear map that the programmed
machine computes without noise and converters (``w`` up to the mask's
quantisation and crosstalk). The rule is a JVP (``dy = dx W_eff + x dw``), so
forward mode (``jax.jvp``, ``jacfwd``) and higher orders (``jax.hessian``)
follow it too: second derivatives are those of that linear map, not of the
quantisers' zero or clipped slopes. A traced ``w`` needs rule-based programming:
settings calibrated on example inputs (calibrated ADC windows, a static input
range, static outlier channels) are refused for it; with those, differentiate
``x`` with ``w`` programmed once (:class:`~optical.ProgrammedWeights` are
constants, not differentiable).

Weights are programmed on the host by :func:`optical.program` (once per
:class:`~optical.ProgrammedWeights`; through ``jax.pure_callback`` when ``w``
is traced), so the mask physics has one source of truth.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

try:
    import jax
    import jax.numpy as jnp
except ImportError as err:  # the module is documented: name the extra, not a bare import
    raise ImportError(f"optical's JAX backend needs JAX ({err}): pip install "
                      "'optical[jax]'") from err

from optical._validation import (
    check_bool,
    check_float_array,
    check_float_dtype,
    check_operands,
    check_positive_int,
    check_seed,
    is_jax_value,
)
from optical.config import OpticalConfig, check_config
from optical.kernels._jax_pass import (
    CHUNK_TOKENS,
    PARAMS,
    Static,
    device_arrays,
    emulate,
    noise_params,
    run_chunks,
    static_of,
    traced_arrays,
)
from optical.quant import (
    ProgrammedWeights,
    calibration_needs,
    program,
)

__all__ = ["PARAMS", "matmul", "matmul_runs"]

# --------------------------------------------------------------------------- #
# The public entry point
# --------------------------------------------------------------------------- #

_TRACED_W_CALIBRATION = (
    "w is traced (jax.grad or jit with respect to w), and {} is set from calibration inputs "
    "when the weights are programmed, which a traced w cannot be here. To differentiate w, use "
    "rule-based settings (adc.full_scale='max' or 'rms', dac.scaling other than 'static', "
    "outliers.policy='none'); to keep these settings, differentiate x only, with w programmed "
    "once (optical.program(numpy.asarray(w), config, calibration=...)) and passed concrete")
_TRACED_X_CALIBRATION = (
    "x is traced (jax.jit, grad or vmap with respect to x), and {} is calibrated on x when w "
    "is raw weights, which needs x's values. Program w once outside the trace with held-out "
    "numpy inputs (optical.program(w, config, calibration=...)) and pass the "
    "ProgrammedWeights, or use rule-based settings (adc.full_scale='max' or 'rms', "
    "dac.scaling other than 'static', outliers.policy='none')")
_DYNAMIC_BYPASS = ("outliers.policy = 'dynamic': the JAX backend runs only a static bypass "
                   "(its channels fix the shapes under jit); use outliers.policy='static', or "
                   "backend='numba' or 'numpy'")


def matmul(x: Any, w: Any, config: OpticalConfig, *, seed: Any, return_stats: bool = False,
           chunk_tokens: int | None = None, exact: bool = False,
           params: Mapping[str, Any] | None = None) -> Any:
    """``x @ w`` on the optical core, in JAX (see the module docstring).

    Parameters
    ----------
    x : jax.Array or ndarray, shape (..., K), float32 (float64 with ``jax_enable_x64``)
    w : ndarray or jax.Array, shape (K, N), or ProgrammedWeights
        A traced ``w`` (under ``jax.grad``/``jit``) is programmed on the host,
        by rule only (no setting that needs calibration inputs).
    config : OpticalConfig
    seed : int in [0, 2**32) or an integer JAX scalar (traced: ``vmap`` over seeds)
    return_stats : bool
        Also return a :class:`optical.MatmulStats` (not under ``jit``).
    chunk_tokens : int, optional
        Tokens per jitted chunk (default 512). Every token draws from its own
        keys, so the noise does not depend on it; XLA's GEMMs of other shapes
        may round differently (float32 ulps, rarely a moved ADC code), and
        under ``shot_noise="poisson"`` with means of 10 or more photons a
        mean one ulp off can flip ``jax.random.poisson``'s rejection test:
        that count is drawn anew (a few % of the outputs of one 300 x 160 x
        100 product at 1e3 photons per MAC moved, each by about one shot-noise
        standard deviation; the law is the same, the draw is not). Each
        chunk shape (the last chunk holds the remainder) compiles once per
        process and stays compiled, as ``jax.jit`` keeps it.
    exact : bool
        Compute the shot noise of balanced rails exactly (no low-rank factors)
        and draw every noise separately.
    params : mapping of str to float or traced scalar, optional
        Values for the numeric fields in :data:`PARAMS`, overriding ``config``;
        when they enter the ADC windows' rule (``adc.full_scale`` "max" or
        "rms"), the windows are re-derived from them. Calibrated windows
        (``adc.full_scale = "calibrated"``) stay as programmed, at
        ``config``'s noise: ``params`` then model a machine run at noise other
        than it was calibrated at (a 64 x 512 x 256 Gaussian product on
        iris-like programmed at 1e5 photons per MAC and run at ``params``
        1e2 scores -12 dB, against -26 dB calibrated at 1e2); to recalibrate
        at each level, program ``config.replace(...)`` per level instead, as
        ``optical.matmul`` requires (the sweep's vmap executor batches only
        the seeds of such configs). They can be traced (``vmap`` over noise
        levels) but not differentiated: the backward pass treats the noise
        as a constant, so ``jax.grad`` with respect to them is 0.

    Returns
    -------
    y : jax.Array, shape (..., N)
    stats : MatmulStats, if ``return_stats``

    Notes
    -----
    Concrete arguments are checked as :func:`optical.matmul` checks them;
    traced ones cannot be: a traced seed is taken modulo 2**32, traced
    ``params`` are not range-checked, and a NaN in a traced ``x`` propagates
    to its token's output (to every token's with ``dac.scaling =
    "per_tensor"``, whose scale it sets). A traced ``w`` is checked on the
    host as it is programmed: JAX reports that ValueError inside its
    callback's error. XLA on the CPU flushes subnormal float32 values
    to zero, so inputs or weight scales below ``numpy.finfo(float32).tiny``
    (1.2e-38) read as 0 here (the numpy and numba backends keep them), and
    scales within a few decades of it lose accuracy too, since the products
    the pass forms of them fall below it (weights of ~1e-37 under wang-2022
    without noise or quantisation: 3.9e-3 relative error, 7.4e-6 on numba).
    """
    from optical.core import MatmulStats, _check_calibrates_on, dac_clipped, schedule

    check_config(config)
    exact = check_bool(exact, "exact")
    return_stats = check_bool(return_stats, "return_stats")
    if chunk_tokens is not None:
        chunk_tokens = check_positive_int(chunk_tokens, "chunk_tokens")
    # Whether x's values are known: a numpy x closed over by a jitted function
    # is, although jnp.asarray turns it into a tracer there.
    x_traced = isinstance(x, jax.core.Tracer)
    x_values = None if x_traced else x
    x = _check_x(x)
    dtype = np.dtype(x.dtype)
    if isinstance(seed, jax.Array):
        if not jnp.issubdtype(seed.dtype, jnp.integer) or seed.ndim:
            raise TypeError("seed: expected an integer scalar")
        if not isinstance(seed, jax.core.Tracer):
            seed = _jax_seed(int(seed))  # a concrete one: range-checked like an int
    else:
        seed = _jax_seed(seed)
    varied = frozenset(params or ())
    param_values = noise_params(config, params)
    traced_w = isinstance(w, jax.core.Tracer)
    if isinstance(w, ProgrammedWeights):
        w.check_compatible(config)
        pw, shape, input_range = w, w.shape, w.input_range
    elif traced_w:
        if w.ndim != 2:
            raise ValueError(f"w: expected 2 dimensions, got shape {w.shape}")
        check_float_dtype(w.dtype, "w")  # as a concrete w is checked
        if calibration_needs(config):
            raise ValueError(_TRACED_W_CALIBRATION.format(' and '.join(calibration_needs(config))))
        if config.outliers.policy == "dynamic":
            raise ValueError(_DYNAMIC_BYPASS)
        pw, shape, input_range = None, tuple(w.shape), None
    else:
        # A JAX w as its numpy value; a list or a torch tensor refused, as numpy
        # and numba refuse it (not converted on this backend alone).
        if is_jax_value(w):
            w = np.asarray(w)
        elif not isinstance(w, np.ndarray):
            raise TypeError(f"w: expected a JAX or numpy array, got {type(w).__name__}")
        w_np = check_float_array(w, "w", ndim=2)
        if 0 in w_np.shape:
            raise ValueError(f"w: shape {w_np.shape} has an empty dimension")
        check_operands(x.shape, x.dtype, w_np.shape[0], w_np.dtype)  # before programming
        # As optical.matmul: what needs calibration inputs is calibrated on x itself.
        needs = calibration_needs(config)
        if needs and x_traced:
            raise ValueError(_TRACED_X_CALIBRATION.format(" and ".join(needs)))
        _check_calibrates_on(tuple(x.shape), None if x_traced else np.asarray(x_values), needs)
        calibration = np.asarray(x_values).reshape(-1, w_np.shape[0]) if needs else None
        pw = program(w_np, config, calibration=calibration, oracle=True)
        shape, input_range = pw.shape, pw.input_range
    if pw is not None and pw.bypass is not None:
        if pw.bypass.channels is None:
            raise ValueError(_DYNAMIC_BYPASS)
        return _static_bypass(x, pw, config, seed=seed, return_stats=return_stats,
                              chunk_tokens=chunk_tokens, exact=exact, params=params)
    k, n = shape
    check_operands(x.shape, dtype, k, pw.dtype if pw is not None else w.dtype)
    st = static_of(shape, config, exact, varied, dtype)
    prog = traced_arrays(w, config, st) if traced_w else device_arrays(pw, st)
    w2 = w if traced_w else prog["w_eff"]
    x2 = x.reshape(-1, k)
    scale = _input_scale(x2, st, input_range)
    seed_arr = jnp.asarray(seed, dtype=jnp.uint32)
    y, photons, clipped = emulate(st, chunk_tokens or CHUNK_TOKENS, x2, w2, prog,
                                   param_values, scale, seed_arr)
    y = y.reshape(*x.shape[:-1], n)
    if not return_stats:
        return y
    if isinstance(y, jax.core.Tracer):
        raise ValueError("return_stats: not available under jit/vmap/grad; call eagerly")
    counts = schedule(x2.shape[0], k, n, config)
    readouts, adc = counts.detector_readouts, counts.adc_conversions
    # The source's photons per MAC as run: params override the config's.
    per_mac = float((params or {}).get("source.photons_per_mac",
                                       config.source.photons_per_mac))
    photons = float(np.asarray(photons, dtype=np.float64).sum()) \
        if math.isfinite(per_mac) or not x2.shape[0] else math.inf  # none sent: 0, as numpy
    return y, MatmulStats(
        **counts.to_dict(), detected_photons=photons,
        mean_photoelectrons=photons / readouts if readouts else 0.0,
        clipped_fraction=float(clipped) / adc if adc else 0.0,
        # x comes to the host only where a static range can clip it
        dac_clipped_fraction=dac_clipped(np.asarray(x2), input_range) / x2.size
        if x2.size and input_range is not None else 0.0)


def _input_scale(x2, st: Static, input_range: float | None):
    """Per-token input scale: static, or abs-max per token / tensor (no
    gradient); 0 for an all-zero token, whose output is then exactly 0."""
    if input_range is not None:
        return np.full(x2.shape[0], input_range, dtype=x2.dtype)
    # A concrete x in numpy (exact alike): as jax ops they compile once per token count.
    lib = jnp if isinstance(x2, jax.core.Tracer) else np
    x2 = x2 if lib is jnp else np.asarray(x2)
    absmax = lib.max(lib.abs(x2), initial=0) * lib.ones(x2.shape[0], x2.dtype) \
        if st.per_tensor else lib.max(lib.abs(x2), axis=1)  # (initial: no tokens, no error)
    return jax.lax.stop_gradient(absmax.astype(x2.dtype)) if lib is jnp else \
        absmax.astype(x2.dtype)


def matmul_runs(x: np.ndarray, pw: ProgrammedWeights, config: OpticalConfig, *,
                seeds: Sequence[int], params: Mapping[str, Any] | None = None,
                chunk_tokens: int | None = None, exact: bool = False
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Many runs of one programmed matmul in a single ``vmap``: one per seed,
    each with its own values of the numeric noise fields in ``params``.

    Parameters
    ----------
    x : ndarray, shape (tokens, K), float32 (float64 with ``jax_enable_x64``)
    pw : ProgrammedWeights
        Programmed for ``config`` (static outlier bypass allowed).
    config : OpticalConfig
    seeds : sequence of int, length R
    params : mapping of str to sequence of float, optional
        For paths in :data:`PARAMS`: one value per run (length R). The same
        keys must be given for every call whose results are to be compared:
        they decide which fields are traced (and so which ADC windows are
        re-derived on the device).
    chunk_tokens : int, optional
        Tokens per jitted chunk of each run, as in :func:`matmul`.
    exact : bool
        As in :func:`matmul`: the shot noise of balanced rails exactly, every
        noise drawn separately.

    Returns
    -------
    ys : ndarray, shape (R, tokens, N)
    photons, clipped : ndarray, shape (R,)
        Detected photons and clipped ADC conversions of each run.
    """
    check_config(config)
    exact = check_bool(exact, "exact")
    if not isinstance(pw, ProgrammedWeights):
        raise TypeError(f"pw: expected ProgrammedWeights, got {type(pw).__name__}")
    if chunk_tokens is not None:
        chunk_tokens = check_positive_int(chunk_tokens, "chunk_tokens")
    x = check_float_array(x, "x", ndim=2)
    check_operands(x.shape, x.dtype, pw.shape[0], pw.dtype)
    if x.dtype == np.float64 and not jax.config.jax_enable_x64:
        raise TypeError("x: float64 needs jax.config.update('jax_enable_x64', True); "
                        "cast to float32 or enable x64 (nothing is cast silently)")
    seeds = _check_seeds(seeds)
    params = dict(params or {})
    for path, values in params.items():
        if path not in PARAMS:
            raise ValueError(f"params: {path!r} cannot be varied here; valid: {', '.join(PARAMS)}")
        if np.ndim(values) != 1 or len(values) != seeds.size:
            raise ValueError(f"params[{path!r}]: expected a sequence of {seeds.size} values "
                             f"(one per seed), got {np.shape(values)}")
    for r in range(seeds.size):  # every run's values in range, naming the path
        config.replace({path: float(values[r]) for path, values in params.items()})
    params = {p: np.asarray(v, dtype=np.float32) for p, v in params.items()}
    digital = None
    if pw.bypass is not None:
        if pw.bypass.channels is None:
            raise ValueError("outliers.policy = 'dynamic' cannot be batched; use 'static'")
        digital = x[:, pw.bypass.channels] @ pw.bypass.weights
        x = np.ascontiguousarray(x[:, pw.bypass.optical_channels])
        pw = dataclasses.replace(pw, bypass=None)
    pw.check_compatible(config)
    st = static_of(pw.shape, config, exact, frozenset(params), x.dtype)
    prog = device_arrays(pw, st)
    x2 = jnp.asarray(x)
    scale = _input_scale(x2, st, pw.input_range)
    names = tuple(params)

    def one(seed, *values):
        run_params = noise_params(config, dict(zip(names, values, strict=True)))
        return run_chunks(st, x2, prog, run_params, scale, seed, chunk_tokens or CHUNK_TOKENS)

    ys, photons, clipped = jax.vmap(one)(jnp.asarray(seeds),
                                        *(jnp.asarray(params[p]) for p in names))
    ys = np.asarray(ys)
    if digital is not None:
        ys = ys + digital[None].astype(ys.dtype)
    return ys, np.asarray(photons, dtype=np.float64).sum(axis=-1), \
        np.asarray(clipped, dtype=np.int64)


def _check_seeds(seeds) -> np.ndarray:
    """``matmul_runs``'s seeds: a non-empty sequence of ints in [0, 2**32)."""

    if isinstance(seeds, (str, bytes)) or not hasattr(seeds, "__len__") or np.ndim(seeds) != 1:
        raise TypeError(f"seeds: expected a sequence of ints, got {type(seeds).__name__}")
    if len(seeds) == 0:
        raise ValueError("seeds: empty; give at least one seed")
    return np.asarray([_jax_seed(seed, "seeds") for seed in seeds], dtype=np.uint32)


def _jax_seed(seed: object, name: str = "seed") -> int:
    """:func:`optical._validation.check_seed`, below the JAX keys' 2**32."""
    if isinstance(seed, jax.Array) and not isinstance(seed, jax.core.Tracer) \
            and jnp.issubdtype(seed.dtype, jnp.integer) and seed.ndim == 0:
        seed = int(seed)  # a concrete JAX integer (an item of jnp.arange(n))
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool) and seed < 0:
        raise ValueError(f"{name}: {seed} is negative; valid for the JAX backend: [0, 2**32)")
    seed = check_seed(seed, name)
    if seed >= 2**32:
        raise ValueError(f"{name}: {seed} is out of range for the JAX backend; "
                         "valid: [0, 2**32)")
    return seed


def _static_bypass(x, pw: ProgrammedWeights, config: OpticalConfig, *, return_stats: bool,
                   **kwargs):
    """``x @ w`` with the calibrated outlier channels multiplied digitally, as
    :func:`optical.outliers.bypass_matmul` does for the other backends."""
    bypass = pw.bypass
    out = matmul(jnp.take(x, jnp.asarray(bypass.optical_channels), axis=-1),
                 dataclasses.replace(pw, bypass=None), config, return_stats=return_stats,
                 **kwargs)
    y, stats = out if return_stats else (out, None)
    if bypass.channels.size:
        # In full float32 (a GPU's default would round through TF32, as the
        # pass's own GEMMs say), its operands behind a barrier: XLA folded a
        # closed-over x's product while compiling (a traced seed moved 388 of
        # 1200 outputs' last bits against the eager call, 177 since). Those
        # 177 are the sum's: under an outer jit XLA contracts it with the
        # pass's last multiplication (an FMA, one rounding for two), which no
        # barrier stops (docs/ARCHITECTURE.md).
        digital, weights = jax.lax.optimization_barrier(
            (jnp.take(x, jnp.asarray(bypass.channels), axis=-1),
             jnp.asarray(bypass.weights, dtype=y.dtype)))
        y = y + jnp.matmul(digital, weights, precision=jax.lax.Precision.HIGHEST)
    if not return_stats:
        return y
    tokens = int(np.prod(x.shape[:-1]))
    return y, dataclasses.replace(
        stats, digital_channels=int(bypass.channels.size),
        digital_macs=tokens * int(bypass.channels.size) * int(y.shape[-1]),
        digital_mac_fraction=bypass.channels.size / bypass.k)


def _check_x(x):
    """x as a JAX array of a float dtype JAX can hold, finite where concrete."""
    if isinstance(x, np.ndarray):
        check_float_array(x, "x", min_ndim=1)
        if x.dtype == np.float64 and not jax.config.jax_enable_x64:
            raise TypeError("x: float64 needs jax.config.update('jax_enable_x64', True); "
                            "cast to float32 or enable x64")
        return jnp.asarray(x)
    if not isinstance(x, jax.Array):
        raise TypeError(f"x: expected a JAX or numpy array, got {type(x).__name__}")
    check_float_dtype(x.dtype, "x")
    if x.ndim < 1:
        raise ValueError(f"x: expected at least 1 dimension, got shape {x.shape}")
    if not isinstance(x, jax.core.Tracer):
        finite = np.isfinite(np.asarray(x))
        if not finite.all():
            raise ValueError(f"x: contains {finite.size - np.count_nonzero(finite)} NaN or "
                             "infinite value(s)")
    return x
