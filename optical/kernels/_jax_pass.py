"""The traced forward pass of the JAX backend (see :mod:`optical.kernels.jax_backend`):
the static structure that keys ``jax.jit``, the programmed weights as device
arrays (or derived from a traced ``w``), the noise parameters (traced, so
``vmap``-able), the token chunks of one pass with their noise keyed by token,
and the straight-through derivatives."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from optical import _rng
from optical.config import OpticalConfig
from optical.kernels import _fastpath
from optical.physics import converters, encoding
from optical.quant import (
    _UNIFORM_INPUT_MOMENTS,
    ProgrammedWeights,
    adc_rails,
    program,
)

#: Numeric config fields that ``params`` may set (traced, so ``vmap``-able).
PARAMS = ("source.photons_per_mac", "source.rin_db_per_hz", "source.rin_bandwidth",
          "detector.dark_electrons", "detector.read_noise_electrons", "adc.enob_loss",
          "adc.headroom")

#: Default tokens per jitted chunk (bounds the memory of the noise arrays).
CHUNK_TOKENS = 512

_STREAM_READOUT = 6


# --------------------------------------------------------------------------- #
# Static structure and host-side programming
# --------------------------------------------------------------------------- #


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything that fixes shapes and control flow (hashable: a jit key)."""

    # The matrix's rows: not part of the jit key, which the padded rows
    # (``k_tiles * tile_k``) fix; the chunk masks the rows past ``k`` (traced),
    # so matrices whose K differs within a tile share one program (an outlier
    # bypass leaves another K per calibration: a compile per seed and layer).
    k: int = dataclasses.field(compare=False)
    n: int
    # The core's inputs and outputs, or the matrix's K and N where smaller: a
    # matrix smaller than the core fills its first rows and outputs, so its
    # arrays (and noise draws) are not padded to the core's size. (What the
    # core's size does to the light is in the programmed transmissions; the
    # counts of passes and conversions come from ``optical.core.schedule``.)
    tile_k: int
    tile_n: int
    k_tiles: int
    n_tiles: int
    offset_inputs: bool
    n_in: int
    n_det: int
    n_adc: int
    balanced: bool
    # Whether the converters quantise; their codes (``2**bits - 1``) are
    # traced (``params``), so that a sweep over ``dac.bits`` or ``adc.bits``
    # reuses one compiled pass (each value compiled its own, ~4 s).
    dac: bool
    adc: bool
    poisson: bool
    exact: bool
    low_rank: bool
    use_diff: bool
    rin: bool
    windows: str  # "programmed", "max" or "rms": where the ADC windows come from
    window_per_tile: bool  # re-derived windows shared by each tile's columns
    per_tensor: bool
    h: tuple[float, ...]
    # 1 / contrast: a continuous config value, so not part of the jit key (a
    # contrast sweep compiled a program per value); the pass reads it from
    # the programmed arrays (``t_min_c``, ``t_span``).
    t_min: float = dataclasses.field(compare=False)
    c_sum: float
    w_const: float
    in_coeffs: tuple[float, ...]
    in_const: float
    g: tuple[tuple[float, ...], ...]
    dtype: str


def static_of(shape: tuple[int, int], config: OpticalConfig, exact: bool, varied: frozenset,
            dtype: np.dtype) -> Static:
    # A static input range reaches the jitted code as the scale array, not as part
    # of this key: a new range (each programming) must not recompile.
    dec = _fastpath.Decoding.of(config)
    k, n = shape
    finite = math.isfinite(config.source.photons_per_mac) or "source.photons_per_mac" in varied
    poisson = config.detector.shot_noise == "poisson" and finite
    window_fields = {"source.photons_per_mac", "source.rin_db_per_hz", "source.rin_bandwidth",
                     "detector.dark_electrons", "detector.read_noise_electrons", "adc.headroom"}
    # Varied noise re-derives the rule-based windows; calibrated ones stay as programmed.
    rule = config.adc.full_scale in ("max", "rms")
    windows = config.adc.full_scale if rule and varied & window_fields else "programmed"
    # As in the numba backend: low-rank shot variance only for offset-encoded inputs.
    low_rank = (not (exact or poisson) and dec.balanced and finite
                and config.encoding.inputs == "offset")
    return Static(
        k=k, n=n, tile_k=min(k, config.core.inputs), tile_n=min(n, config.core.outputs),
        k_tiles=-(-k // config.core.inputs), n_tiles=-(-n // config.core.outputs),
        offset_inputs=config.encoding.inputs == "offset",
        n_in=dec.n_in, n_det=dec.n_det, n_adc=dec.n_adc, balanced=dec.balanced,
        dac=config.dac.bits is not None, adc=config.adc.bits is not None,
        poisson=poisson, exact=exact or poisson,
        low_rank=low_rank, use_diff=low_rank or (not exact and not finite and dec.balanced),
        rin=config.source.rin_sigma > 0 or bool(varied & {"source.rin_db_per_hz"}),
        windows=windows, window_per_tile=config.adc.window == "per_tile",
        per_tensor=config.dac.scaling == "per_tensor",
        h=tuple(float(v) for v in dec.h), t_min=dec.t_min, c_sum=dec.c_sum,
        w_const=dec.w_const, in_coeffs=tuple(float(v) for v in dec.in_coeffs),
        in_const=dec.in_const, g=tuple(tuple(float(v) for v in r) for r in adc_rails(config)),
        dtype=np.dtype(dtype).name)


def _pad_n(a: np.ndarray, st: Static) -> np.ndarray:
    return np.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, st.n_tiles * st.tile_n - a.shape[-1])])


def _host_arrays(pw: ProgrammedWeights, st: Static) -> dict[str, np.ndarray]:
    """The programmed matrix as the arrays the jitted forward needs (numpy),
    built one K-tile at a time in float64: whole-matrix float64 temporaries
    peaked at 17x the weights' bytes (3.8 GB for a 4096 x 14336 matrix)."""
    dt = np.dtype(st.dtype)
    g = np.array(st.g)
    trans = pw.transmissions
    n_sig = 1 if st.use_diff else trans.shape[0]
    np_ = st.n_tiles * st.tile_n
    sig = np.zeros((st.k_tiles, st.n_tiles, n_sig, st.tile_k, st.tile_n), dt)
    rowsum = np.zeros((st.k_tiles, st.n_tiles, st.tile_k), dt)
    w_eff = np.empty((st.k, st.n), dt)
    # The machine's noise-free linear map, for the straight-through derivatives.
    coeffs, const = encoding.rail_coefficients(pw.config.encoding.weights)
    lefts, rights = [], []
    floor, ceiling, csum, csq, det_g2 = [], [], [], [], []
    for kt in range(st.k_tiles):
        k0 = kt * st.tile_k
        rows = min(st.tile_k, st.k - k0)  # the last K-tile may be partial
        t = trans[:, k0:k0 + rows].astype(np.float64)
        tp = np.zeros((t.shape[0], st.tile_k, np_))  # zero-padded to whole tiles
        tp[:, :rows, :st.n] = t
        signals = (tp[0] - tp[1])[None] if st.use_diff else tp
        sig[kt] = signals.reshape(n_sig, st.tile_k, st.n_tiles, st.tile_n).transpose(2, 0, 1, 3)
        rowsum[kt] = tp.sum(axis=0).reshape(st.tile_k, st.n_tiles, st.tile_n).sum(axis=2).T
        decoded = (np.tensordot(np.asarray(coeffs), t, axes=1) - st.t_min * st.c_sum) \
            / (1 - st.t_min) + const
        w_eff[k0:k0 + rows] = decoded * pw.scale[kt]
        if st.low_rank:
            # The K-tile's own rows: the column mean over the zero-padded rows
            # would dilute the light's variance, and the padded rows, dark on
            # the mask, get no light factor.
            real, right = _fastpath.light_factors(tp[0, :rows] + tp[1, :rows])
            left = np.zeros((st.tile_k, real.shape[1]))
            left[:rows] = real
            lefts.append(left)
            rights.append(right)
        if st.windows != "programmed":
            combined = np.einsum("er,rkn->ekn", g, t)
            floor.append(np.minimum(combined, 0).sum(axis=1))
            ceiling.append(np.maximum(combined, 0).sum(axis=1))
            csum.append(combined.sum(axis=1))
            csq.append(np.square(combined).sum(axis=1))
            det_g2.append(np.square(g) @ t.sum(axis=1))
        del t, tp, signals, decoded
    out = {
        "sig": sig,  # (kt, nt, sig, tile_k, tile_n)
        "rowsum": rowsum,  # (kt, nt, tile_k)
        "lo": _pad_n(pw.adc_lo, st).astype(dt),
        "hi": _pad_n(pw.adc_hi, st).astype(dt),
        "w_sum": _pad_n(pw.weight_sums, st).astype(dt),
        "scale": _pad_n(pw.scale, st).astype(dt),
        "w_eff": w_eff,
        # The decoding's constants, rounded as the compiled constants were.
        "t_min_c": np.asarray(st.t_min * st.c_sum, dt),
        "t_span": np.asarray(1 - st.t_min, dt),
    }
    if st.low_rank:
        out["left"] = np.stack(lefts).astype(dt)
        out["right"] = np.stack(rights).astype(dt)
    if st.windows != "programmed":
        for name, arr in (("floor", floor), ("ceiling", ceiling), ("csum", csum),
                          ("csq", csq), ("det_g2", det_g2)):
            out[name] = _pad_n(np.stack(arr), st).astype(dt)
    return out


def device_arrays(pw: ProgrammedWeights, st: Static) -> dict[str, jax.Array]:
    def build(p: ProgrammedWeights) -> dict[str, jax.Array]:
        # Concrete even when first asked for under jit: the cache outlives the trace.
        with jax.ensure_compile_time_eval():
            return {k: jnp.asarray(v) for k, v in _host_arrays(p, st).items()}

    return _fastpath.derived(pw, ("jax", st, pw.config), build,
                             arrays=("transmissions", "adc_lo", "adc_hi", "scale", "weight_sums"))


def traced_arrays(w: jax.Array, config: OpticalConfig, st: Static) -> dict[str, jax.Array]:
    """Program a traced weight matrix on the host (``jax.pure_callback``)."""
    example = _host_arrays(program(np.ones((st.k, st.n), np.dtype(st.dtype)), config), st)
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in example.items()}

    def host(w_value):
        return _host_arrays(program(np.asarray(w_value), config), st)

    return jax.pure_callback(host, shapes, jax.lax.stop_gradient(w), vmap_method="sequential")


# --------------------------------------------------------------------------- #
# The forward pass
# --------------------------------------------------------------------------- #


def noise_params(config: OpticalConfig, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    values = {p: config.get(p) for p in PARAMS}
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"params: expected a mapping of path to value, got "
                        f"{type(overrides).__name__}")
    concrete = {}
    for path, value in (overrides or {}).items():
        if path not in PARAMS:
            raise ValueError(f"params: {path!r} cannot be varied here; valid: {', '.join(PARAMS)}")
        if not isinstance(value, jax.core.Tracer):
            if isinstance(value, bool) or np.ndim(value) != 0 or not np.issubdtype(
                    np.asarray(value).dtype, np.number):
                raise TypeError(f"params: {path} = {value!r} is not a real number")
            concrete[path] = float(value)
        elif value.ndim != 0:  # vmap over a 2-D array leaves a vector per call
            raise TypeError(f"params: {path} is traced with shape {value.shape}; expected a "
                            "scalar (vmap over a 1-D array of values)")
        values[path] = value
    # Validates the ranges and the rules between fields (e.g. RIN), naming the paths.
    config.replace(concrete)
    p = jnp.asarray(values["source.photons_per_mac"], dtype=jnp.float32)
    # optical.physics.noise.rin_sigma's formula, traced (vmap over the RIN level)
    rin_var = 10.0 ** (jnp.asarray(values["source.rin_db_per_hz"], jnp.float32) / 10.0) \
        * values["source.rin_bandwidth"]
    return {"inv_p": 1.0 / p, "rin_sigma": jnp.sqrt(rin_var),
            "dark": jnp.asarray(values["detector.dark_electrons"], jnp.float32),
            "read": jnp.asarray(values["detector.read_noise_electrons"], jnp.float32),
            "enob_loss": jnp.asarray(values["adc.enob_loss"], jnp.float32),
            "headroom": jnp.asarray(values["adc.headroom"], jnp.float32),
            # The converters' top codes (exact in float32 up to MAX_BITS = 24;
            # 0 where a converter is ideal: Static.dac / adc say so).
            "dac_top": jnp.asarray(converters.top_code(config.dac.bits), jnp.float32),
            "adc_top": jnp.asarray(converters.top_code(config.adc.bits), jnp.float32)}


#: Mean count above which Poisson draws (shot and dark noise) are taken as
#: ``round(lam + sqrt(lam) N(0, 1))``: ``jax.random.poisson`` counts in int32
#: (it saturates at 2**31) and, in float32, overstates the variance from
#: about 1e6 on (by 3 %); the normal law's skewness error here is 1/256.
#: (The numpy reference and numba, exact in float64 much further, switch at
#: ``optical._rng.POISSON_NORMAL_ABOVE``.) Dark counts, whose mean is
#: subtracted, are drawn as deviations from it (``_token_poisson``).
POISSON_NORMAL_ABOVE = float(1 << 16)


def _token_normals(key, stream: int, t0, tokens: int, shape: tuple[int, ...], dtype):
    """Standard normals of shape (tokens, *shape), each token's from its own key."""
    base = jax.random.fold_in(key, stream)
    ids = t0 + jnp.arange(tokens, dtype=jnp.uint32)
    return jax.vmap(lambda t: jax.random.normal(jax.random.fold_in(base, t), shape, dtype))(ids)


def _token_poisson(key, stream: int, t0, lam, deviation: bool = False):
    """Poisson counts of means ``lam`` (tokens first), each token's from its own
    key; means above :data:`POISSON_NORMAL_ABOVE` draw ``round(lam + sqrt(lam) N(0, 1))``.

    ``deviation``: return ``counts - lam`` instead (dark counts, whose mean is
    subtracted). From 2**24 on in float32 (2**53 in float64) the count is
    rounded to the mean's spacing (2 or more), so ``counts - lam`` would keep
    that rounding rather than the noise (none at all once ``sqrt(lam)`` is
    below half the spacing, from about 1e14). There the mean is a whole
    number and the deviation is ``round(sqrt(lam) N(0, 1))`` itself; below,
    exactly ``counts - lam``.
    """
    base = jax.random.fold_in(key, stream)
    ids = t0 + jnp.arange(lam.shape[0], dtype=jnp.uint32)
    whole = float(2 ** (jnp.finfo(lam.dtype).nmant + 1))  # every integer below is exact

    def draw(t, m):
        token = jax.random.fold_in(base, t)
        counts = jax.random.poisson(token, jnp.minimum(m, POISSON_NORMAL_ABOVE),
                                    dtype=jnp.int32).astype(m.dtype)
        z = jax.random.normal(jax.random.fold_in(token, 1), m.shape, m.dtype)
        spread = jnp.sqrt(m) * z
        counts = jnp.where(m > POISSON_NORMAL_ABOVE, jnp.round(m + spread), counts)
        if not deviation:
            return counts
        return jnp.where(m < whole, counts - m, jnp.round(spread))

    # Vmapped over every token, jax.random.poisson's while loops carry their
    # whole state for all of them (~39 readout-sized arrays, 13.6 GB for a
    # Llama-3.1-8B up_proj chunk): map over batches of tokens instead. Each
    # token's draw depends only on its own key, so the batching moves none.
    return jax.lax.map(lambda args: draw(*args), (ids, lam), batch_size=_POISSON_BATCH)


#: Tokens whose Poisson draws run vmapped together (see _token_poisson).
_POISSON_BATCH = 16


def _windows(st: Static, prog, params):
    """ADC windows (kt, n_adc, Np): as programmed, or re-derived from the
    (possibly traced) noise parameters by the rule of ``optical.quant``."""
    if st.windows == "programmed":
        return prog["lo"], prog["hi"]
    if st.windows == "max":
        return _shared_per_tile(st, prog["floor"], prog["ceiling"])
    mean_a, var_a = _UNIFORM_INPUT_MOMENTS["offset" if st.offset_inputs else "split"]
    inv_p = params["inv_p"]
    g2sum = jnp.asarray(np.square(np.array(st.g)).sum(axis=1))[None, :, None]
    mean = mean_a * prog["csum"]
    signal_var = var_a * prog["csq"]
    noise_sd = _root_sum_squares(
        params["rin_sigma"] * math.sqrt(var_a + mean_a**2) * jnp.sqrt(prog["csq"]),
        jnp.sqrt(mean_a * prog["det_g2"] * inv_p), jnp.sqrt(g2sum * params["dark"]) * inv_p,
        params["read"] * inv_p)
    half = params["headroom"] * _root_sum_squares(jnp.sqrt(signal_var), noise_sd)
    noise_half = params["headroom"] * noise_sd
    return _shared_per_tile(st, jnp.maximum(mean - half, prog["floor"] - noise_half),
                            jnp.minimum(mean + half, prog["ceiling"] + noise_half))


def _root_sum_squares(*deviations):
    """``sqrt(sum(d**2))`` of non-negative standard deviations, scaled by the
    largest: a deviation past float32's square root (1.8e19 readout units,
    e.g. a read noise that many times ``photons_per_mac``) does not overflow."""
    top = functools.reduce(jnp.maximum, deviations)
    finite = jnp.isfinite(top)  # an infinite deviation (read noise / photons past
    safe = jnp.where((top > 0) & finite, top, 1.0)  # float32) is the infinite sum
    return jnp.where(finite, top * jnp.sqrt(sum(jnp.square(d / safe) for d in deviations)),
                     top)


def _shared_per_tile(st: Static, lo, hi):
    """Per-column windows (kt, n_adc, Np), or with ``adc.window = "per_tile"``
    the union over each tile's real columns (as ``quant._share_windows``)."""
    if not st.window_per_tile:
        return lo, hi
    real = np.arange(st.n_tiles * st.tile_n) < st.n
    tiles = (*lo.shape[:-1], st.n_tiles, st.tile_n)
    lo = jnp.where(real, lo, jnp.inf).reshape(tiles).min(axis=-1, keepdims=True)
    hi = jnp.where(real, hi, -jnp.inf).reshape(tiles).max(axis=-1, keepdims=True)
    flat = (*tiles[:-2], st.n_tiles * st.tile_n)
    return (jnp.broadcast_to(lo, tiles).reshape(flat), jnp.broadcast_to(hi, tiles).reshape(flat))


def _adc(value, lo, hi, top, inv_top):
    step = (hi - lo) * inv_top
    safe = jnp.where(step > 0, step, 1.0)
    code = jnp.round((value - lo) / safe)
    clipped = ((code < 0) | (code > top)) & (step > 0)
    return lo + jnp.clip(code, 0, top) * jnp.where(step > 0, step, 0.0), clipped


def _chunk(st: Static, prog, params, x, scale, t0, seed, rows, cols):
    """y (T, N), the detected photons of each token (T,) and the clipped
    conversions of a chunk of tokens, of which the first ``rows`` (traced)
    are real and the rest zero padding, whose conversions are not counted.
    ``x`` holds the padded K (``k_tiles * tile_k`` columns), of which the
    first ``cols`` (traced) are the matrix's rows: the rest send no light.
    (Photons per token: the host adds them in float64, so that the total
    depends on the batching only through the float32 rounding of XLA's
    GEMMs.)"""
    # Where x and the weights are constants of an outer jit (closed over, the
    # seed traced), XLA would fold the noise-free part of the pass while
    # compiling, rounded otherwise than at run time: the barrier keeps every bit.
    x, scale, prog = jax.lax.optimization_barrier((x, scale, prog))
    dt = x.dtype
    hp = jax.lax.Precision.HIGHEST
    tokens = x.shape[0]
    kp = st.k_tiles * st.tile_k
    key = jax.random.key(seed, impl="threefry2x32")  # whatever the process default
    # x / scale, through the scale's mantissa after an exact power-of-two shift:
    # XLA computes a division as a multiplication by the reciprocal, which
    # flushes to zero for a scale past 1 / tiny (~8.5e37) and zeroed the token.
    mant, expo = jnp.frexp(jnp.where(scale > 0, scale, 1))  # zero tokens: 0
    xn = jnp.clip(jnp.ldexp(x, -expo[:, None]) / mant[:, None], -1, 1)
    if st.offset_inputs:
        a = ((xn + 1) / 2)[None]
    else:
        a = jnp.stack([jnp.maximum(xn, 0), jnp.maximum(-xn, 0)])
    if st.dac:
        # Times the reciprocal, as XLA computed the division by the compiled-in
        # code this replaces (so is the ADC's step): a true division moved
        # outputs by an ulp, and ADC codes with them, in 104 of 256 checks.
        dac_top = params["dac_top"].astype(dt)
        a = jnp.round(jnp.clip(a, 0, 1) * dac_top) * (1 / dac_top)
    a = jnp.where(jnp.arange(kp) < cols, a, 0).reshape(st.n_in, tokens, st.k_tiles, st.tile_k)
    a_sum = a.sum(axis=-1)  # (n_in, T, kt)
    if st.rin:
        z = _token_normals(key, _rng.STREAMS["rin"], t0, tokens,
                           (st.k_tiles, st.n_in, st.n_tiles, st.tile_k), dt)
        light = a[:, :, :, None, :] * jnp.maximum(  # light is never negative
            1 + params["rin_sigma"].astype(dt) * jnp.moveaxis(z, 2, 0), 0)
        means = jnp.einsum("stkmj,kmrjn->rstkmn", light, prog["sig"], precision=hp)
        photons = jnp.einsum("stkmj,kmj->t", light, prog["rowsum"], precision=hp)
    else:
        means = jnp.einsum("stkj,kmrjn->rstkmn", a, prog["sig"], precision=hp)
        photons = jnp.einsum("stkj,kmj->t", a, prog["rowsum"], precision=hp)
    np_ = st.n_tiles * st.tile_n
    means = means.reshape(means.shape[0], st.n_in, tokens, st.k_tiles, np_)
    lo, hi = _windows(st, prog, params)  # (kt, n_adc, Np)
    lo_b = jnp.moveaxis(lo, 1, 0)[:, None, None]  # (n_adc, 1, 1, kt, Np)
    hi_b = jnp.moveaxis(hi, 1, 0)[:, None, None]
    inv_p = params["inv_p"].astype(dt)
    enob_sd = jnp.zeros((), dt)
    if st.adc:  # (adc_top and inv_top are read again below, under the same test)
        adc_top = params["adc_top"].astype(dt)
        inv_top = 1 / adc_top
        step = (hi_b - lo_b) * inv_top
        enob_sd = step * jnp.sqrt((4.0 ** params["enob_loss"] - 1.0) / 12.0)
    shape = (st.k_tiles, st.n_in, st.n_adc, np_)
    if not st.exact:
        g = np.array(st.g)
        if st.low_rank:
            pl = jnp.einsum("stkj,kjr->stkr", a, prog["left"], precision=hp)
            shot = jnp.einsum("stkr,krn->stkn", pl, prog["right"], precision=hp)[None]
        elif st.use_diff:
            shot = jnp.zeros_like(means)  # noise-free
        else:
            shot = jnp.einsum("er,rstkn->estkn", jnp.asarray(np.square(g), dt),
                              jnp.maximum(means, 0), precision=hp)
            means = jnp.einsum("er,rstkn->estkn", jnp.asarray(g, dt), means, precision=hp)
        g2 = np.square(g).sum(axis=1)  # dark counts of each rail, per ADC
        sd = _root_sum_squares(
            jnp.sqrt(jnp.maximum(shot, 0) * inv_p),
            jnp.sqrt(jnp.asarray(g2, dt)[:, None, None, None, None] * params["dark"]) * inv_p,
            params["read"] * inv_p, enob_sd)
        z = _token_normals(key, _STREAM_READOUT, t0, tokens, shape, dt)
        value = means + sd * jnp.transpose(z, (3, 2, 0, 1, 4))
    else:
        det = means
        if st.poisson:
            # photons_per_mac = inf (a traced value) gives the means themselves.
            lit = inv_p > 0
            p = 1.0 / jnp.where(lit, inv_p, 1.0)
            lam = jnp.moveaxis(jnp.where(lit, jnp.maximum(means, 0) * p, 0.0), 2, 0)  # tokens first
            det = jnp.where(lit, _token_poisson(key, _rng.STREAMS["shot"], t0, lam) / p,
                            jnp.moveaxis(means, 2, 0))
            dark = _token_poisson(key, _rng.STREAMS["dark"], t0,
                                  jnp.broadcast_to(params["dark"], lam.shape), deviation=True)
            det = jnp.moveaxis(det + dark * inv_p, 0, 2).astype(dt)
        else:
            dshape = (st.k_tiles, st.n_in, st.n_det, np_)
            zs = _token_normals(key, _rng.STREAMS["shot"], t0, tokens, dshape, dt)
            zd = _token_normals(key, _rng.STREAMS["dark"], t0, tokens, dshape, dt)
            zs, zd = (jnp.transpose(v, (3, 2, 0, 1, 4)) for v in (zs, zd))
            det = (means + jnp.sqrt(jnp.maximum(means, 0) * inv_p) * zs
                   + jnp.sqrt(params["dark"]) * inv_p * zd)
        value = jnp.einsum("er,rstkn->estkn", jnp.asarray(np.array(st.g), dt), det,
                           precision=hp)
        zr = _token_normals(key, _rng.STREAMS["read"], t0, tokens, shape, dt)
        za = _token_normals(key, _rng.STREAMS["adc"], t0, tokens, shape, dt)
        zr, za = (jnp.transpose(v, (3, 2, 0, 1, 4)) for v in (zr, za))
        value = value + params["read"] * inv_p * zr + enob_sd * za
    clipped = jnp.zeros((), jnp.int32)
    if st.adc:
        value, clip = _adc(value, lo_b, hi_b, adc_top, inv_top)
        real = (jnp.arange(tokens) < rows)[:, None, None]  # the token axis of "estkn"
        clipped = (clip[..., :st.n] & real).sum(dtype=jnp.int32)
    # The rails' and passes' combinations too (a GPU's default precision
    # would round the readouts themselves through TF32's 10 mantissa bits).
    zsum = jnp.einsum("e,estkn->stkn", jnp.asarray(st.h, dt), value, precision=hp)
    a_sum = a_sum[..., None]
    z = (zsum - prog["t_min_c"] * a_sum) / prog["t_span"] + st.w_const * a_sum
    part = st.in_const * prog["w_sum"][None] + jnp.einsum(
        "s,stkn->tkn", jnp.asarray(st.in_coeffs, dt), z, precision=hp)
    y = jnp.einsum("tkn,kn->tn", part, prog["scale"], precision=hp)[:, :st.n]
    return y * scale[:, None], photons / params["inv_p"], clipped


_chunk_jit = jax.jit(_chunk, static_argnums=0)


#: Chunks run zero-padded to 16 or 32 rows, or to a multiple of
#: :data:`CHUNK_ROW_STEP`: a sweep over token counts compiles at most
#: ``chunk_tokens / 32 + 2`` programs, not one per count (each compile took
#: 1-2 s and XLA held ~15 MB of it for the process's life), and a call pays
#: for at most 31 padded rows (a power-of-two step cost 2.5x at 257 tokens).
CHUNK_ROW_STEP = 32
MIN_CHUNK_ROWS = 16


def chunk_rows(rows: int, chunk: int) -> int:
    """The rows a chunk of ``rows`` real tokens is compiled and run with."""
    padded = MIN_CHUNK_ROWS if rows <= MIN_CHUNK_ROWS else \
        -(-rows // CHUNK_ROW_STEP) * CHUNK_ROW_STEP
    return max(rows, min(padded, chunk))


def run_chunks(st: Static, x2, prog, params, scale, seed, chunk: int):
    tokens = x2.shape[0]
    if tokens == 0:  # no tokens: no pass, nothing detected
        return jnp.zeros((0, st.n), x2.dtype), jnp.zeros((0,), x2.dtype), jnp.zeros((), jnp.int32)
    # Padded rows are zero tokens of scale 0 (output 0); each real token keys
    # its own noise by its index, so the padding moves no draw. Eagerly, the
    # padding and the slicing are done in numpy: as jax ops they would
    # compile once per token count themselves.
    eager = not any(isinstance(v, jax.core.Tracer) for v in
                    (x2, scale, seed, *jax.tree_util.tree_leaves((params, prog))))
    lib = np if eager else jnp
    # A committed x (placed on a device) keeps its device: chunks and results go there.
    device = x2.sharding if eager and isinstance(x2, jax.Array) and x2.committed else None
    if eager:
        x2, scale = np.asarray(x2), np.asarray(scale)
    # K padded to whole tiles here, the chunk masking the padding: the program
    # depends on the tiles, not on K (w_eff, K rows, is the derivatives' alone).
    cols = x2.shape[1]
    kpad = st.k_tiles * st.tile_k - cols
    prog = {name: value for name, value in prog.items() if name != "w_eff"}
    ys, photons, clipped = [], [], 0
    for c0 in range(0, tokens, chunk):
        c1 = min(c0 + chunk, tokens)
        rows = c1 - c0
        pad = chunk_rows(rows, chunk) - rows
        xc = lib.pad(x2[c0:c1], ((0, pad), (0, kpad)))
        sc = lib.pad(scale[c0:c1], (0, pad))
        if eager and device is not None:
            xc, sc = jax.device_put((xc, sc), device)
        y, ph, cl = _chunk_jit(st, prog, params, xc, sc, jnp.uint32(c0), seed, jnp.int32(rows),
                               jnp.int32(cols))
        if eager:
            y, ph = np.asarray(y), np.asarray(ph)
        ys.append(y[:rows])
        photons.append(ph[..., :rows])
        clipped = clipped + cl
    y, ph = (ys[0], photons[0]) if len(ys) == 1 else \
        (lib.concatenate(ys), lib.concatenate(photons, axis=-1))
    if not eager:
        return y, ph, clipped
    if device is not None:
        return (*jax.device_put((y, ph), device), clipped)
    return jnp.asarray(y), jnp.asarray(ph), clipped


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def emulate(st, chunk, x2, w2, prog, params, scale, seed):
    """The noisy machine forward; straight-through derivatives (module docstring)."""
    return run_chunks(st, x2, prog, params, scale, seed, chunk)


def _emulate_jvp(st, chunk, primals, tangents):
    """The straight-through rule as a JVP, ``dy = dx W_eff + x dw``: linear in
    the tangents, so reverse mode transposes it (``dx = g W_eff^T``,
    ``dw = x^T g``), and every order and mode (``jacfwd``, ``hessian``) sees
    the same linear machine, never the quantisers' zero or clipped slopes."""
    x2, w2, prog = primals[:3]
    dx, dw = tangents[:2]
    out = emulate(st, chunk, *primals)
    y, photons, clipped = out
    # W_eff moves with a traced w as w itself (the programming taken as the
    # identity), so the derivative across x and w is x @ w's in either order.
    # The barrier keeps XLA from folding a gradient of constant operands
    # (jit(grad(sum(y)))) at compile time: 23 s against 0.4 s at 512 x 1024^2.
    w_eff = jax.lax.optimization_barrier(prog["w_eff"]) + (w2 - jax.lax.stop_gradient(w2))
    # Full float32, as the pass's GEMMs (a GPU's default rounds through TF32).
    hp = jax.lax.Precision.HIGHEST
    dy = jnp.zeros_like(y) if isinstance(dx, SymbolicZero) else jnp.matmul(dx, w_eff,
                                                                           precision=hp)
    if not isinstance(dw, SymbolicZero):
        dxw = jnp.matmul(x2, dw, precision=hp)
        dy = dxw if isinstance(dx, SymbolicZero) else dy + dxw
    return out, (dy, jnp.zeros_like(photons),
                 np.zeros(np.shape(clipped), dtype=jax.dtypes.float0))


emulate.defjvp(_emulate_jvp, symbolic_zeros=True)
