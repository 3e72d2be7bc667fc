"""optical.matmul against independent truth: exact matmul in the ideal limit,
a plain loop re-derivation for the deterministic physics, and the analytic
laws of shot noise and RIN for the stochastic physics."""

import math

import numpy as np
import pytest

import optical
from optical import metrics

from .configs import ENCODINGS, ideal, noisy
from .conftest import EXACT_RTOL
from .reference_loops import reference_matmul

#: (backend, exact): the numpy reference and both numba modes, named explicitly
#: ("auto" takes numba, or numpy for cores under 32 x 32).
BACKENDS = [pytest.param("numpy", False, id="numpy"),
            pytest.param("numba", False, id="numba-fast"),
            pytest.param("numba", True, id="numba-exact")]

# --------------------------------------------------------------------------- #
# The ideal limit
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("inputs", "weights"), ENCODINGS)
@pytest.mark.parametrize(("tile_k", "tile_n"), [(1, 1), (7, 5), (64, 32), (300, 200), (1024, 1024)])
def test_ideal_reproduces_matmul(rng, dtype, inputs, weights, tile_k, tile_n):
    k, n = (300, 200) if tile_k > 1 else (30, 20)  # 1 x 1 tiles: keep the tile count modest
    x = rng.standard_normal((2, 9, k)).astype(dtype)
    w = rng.standard_normal((k, n)).astype(dtype)
    cfg = ideal(**{"encoding.inputs": inputs, "encoding.weights": weights,
                   "core.inputs": tile_k, "core.outputs": tile_n})
    y = optical.matmul(x, w, cfg, seed=0)
    assert y.dtype == dtype and y.shape == (2, 9, n)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    assert metrics.relative_error(exact, y) < EXACT_RTOL[dtype]


@pytest.mark.parametrize("balanced", [True, False])
def test_ideal_with_per_tensor_scaling_and_zero_rows_columns(rng, balanced):
    x = rng.standard_normal((5, 40))
    x[2] = 0.0
    w = rng.standard_normal((40, 30))
    w[:, 3] = 0.0
    cfg = ideal(**{"dac.scaling": "per_tensor", "mask.scaling": "per_tensor",
                   "core.inputs": 16, "detector.balanced": balanced})
    y = optical.matmul(x, w, cfg, seed=0)
    np.testing.assert_allclose(y, x @ w, rtol=0, atol=1e-12)


def test_one_dimensional_input(rng):
    x = rng.standard_normal(50)
    w = rng.standard_normal((50, 4))
    y = optical.matmul(x, w, ideal(), seed=1)
    assert y.shape == (4,)
    np.testing.assert_allclose(y, x @ w, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- #
# Deterministic physics against the plain loop re-derivation
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("inputs", "weights"), ENCODINGS)
@pytest.mark.parametrize("balanced", [True, False])
@pytest.mark.parametrize("full_scale", ["max", "rms"])
def test_quantised_machine_matches_independent_loops(rng, inputs, weights, balanced, full_scale):
    x = rng.standard_normal((6, 70))
    w = rng.standard_normal((70, 23))
    cfg = ideal(**{"encoding.inputs": inputs, "encoding.weights": weights,
                   "detector.balanced": balanced, "adc.full_scale": full_scale,
                   "dac.bits": 5, "mask.bits": 4, "adc.bits": 6, "mask.contrast_ratio": 20.0,
                   "adc.headroom": 2.0, "core.inputs": 32, "core.outputs": 10})
    y = optical.matmul(x, w, cfg, seed=0)
    truth = reference_matmul(x, w, cfg)
    # A readout within rounding of a code boundary could round either way; at
    # this fixture's seed the nearest is 7e-5 of a step away, so every output
    # agrees. The readouts are sums of quantised levels and can sit exactly on
    # a boundary: under other seeds (isolation audit) 6 of 192 cases, all
    # balanced split weights, differ in one output of 138 by that tie.
    close = np.isclose(y, truth, rtol=1e-9, atol=1e-9 * np.abs(truth).max())
    assert close.all(), f"{(~close).sum()} of {close.size} differ"
    assert metrics.sqnr_db(truth, y) > 40


def test_quantisation_costs_accuracy_as_bits_fall(rng):
    x = rng.standard_normal((64, 256))
    w = rng.standard_normal((256, 64))
    exact = x @ w
    sqnr = [metrics.sqnr_db(exact, optical.matmul(x, w, ideal(**{"dac.bits": b, "mask.bits": b}),
                                                  seed=0)) for b in (3, 5, 7, 9)]
    assert all(b - a > 8 for a, b in zip(sqnr, sqnr[1:], strict=False)), sqnr  # ~6 dB/bit


def test_adc_clipping_is_counted(rng):
    x = rng.standard_normal((32, 64))
    w = rng.standard_normal((64, 16))
    base = ideal(**{"adc.bits": 8, "core.inputs": 32})
    _, never = optical.matmul(x, w, base.replace({"adc.full_scale": "max"}), seed=0,
                              return_stats=True)
    _, tight = optical.matmul(x, w, base.replace({"adc.headroom": 0.2}), seed=0, return_stats=True)
    assert never.clipped_fraction == 0.0
    assert 0.3 < tight.clipped_fraction < 1.0


# --------------------------------------------------------------------------- #
# Shot noise: the Poisson law
# --------------------------------------------------------------------------- #


def _repeat_over_seeds(x, w, cfg, seeds, copies, **options):
    """Outputs for ``copies`` copies of each row of x under ``seeds`` seeds:
    shape (seeds * copies, *x.shape[:-1], N); ``options`` go to matmul."""
    xs = np.broadcast_to(x, (copies, *x.shape)).copy()
    return np.concatenate([optical.matmul(xs, w, cfg, seed=s, **options) for s in range(seeds)])


@pytest.mark.parametrize("model", ["poisson", "gaussian"])
def test_shot_noise_variance_is_mean_over_p(rng, model):
    """Non-negative x with rows peaking at 1 and w with columns peaking at 1:
    every scale is 1, split rails carry the whole signal, and each output's
    count is a sum of Poisson counts over the K-tiles: var = mean / p."""
    p = 20.0
    x = rng.uniform(0, 1, (3, 64))
    x[:, 0] = 1.0
    w = rng.uniform(0, 1, (64, 8))
    w[0] = 1.0
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": model,
                   "encoding.inputs": "split", "encoding.weights": "split", "core.inputs": 16})
    ys = _repeat_over_seeds(x, w, cfg, seeds=50, copies=400)  # 20 000 samples per output
    exact = x @ w
    np.testing.assert_allclose(ys.mean(axis=0), exact, rtol=0.01)
    ratio = ys.var(axis=0) / (exact / p)
    assert np.all(np.abs(ratio - 1) < 0.05), ratio


def test_snr_grows_as_sqrt_p_k():
    """All-ones operands: each output is K with variance K / p, so SNR = sqrt(p K)."""
    snrs = {}
    for p in (5.0, 20.0):
        for k in (64, 256):
            x, w = np.ones((2000, k)), np.ones((k, 2))
            cfg = ideal(**{"source.photons_per_mac": p, "encoding.inputs": "split",
                           "core.inputs": 64})
            y = optical.matmul(x, w, cfg, seed=int(p * k))
            snrs[p, k] = y.mean() / y.std()
            assert snrs[p, k] == pytest.approx(math.sqrt(p * k), rel=0.05)
    assert snrs[20.0, 64] / snrs[5.0, 64] == pytest.approx(2.0, rel=0.07)
    assert snrs[5.0, 256] / snrs[5.0, 64] == pytest.approx(2.0, rel=0.07)


@pytest.mark.parametrize(("backend", "exact", "shot"), [
    ("numpy", False, "poisson"), ("numba", False, "poisson"), ("numpy", False, "gaussian"),
    ("numba", False, "gaussian"), ("numba", True, "gaussian")])
def test_offset_inputs_pay_the_shot_noise_of_the_offset_light(rng, backend, exact, shot):
    """Signed inputs, split weights, infinite contrast, balanced detection.
    Per readout the count variance is sum_j a_j |v_j| / p: the two rails'
    variances add, though their means subtract. Split inputs:
    var(y) = sum_j |x_j| |v_j| / p; offset inputs (a = (x + 1) / 2, decoded as
    2 z - sum v): var(y) = 2 sum_j (x_j + 1) |v_j| / p. Every path: numba
    takes its exact path for Poisson counts, and in fast mode draws Gaussian
    shot noise from the rails (split inputs) or low-rank light (offset)."""
    p = 50.0
    x = rng.uniform(-1, 1, (2, 48))
    x[:, 0] = 1.0
    w = rng.uniform(-1, 1, (48, 6))
    w[0] = 1.0
    base = ideal(**{"source.photons_per_mac": p, "encoding.weights": "split", "core.inputs": 16,
                    "detector.shot_noise": shot})
    theory = {"split": np.abs(x) @ np.abs(w) / p, "offset": 2 * (x + 1) @ np.abs(w) / p}
    var = {}
    for inputs in ("split", "offset"):
        ys = _repeat_over_seeds(x, w, base.replace({"encoding.inputs": inputs}), 20, 1000,
                                backend=backend, exact=exact)
        np.testing.assert_allclose(ys.mean(axis=0), x @ w, atol=5 * np.sqrt(theory[inputs].max() / 20000))
        var[inputs] = ys.var(axis=0)
        # Fast mode gives offset inputs the shot noise of low-rank light
        # (optical.kernels._fastpath): up to ~10% off in variance on these
        # 16-row tiles of uniform weights.
        low_rank = backend == "numba" and not exact and shot == "gaussian" and inputs == "offset"
        np.testing.assert_allclose(var[inputs], theory[inputs], rtol=0.15 if low_rank else 0.05)
    assert np.all(var["offset"] > 2 * var["split"])


def test_min_transmission_adds_shot_noise_but_no_bias(rng):
    p = 50.0
    x = rng.uniform(0, 1, (1, 32))
    x[0, 0] = 1
    w = rng.uniform(-1, 1, (32, 4))
    w[0] = 1
    cfg = ideal(**{"source.photons_per_mac": p, "encoding.inputs": "split",
                   "mask.contrast_ratio": 10.0, "core.inputs": 32})
    ys = _repeat_over_seeds(x, w, cfg, 10, 2000)
    t_min = 0.1
    # Rails carry t_min + (1 - t_min) u; balanced difference / (1 - t_min).
    theory = (x @ (2 * t_min + (1 - t_min) * np.abs(w))) / p / (1 - t_min) ** 2
    np.testing.assert_allclose(ys.var(axis=0), theory, rtol=0.05)
    np.testing.assert_allclose(ys.mean(axis=0), x @ w, atol=5 * np.sqrt(theory.max() / 20000))


def test_read_and_dark_noise_add_their_variance(rng):
    p, read, dark = 100.0, 30.0, 40.0
    x = np.ones((20000, 16))
    w = np.full((16, 2), 0.5)
    w[0] = 1.0
    cfg = ideal(**{"source.photons_per_mac": p, "encoding.inputs": "split",
                   "detector.read_noise_electrons": read, "detector.dark_electrons": dark,
                   "core.inputs": 16})
    y = optical.matmul(x, w, cfg, seed=3)
    # Balanced pair: two rails of dark counts, one read noise, in units of p;
    # split inputs read out twice (the empty negative pass brings its noise too).
    theory = (x[0] @ w) / p + 2 * (2 * dark + read**2) / p**2
    np.testing.assert_allclose(y.var(axis=0), theory, rtol=0.05)


# --------------------------------------------------------------------------- #
# Readout noise on every backend. The ideal preset's Poisson shot noise sends
# numba down its exact path; with Gaussian shot noise (iris-like) the fast path
# draws one normal of the summed variance per ADC conversion, so every term of
# that sum is pinned here against its law, on all three paths.
# --------------------------------------------------------------------------- #

def _zero_tokens(rows, k):
    """One lit token (x[0, 0] = 1) and ``rows - 1`` all-zero tokens: with
    ``dac.scaling = "per_tensor"`` the lit token sets a scale of 1 for all, so
    the zero tokens are read out in these units (an all-zero token alone has
    scale 0 and an exact 0 output). Drop row 0 from the statistics. Callers
    take whole 512-row chunks of the JAX backend: one compiled chunk program
    a config, not a second one for a shorter last chunk (~1.5 s each here)."""
    x = np.zeros((rows, k))
    x[0, 0] = 1.0
    return x


#: BACKENDS and the JAX backend's fast and exact paths (float32 device arrays).
ALL_BACKENDS = [*BACKENDS, pytest.param("jax", False, id="jax-fast"),
                pytest.param("jax", True, id="jax-exact")]


def jax_in_turns(cases, ids, exact):
    """``(backend, exact, *case)`` params: every case on each of BACKENDS,
    and on one of the JAX backend's two paths, the exact one where
    ``exact[i]``. Each JAX case compiles a pass of its own (2-5 s, where the
    loops' cases take milliseconds), so a grid runs each JAX path on about
    half its cases, every case on one of them, chosen so that each path
    meets every value of each factor (a Latin square)."""
    params = []
    for case, name, jax_exact in zip(cases, ids, exact, strict=True):
        params += [pytest.param(*b.values, *case, id=f"{name}-{b.id}") for b in BACKENDS]
        params.append(pytest.param("jax", jax_exact, *case,
                                   id=f"{name}-jax-{'exact' if jax_exact else 'fast'}"))
    return params


def _run(x, w, cfg, seed, backend, exact):
    """(y, stats) of optical.matmul on ``backend`` (JAX: float32 device arrays,
    y back in float64)."""
    if backend == "jax":
        jnp = pytest.importorskip("jax.numpy")
        y, st = optical.matmul(jnp.asarray(x, jnp.float32), w.astype(np.float32), cfg,
                               seed=seed, exact=exact, return_stats=True)
        return np.asarray(y, dtype=np.float64), st
    return optical.matmul(x, w, cfg, seed=seed, backend=backend, exact=exact,
                          return_stats=True)


@pytest.mark.parametrize(("backend", "exact", "inputs", "weights", "balanced"), jax_in_turns(
    [(i, w, b) for b in (True, False) for i, w in ENCODINGS],
    [f"{b}-{i}-{w}" for b in (True, False) for i, w in ENCODINGS],
    [(j + (not b)) % 2 == 1 for b in (True, False) for j in range(len(ENCODINGS))]))
def test_clipped_conversions_are_the_loops_count(rng, backend, exact, inputs, weights,
                                                 balanced):
    """Tight windows clip on both sides; every backend counts exactly the
    conversions the plain loops round to a code below 0 or above the top.
    Continuous DAC and mask levels: no readout lands exactly on a window's
    edge, where float rounding could decide. JAX runs on float32 device
    arrays, the loops then on the same float32-rounded operands."""
    x = rng.standard_normal((40, 70))
    w = rng.standard_normal((70, 23))
    if backend == "jax":
        x, w = (a.astype(np.float32).astype(np.float64) for a in (x, w))
    cfg = ideal(**{"encoding.inputs": inputs, "encoding.weights": weights,
                   "detector.balanced": balanced, "adc.bits": 6, "adc.headroom": 1.0,
                   "mask.contrast_ratio": 20.0, "core.inputs": 32, "core.outputs": 10})
    truth, (below, above) = reference_matmul(x, w, cfg, return_clipped=True)
    assert below > 0 and above > 0
    y, st = _run(x, w, cfg, 0, backend, exact)
    assert st.clipped_fraction == (below + above) / st.adc_conversions
    if backend == "jax":
        np.testing.assert_allclose(y, truth, rtol=0, atol=1e-5 * np.abs(truth).max())
    else:
        np.testing.assert_allclose(y, truth, rtol=1e-9, atol=1e-9 * np.abs(truth).max())


@pytest.mark.parametrize(("backend", "exact"), ALL_BACKENDS)
@pytest.mark.parametrize("bypass", [False, True])
def test_inputs_clipped_at_a_static_dac_range_are_counted(rng, backend, exact, bypass):
    """A static input range clips the inputs beyond it: dac_clipped_fraction
    is the share of the optical inputs with |x| > range, counted by hand, and
    they are exactly the inputs the DAC clipped (the output is that of x
    clipped to the range by hand, which itself counts none). With static
    outlier channels, only the channels the optics carry count. Abs-max
    scaling clips nothing."""
    cal = rng.standard_normal((64, 40)).astype(np.float32)
    w = rng.standard_normal((40, 12)).astype(np.float32)
    options = {"dac.scaling": "static", "dac.bits": 8, "core.inputs": 16, "core.outputs": 8}
    if bypass:
        cal[:, 5] *= 50.0  # one outlier channel, bypassed digitally
        options |= {"outliers.policy": "static", "outliers.threshold": 6.0}
    cfg = ideal(**options)
    pw = optical.program(w, cfg, calibration=cal)
    r = pw.input_range
    x = (rng.uniform(-0.9, 0.9, (30, 40)) * r).astype(np.float32)
    beyond = rng.random(x.shape) < 0.1
    x[beyond] *= 3.0  # past the range by at least 0.2 * r wherever |x| > r
    optical_channels = np.arange(40) if not bypass else pw.bypass.optical_channels
    assert (pw.bypass is not None) == bypass
    clipped = np.abs(x[:, optical_channels]) > r
    assert clipped.sum() > 20

    def run(a, config=cfg, weights=pw):
        if backend == "jax":
            jnp = pytest.importorskip("jax.numpy")
            y, st = optical.matmul(jnp.asarray(a), weights, config, seed=2, exact=exact,
                                   return_stats=True)
            return np.asarray(y), st
        return optical.matmul(a, weights, config, seed=2, backend=backend, exact=exact,
                              return_stats=True)

    y, st = run(x)
    assert st.dac_clipped_fraction == clipped.sum() / clipped.size
    by_hand = x.copy()
    by_hand[:, optical_channels] = np.clip(x[:, optical_channels], -r, r)
    y_hand, st_hand = run(by_hand)
    assert st_hand.dac_clipped_fraction == 0.0
    np.testing.assert_array_equal(y, y_hand)
    dynamic = cfg.replace({"dac.scaling": "per_token"})
    _, st_dyn = run(x, dynamic, optical.program(w, dynamic, calibration=cal))
    assert st_dyn.dac_clipped_fraction == 0.0


def _assert_noise_law(y, mean, variance):
    """Every column's sample mean and variance against the law, within five
    standard errors (var of a sample variance: 2 var^2 / n, Gaussian noise)."""
    n = y.shape[0]
    assert np.all(np.abs(y.mean(axis=0) - mean) < 5 * np.sqrt(variance / n)), \
        (y.mean(axis=0), mean)
    ratio = y.var(axis=0) / variance
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(2 / n)), ratio


@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
@pytest.mark.parametrize("balanced", [True, False])
@pytest.mark.parametrize("source", ["dark", "read"])
def test_dark_and_read_noise_in_the_dark(rng, backend, exact, balanced, source):
    """No light at all (x = 0, split inputs): what is left is dark counts and
    read noise. Per pass each of the two detector rails carries dark counts of
    variance ``dark`` electrons^2, so ``dark / p**2`` in full-scale MACs; with
    balanced detection the rails are subtracted before one ADC (one read
    noise), else each rail has its own ADC (two read noises) and the rails are
    subtracted digitally. The decoding gain is 1 (split weights, infinite
    contrast); both input passes (+1 and -1) read out the same way; the
    column's weight scale s multiplies the result:
    var(y) = s**2 * 2 * (2 dark + n_adc read**2) / p**2, n_adc = 1 or 2."""
    p = 100.0
    dark, read = (40.0, 0.0) if source == "dark" else (0.0, 30.0)
    x = _zero_tokens(20480, 16)
    w = rng.uniform(-2, 2, (16, 4))
    s = np.abs(w).max(axis=0)
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": "gaussian",
                   "encoding.inputs": "split", "encoding.weights": "split",
                   "detector.balanced": balanced, "detector.dark_electrons": dark,
                   "detector.read_noise_electrons": read, "core.inputs": 16,
                   "dac.scaling": "per_tensor"})
    n_adc = 1 if balanced else 2
    theory = s**2 * 2 * (2 * dark + n_adc * read**2) / p**2
    y = optical.matmul(x, w, cfg, seed=3, backend=backend, exact=exact)
    _assert_noise_law(y[1:], 0.0, theory)


@pytest.mark.parametrize(("backend", "exact", "inputs", "balanced", "bits"), jax_in_turns([
    ("split", True, None),   # numba: the general readout, one ADC per balanced pair
    ("split", False, None),  # ... an ADC per rail
    ("split", True, 8),      # ... with an ADC's window and rounding
    ("offset", True, None),  # numba: the one-pass, one-rail readout (offset weights)
    ("offset", True, 8),     # ... with an ADC
], ["split-True-None", "split-False-None", "split-True-8", "offset-True-None", "offset-True-8"],
    [False, True, True, True, False]))
def test_read_noise_past_float32_range_keeps_its_law(rng, backend, exact, inputs, balanced,
                                                     bits):
    """A read noise 1e28 times the photons per MAC (a variance of 1e56, past
    float32's range, of a valid config: read noise up to 1e30 electrons)
    keeps the law of ``test_dark_and_read_noise_in_the_dark`` on every
    readout, the fast paths included (they took the root of a float32
    variance: NaN, or with an ADC a conversion clipped at the window's edge).
    The "rms" window spans +-8 deviations (headroom 8): no clipping to speak
    of, and a rounding step of 16/255 deviations adds (16/255)**2/12 = 3e-4
    of the variance, far inside the tolerance. Decoding: split inputs and
    split weights read two passes of gain 1, var(y) = s**2 * 2 * n_adc *
    read**2 / p**2; offset inputs and offset weights one conversion doubled
    twice (2 a - 1, 2 u - 1), var(y) = s**2 * 16 * read**2 / p**2."""
    p, read = 100.0, 1e30
    x = _zero_tokens(4096, 16)
    w = rng.uniform(-2, 2, (16, 4))
    s = np.abs(w).max(axis=0)
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": "gaussian",
                   "encoding.inputs": inputs, "encoding.weights": inputs,
                   "detector.balanced": balanced, "detector.read_noise_electrons": read,
                   "adc.bits": bits, "adc.full_scale": "rms", "adc.headroom": 8.0,
                   "core.inputs": 16, "dac.scaling": "per_tensor"})
    theory = s**2 * (2 * (1 if balanced else 2) if inputs == "split" else 16) * read**2 / p**2
    y, _ = _run(x, w, cfg, 3, backend, exact)
    assert np.isfinite(y).all()
    _assert_noise_law(y[1:], 0.0, theory)


@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
def test_poisson_dark_counts_are_fluctuations_about_their_mean(rng, backend, exact):
    """Poisson dark counts of mean d, offset inputs and offset weights: one
    rail, one ADC, no second rail or pass to subtract, so a dark count's
    mean (a known offset, taken off as for Gaussian dark noise) would reach
    the output. x = 0 lights every source at 1/2: each readout counts
    Poisson(p sum_j t_j / 2) + Poisson(d) - d electrons, t = (v + 1) / 2
    (infinite contrast). Decoding doubles the weight rail (2 u - 1) and the
    input rail (2 a - 1), whose pedestals take off the light's mean: y has
    mean 0 and variance s**2 * 16 * (sum_j t_j / 2 / p + d / p**2). (numba
    draws Poisson counts on its exact path in both modes.)"""
    p, dark = 100.0, 400.0
    x = _zero_tokens(20480, 16)
    w = rng.uniform(-2, 2, (16, 4))
    s = np.abs(w).max(axis=0)
    cfg = ideal(**{"source.photons_per_mac": p, "detector.dark_electrons": dark,
                   "encoding.inputs": "offset", "encoding.weights": "offset",
                   "core.inputs": 16, "dac.scaling": "per_tensor"})
    t = (w / s + 1) / 2
    theory = s**2 * 16 * (t.sum(axis=0) / 2 / p + dark / p**2)
    y = optical.matmul(x, w, cfg, seed=2, backend=backend, exact=exact)
    _assert_noise_law(y[1:], 0.0, theory)


@pytest.mark.parametrize(("backend", "exact"), ALL_BACKENDS)
def test_enob_noise_alone_follows_the_converter_law(rng, backend, exact):
    """p = inf, a 6-bit ADC with 2 bits lost: the ADC must err as an ideal
    4-bit converter would, variance (4 step)**2 / 12. Offset inputs and
    weights, one rail: x = 0 lights every source at level 1/2, so the readout
    sits mid-window in the "max" window [0, sum_j t_j] (t = (v + 1) / 2),
    step = sum_j t_j / 63. The ENOB noise (about a step) dithers the
    rounding, so the two add to the 4-bit law (to ~exp(-2 pi^2 sigma^2 /
    step^2) ~ 1e-11). Decoding doubles the weight rail (2 u - 1) and the input
    rail (2 a - 1): var(y) = s**2 * 16 * (4 step)**2 / 12."""
    x = _zero_tokens(20480, 16)
    w = rng.uniform(-2, 2, (16, 4))
    s = np.abs(w).max(axis=0)
    cfg = ideal(**{"adc.bits": 6, "adc.enob_loss": 2.0, "adc.full_scale": "max",
                   "encoding.inputs": "offset", "encoding.weights": "offset",
                   "detector.balanced": False, "detector.shot_noise": "gaussian",
                   "core.inputs": 16, "dac.scaling": "per_tensor"})
    step = ((w / s + 1) / 2).sum(axis=0) / 63
    theory = s**2 * 16 * (step * 2**2) ** 2 / 12
    y, st = _run(x, w, cfg, 1, backend, exact)
    _assert_noise_law(y[1:], 0.0, theory)
    assert st.clipped_fraction == 0.0


@pytest.mark.parametrize(("backend", "exact", "balanced", "shot"), jax_in_turns(
    [(True, "gaussian"), (False, "gaussian"), (True, "poisson")],  # (Poisson: the exact path)
    ["True-gaussian", "False-gaussian", "True-poisson"], [False, True, True]))
def test_every_readout_noise_adds_its_variance_on_offset_inputs(rng, backend, exact, balanced,
                                                                shot):
    """iris-like's path: offset inputs, split weights, Gaussian shot, dark,
    read and ENOB noise, finite contrast, each term about a quarter of the
    total (Poisson shot and dark counts have the same variances, and take
    the JAX backend's exact path, whose read and ADC noise draw from their
    own streams too). x = 0 puts level 1/2 on every source. ADC rail e reads
    sum_r g_er rail_r (g = [[1, -1]] balanced, else the identity), so per
    ADC conversion, in full-scale MACs:
    shot sum_r g_er^2 (sum_j t_rj / 2) / p, dark sum_r g_er^2 dark / p**2,
    read read**2 / p**2, and the ADC: ENOB noise plus rounding, dithered by
    the rest, (4 step_e)**2 / 12 with step_e the "max" window's width / 63.
    Decoding: (sum_e h_e value_e) / (1 - t_min) with h_e = +-1, times 2 for
    the offset input rail, times the weight scale s."""
    p, dark, read, t_min = 200.0, 400.0, 30.0, 0.02
    x = _zero_tokens(20480, 16)
    w = rng.uniform(-2, 2, (16, 4))
    s = np.abs(w).max(axis=0)
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": shot,
                   "detector.dark_electrons": dark, "detector.read_noise_electrons": read,
                   "detector.balanced": balanced, "mask.contrast_ratio": 1 / t_min,
                   "adc.bits": 6, "adc.enob_loss": 2.0, "adc.full_scale": "max",
                   "encoding.inputs": "offset", "encoding.weights": "split",
                   "core.inputs": 16, "dac.scaling": "per_tensor"})
    v = w / s
    rails = np.stack([t_min + (1 - t_min) * np.maximum(v, 0),
                      t_min + (1 - t_min) * np.maximum(-v, 0)])  # (2, K, N)
    g = np.array([[1.0, -1.0]]) if balanced else np.eye(2)
    per_conversion = 0.0
    for ge in g:
        seen = np.einsum("r,rkn->kn", ge, rails)
        step = (np.maximum(seen, 0).sum(axis=0) - np.minimum(seen, 0).sum(axis=0)) / 63
        per_conversion = per_conversion + (ge**2 @ rails.sum(axis=1) / 2 / p
                                           + (ge**2).sum() * dark / p**2 + read**2 / p**2
                                           + (step * 2**2) ** 2 / 12)
    theory = s**2 * 4 * per_conversion / (1 - t_min) ** 2
    y, st = _run(x, w, cfg, 5, backend, exact)
    _assert_noise_law(y[1:], 0.0, theory)
    # Whether a conversion can clip depends on the draw of w (a rail's mid-window
    # light can sit 4 sigma from the window's edge): too few to move the law.
    assert st.clipped_fraction < 1e-4


# --------------------------------------------------------------------------- #
# RIN: correlated across the outputs of a pass
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
@pytest.mark.parametrize("weights", ["split", "offset"])
def test_rin_produces_the_output_covariance_of_per_source_fluctuations(rng, backend, exact,
                                                                       weights):
    """Only RIN: each source's light is scaled by (1 + sigma e_j) in each pass,
    so output n errs by sigma sum_j a_j e_j v_jn and
    cov(y_n, y_m) = sigma^2 sum_j a_j^2 v_jn v_jm (every column's scale is 1
    here). Offset weights, t = (v + 1) / 2, carry the fluctuation of their
    offset light too: the digital side removes the offset computed from the
    nominal inputs, not the light after RIN, so v becomes v + 1."""
    sigma = 1e-2
    bandwidth = 1e9
    rin_db = 10 * math.log10(sigma**2 / bandwidth)
    x = rng.uniform(0, 1, 24)
    x[0] = 1
    w = rng.uniform(0, 1, (24, 5))
    w[0] = 1
    w[:, 4] = w[:, 3]  # two identical columns: perfectly correlated errors
    cfg = ideal(**{"source.rin_db_per_hz": rin_db, "source.rin_bandwidth": bandwidth,
                   "encoding.inputs": "split", "encoding.weights": weights, "core.inputs": 24})
    assert cfg.source.rin_sigma == pytest.approx(sigma)
    ys = optical.matmul(np.tile(x, (40000, 1)), w, cfg, seed=11, backend=backend, exact=exact)
    v = w if weights == "split" else w + 1
    theory = sigma**2 * (v.T * x**2) @ v
    measured = np.cov(ys.T)
    assert np.linalg.norm(measured - theory) / np.linalg.norm(theory) < 0.03
    assert np.corrcoef(ys[:, 3], ys[:, 4])[0, 1] == pytest.approx(1.0, abs=1e-9)
    assert np.corrcoef(ys[:, 0], ys[:, 1])[0, 1] > 0.5


@pytest.mark.parametrize(("backend", "exact"), ALL_BACKENDS)
def test_rin_is_drawn_once_per_source_and_pass(rng, backend, exact):
    """Odd 5 x 3 tiles over K = 10, N = 6: two K-tiles, two N-tiles, each
    (K-tile, N-tile) its own pass with its own RIN draw per source. Outputs
    of one N-tile share their passes' draws, cov(y_n, y_m) = sigma^2 sum_j
    x_j^2 w_jn w_jm (as above); outputs of different N-tiles come from
    other passes and are uncorrelated. The first and last rows of each
    K-tile are lit at full scale: the fast path draws RIN in Box-Muller pairs
    of rows, and an odd tile's last row must not share a pair with the
    next pass's first row."""
    sigma, bandwidth = 1e-2, 1e9
    x = rng.uniform(0, 1, 10)
    x[[0, 4, 5, 9]] = 1.0
    w = rng.uniform(0.2, 1, (10, 6))
    cfg = ideal(**{"source.rin_db_per_hz": 10 * math.log10(sigma**2 / bandwidth),
                   "source.rin_bandwidth": bandwidth, "encoding.inputs": "split",
                   "core.inputs": 5, "core.outputs": 3})
    ys, _ = _run(np.tile(x, (20480, 1)), w, cfg, 11, backend, exact)  # whole JAX chunks
    same_tile = (np.arange(6) // 3)[:, None] == (np.arange(6) // 3)[None, :]
    theory = sigma**2 * ((w.T * x**2) @ w) * same_tile
    measured = np.cov(ys.T)
    assert np.linalg.norm(measured - theory) / np.linalg.norm(theory) < 0.05


# --------------------------------------------------------------------------- #
# Reproducibility, dtypes, stats
# --------------------------------------------------------------------------- #


def _noisy_config():
    return optical.presets.get("iris-like").replace({
        "core.inputs": 64, "core.outputs": 32, "source.photons_per_mac": 40.0,
        "detector.shot_noise": "poisson", "source.rin_db_per_hz": -120.0})


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize(("adc_bits", "shot"), [(8, "poisson"), (None, "poisson"),
                                                (None, "gaussian")])
def test_same_seed_same_output_whatever_the_chunking_and_blas_threads(rng, backend, adc_bits,
                                                                      shot):
    """Without an ADC and with Gaussian shot noise every last bit of every
    GEMM reaches the output (Poisson counts are integers: they hide the
    means' last bits), so this also holds the engine to row-reproducible
    products (optical._gemm): a chunk that did not start on a row-block
    boundary would put its rows elsewhere in their GEMM and change bits.
    The backend is named: "auto" takes numba, which ignores chunk_tokens
    (fixed token blocks), while the numpy reference really runs in chunks --
    of 256 tokens (the row block) for 1 to 256, of 512 for 300, one for
    10 000 -- whose noise must continue the token count, not restart it."""
    from threadpoolctl import threadpool_limits

    x = rng.standard_normal((3, 200, 130)).astype(np.float32)  # 600 tokens
    w = rng.standard_normal((130, 40)).astype(np.float32)
    cfg = _noisy_config().replace({"adc.bits": adc_bits, "detector.shot_noise": shot})
    w = optical.program(w, cfg, calibration=x)  # once: the calls below stream x alone
    first = optical.matmul(x, w, cfg, seed=7, backend=backend)
    for chunk in (1, 13, 64, 150, 300, 10_000):
        np.testing.assert_array_equal(
            optical.matmul(x, w, cfg, seed=7, backend=backend, chunk_tokens=chunk), first)
    with threadpool_limits(limits=1, user_api="blas"):
        np.testing.assert_array_equal(optical.matmul(x, w, cfg, seed=7, backend=backend), first)
    other = optical.matmul(x, w, cfg, seed=8, backend=backend)
    assert np.mean(other != first) > 0.5


def test_programmed_weights_give_the_same_output(rng):
    x = rng.standard_normal((20, 100))
    w = rng.standard_normal((100, 40))
    cfg = _noisy_config()
    # Raw weights under a calibrated mapping calibrate on the call's own inputs.
    programmed = optical.program(w, cfg, calibration=x)
    np.testing.assert_array_equal(optical.matmul(x, programmed, cfg, seed=1),
                                  optical.matmul(x, w, cfg, seed=1))
    # Without calibration, DAC settings do not touch the mask: the same
    # programmed matrix serves (calibrated windows depend on the DAC).
    naive = cfg.replace({"adc.full_scale": "rms", "outliers.policy": "none"})
    optical.matmul(x, optical.program(w, naive), naive.replace({"dac.bits": 4}), seed=1)
    with pytest.raises(ValueError, match="dac.bits = 8 when programmed, 4 now"):
        optical.matmul(x, programmed, cfg.replace({"dac.bits": 4}), seed=1)
    with pytest.raises(ValueError, match=r"core.inputs = 64 when programmed, 32 now"):
        optical.matmul(x, programmed, cfg.replace({"core.inputs": 32}), seed=1)
    with pytest.raises(ValueError, match="mask.bits"):
        optical.matmul(x, programmed, cfg.replace({"mask.bits": 4}), seed=1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_kept_under_noise(rng, dtype):
    x = rng.standard_normal((4, 70)).astype(dtype)
    w = rng.standard_normal((70, 9)).astype(dtype)
    y = optical.matmul(x, w, _noisy_config(), seed=0)
    assert y.dtype == dtype


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("balanced", [False, True])
def test_stats_count_the_schedule(rng, backend, balanced):
    x = rng.standard_normal((2, 5, 100))
    w = rng.standard_normal((100, 70))
    cfg = ideal(**{"core.inputs": 30, "core.outputs": 32, "encoding.inputs": "split",
                   "encoding.weights": "split", "detector.balanced": balanced,
                   "source.photons_per_mac": 1000.0})
    y, st = optical.matmul(x, w, cfg, seed=0, return_stats=True, backend=backend)
    tokens, k_tiles, n_tiles = 10, 4, 3
    assert (st.tokens, st.k_tiles, st.n_tiles, st.input_passes) == (tokens, k_tiles, n_tiles, 2)
    assert st.passes == tokens * k_tiles * n_tiles * 2
    assert st.weight_loads == k_tiles * n_tiles
    assert st.dac_conversions == tokens * 2 * n_tiles * 100
    # Both rails read out; unbalanced, each has its ADC, balanced one per pair.
    assert st.detector_readouts == tokens * k_tiles * 2 * 70 * 2
    assert st.adc_conversions == st.detector_readouts // (2 if balanced else 1)
    assert st.macs == tokens * 100 * 70
    # Mean photoelectrons: p * sum_j a_j t_jn over every rail of every readout.
    xn = np.abs(x.reshape(tokens, 100)) / np.abs(x.reshape(tokens, 100)).max(axis=1, keepdims=True)
    wn = np.abs(w) / np.abs(w).max(axis=0)
    light = 1000.0 * (xn @ wn).sum()  # each |x| |w| product lands on exactly one rail
    assert st.detected_photons == pytest.approx(light, rel=1e-9)
    assert st.mean_photoelectrons == pytest.approx(light / st.detector_readouts, rel=1e-9)
    assert st.clipped_fraction == 0.0
    assert set(st.to_dict()) >= {"passes", "weight_loads", "adc_conversions", "clipped_fraction"}
    counted = optical.core.schedule(tokens, 100, 70, cfg)
    assert {k: v for k, v in st.to_dict().items() if k in counted.to_dict()} == counted.to_dict()


@pytest.mark.parametrize(("weights", "balanced", "rails", "adcs"), [
    ("split", True, 2, 1), ("split", False, 2, 2), ("offset", True, 1, 1)])
def test_schedule_counts_one_adc_per_balanced_pair(weights, balanced, rails, adcs):
    """Counted by hand: 10 tokens, K = 100 on 30-input tiles (4 K-tiles), N =
    70 on 32-output tiles (3 N-tiles), split inputs (2 passes). Each pass
    reads every column of its K-tile once per detector rail; a balanced pair
    of rails is subtracted before one ADC, otherwise each rail has its own."""
    cfg = ideal(**{"core.inputs": 30, "core.outputs": 32, "encoding.inputs": "split",
                   "encoding.weights": weights, "detector.balanced": balanced})
    counted = optical.schedule(10, 100, 70, cfg)
    assert counted.detector_readouts == 10 * 4 * 2 * 70 * rails
    assert counted.adc_conversions == 10 * 4 * 2 * 70 * adcs
    assert counted.dac_conversions == 10 * 2 * 3 * 100  # every N-tile's pass converts its inputs
    assert counted.passes == 10 * 4 * 3 * 2


@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
def test_an_ideal_source_detects_infinitely_many_photons(rng, backend, exact):
    """photons_per_mac = inf: every readout's mean count is infinite, and so
    are the call's detected photons (MatmulStats), on every backend and in
    chunks (the numpy reference sums per token, then once)."""
    x = rng.standard_normal((40, 50))
    w = rng.standard_normal((50, 9))
    cfg = ideal(**{"core.inputs": 32, "core.outputs": 8})
    _, st = optical.matmul(x, w, cfg, seed=0, backend=backend, exact=exact, return_stats=True,
                           chunk_tokens=16)
    assert st.detected_photons == math.inf
    assert st.mean_photoelectrons == math.inf


@pytest.mark.parametrize("bad", [-1, True, np.True_, 2.0, "3"])
@pytest.mark.parametrize("name", ["tokens", "k", "n"])
def test_schedule_refuses_counts_that_are_not_non_negative_integers(name, bad):
    sizes = {"tokens": 4, "k": 8, "n": 8} | {name: bad}
    with pytest.raises(ValueError, match=f"{name}: .* must be a non-negative integer"):
        optical.schedule(sizes["tokens"], sizes["k"], sizes["n"], ideal())
    assert optical.schedule(0, 8, 8, ideal()).passes == 0
    assert optical.schedule(np.int64(4), 8, 8, ideal()) == optical.schedule(4, 8, 8, ideal())


@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
def test_detected_photons_are_the_sum_of_the_mean_counts_rin_aside(backend, exact):
    """Without RIN the call's detected photons are p * sum over tokens of the
    DAC levels times every rail's and column's transmissions (by hand), for
    any seed; with RIN they are the means given the RIN draws: the seed moves
    them, by about the RIN's relative spread over the sources."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((4, 64)), rng.standard_normal((64, 16))
    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 64, "core.outputs": 16, "optics.model": "ideal",
        "outliers.policy": "none", "adc.full_scale": "rms"})
    no_rin = cfg.replace({"source.rin_db_per_hz": -math.inf})
    pw = optical.program(w, cfg)
    levels = np.rint((x / np.abs(x).max(axis=1, keepdims=True) + 1) / 2 * 255) / 255
    expected = 1e5 * float((levels @ pw.transmissions.sum(axis=0)).sum())
    # RIN widens the windows, not the mask: both configs program the same light.
    np.testing.assert_array_equal(optical.program(w, no_rin).transmissions, pw.transmissions)

    def photons(config, seed):
        return optical.matmul(x, optical.program(w, config), config, seed=seed, backend=backend,
                              exact=exact, return_stats=True)[1].detected_photons

    assert [photons(no_rin, s) for s in (0, 1)] == pytest.approx([expected] * 2, rel=1e-12)
    with_rin = [photons(cfg, s) for s in (0, 1)]
    assert with_rin[0] != with_rin[1]
    assert with_rin == pytest.approx([expected] * 2, rel=1e-3)


# --------------------------------------------------------------------------- #
# Bad input
# --------------------------------------------------------------------------- #


class _Tagged(np.ndarray):
    """An ndarray subclass (as np.matrix or a units-carrying quantity are)."""


@pytest.mark.parametrize(("x", "w", "error", "match"), [
    (np.ones((3, 4)), np.ones((5, 2)), ValueError, "shape mismatch: x has 4 features"),
    (np.ones((3, 4)), np.ones(4), ValueError, "w: expected 2 dimensions"),
    (np.ones((3, 4)), np.ones((4, 0)), ValueError, "empty dimension"),
    (np.array([[np.nan, 1.0]]), np.ones((2, 2)), ValueError, "x: contains 1 NaN"),
    (np.ones((1, 2)), np.array([[np.inf, 1.0], [1.0, 1.0]]), ValueError, "w: contains 1 NaN or inf"),
    (np.ones((3, 4), dtype=np.int64), np.ones((4, 2)), TypeError, "x: dtype int64"),
    (np.ones((3, 4)), np.ones((4, 2), dtype=np.complex128), TypeError, "w: dtype complex128"),
    (np.ones((3, 4), dtype=np.float16), np.ones((4, 2)), TypeError, "float16"),
    ([[1.0, 2.0]], np.ones((2, 2)), TypeError, "x: expected a numpy.ndarray"),
    (np.ones((3, 4), np.float32), np.ones((4, 2)), TypeError, "dtype mismatch"),
    (np.array(1.0), np.ones((1, 2)), ValueError, "x: expected at least 1 dimension"),
    (np.ma.masked_array(np.ones((3, 2)), mask=np.eye(3, 2)), np.ones((2, 2)), TypeError,
     r"x: numpy.ma.MaskedArray, a numpy.ndarray subclass, is not supported; pass a "
     r"plain numpy.ndarray \(its .filled\(value\)\)"),
    (np.ones((3, 2)), np.ones((2, 2)).view(_Tagged), TypeError, "w: .*_Tagged, a numpy.ndarray"),
    (np.ones((3, 2), dtype=">f4"), np.ones((2, 2), np.float32), TypeError,
     r"x: dtype >f4 has the non-native byte order; convert it with x.astype\(float32\)"),
])
def test_bad_arrays_are_refused_clearly(x, w, error, match):
    with pytest.raises(error, match=match):
        optical.matmul(x, w, ideal(), seed=0)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_fortran_ordered_x_gives_the_same_bits(backend):
    """With offset-encoded weights the decoding sums each token's DAC levels;
    the numpy reference summed a Fortran-ordered float64 x's rows in another
    order (last bits differed, 5.7e-14 on wang-2022)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 20))
    w = rng.standard_normal((20, 12))
    for cfg in (optical.presets.get("wang-2022"),
                ideal(**{"encoding.weights": "offset", "mask.contrast_ratio": 50.0})):
        pw = optical.program(w, cfg)
        y = optical.matmul(x, pw, cfg, seed=1, backend=backend)
        for form in (np.asfortranarray(x), np.repeat(x, 2, axis=1)[:, ::2]):
            np.testing.assert_array_equal(optical.matmul(form, pw, cfg, seed=1,
                                                         backend=backend), y)
    # Calibrated on x itself (raw weights): the windows followed x's memory
    # order, by 1e-15 (the pairwise audit).
    x = np.random.default_rng(2).standard_normal((16, 32))
    w = np.random.default_rng(2).standard_normal((32, 24)) / np.sqrt(32)
    cfg = ideal(**{"adc.bits": 3, "adc.full_scale": "calibrated", "encoding.inputs": "offset",
                   "core.inputs": 16, "core.outputs": 12})
    y = optical.matmul(x, w, cfg, seed=1, backend=backend)
    for form in (np.asfortranarray(x), np.repeat(x, 2, axis=1)[:, ::2]):
        np.testing.assert_array_equal(optical.matmul(form, w, cfg, seed=1, backend=backend), y)



@pytest.mark.parametrize("layout", ["C", "F", "strided"])
def test_a_large_weight_is_checked_to_its_last_entry(layout):
    """Past 4M entries the finiteness check runs a chunk at a time (no
    whole-size mask): a NaN or inf anywhere, in any layout, is still found
    and counted."""
    from optical._validation import _FINITE_CHUNK

    w = np.ones((4100, 1100), dtype=np.float32)  # 4.5M entries > 4 chunks
    w = {"C": w, "F": np.asfortranarray(w), "strided": w[:, ::2]}[layout]
    assert w.size > 4 * _FINITE_CHUNK or layout == "strided"
    ok = optical.program(w, ideal())  # finite: accepted
    assert ok.shape == w.shape
    w[-1, -1] = np.nan  # the very last entry, in memory order too
    w[w.shape[0] // 2, 3] = np.inf
    with pytest.raises(ValueError, match="w: contains 2 NaN or infinite"):
        optical.program(w, ideal())
    w[-1, -1] = w[w.shape[0] // 2, 3] = 1.0
    w[0, 0] = np.nan  # the very first entry: in the first chunk
    with pytest.raises(ValueError, match="w: contains 1 NaN or infinite"):
        optical.program(w, ideal())
    w[0, 0] = 1.0
    if layout != "strided":  # each side of a chunk edge, in memory order
        flat = w.ravel(order="K")
        assert np.shares_memory(flat, w)
        for i in (_FINITE_CHUNK - 1, _FINITE_CHUNK, 2 * _FINITE_CHUNK - 1):
            flat[i] = np.nan
            with pytest.raises(ValueError, match="w: contains 1 NaN or infinite"):
                optical.program(w, ideal())
            flat[i] = 1.0


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (1.5, TypeError), (None, TypeError),
                                             (2**64, ValueError), (True, TypeError)])
def test_bad_seed(seed, error):
    with pytest.raises(error, match="seed"):
        optical.matmul(np.ones((1, 2)), np.ones((2, 2)), ideal(), seed=seed)


def test_every_seed_below_2_to_the_64_is_accepted():
    x, w = np.ones((1, 2)), np.ones((2, 2))
    for seed in (0, 2**63, 2**64 - 1, np.uint64(2**64 - 1)):
        np.testing.assert_allclose(optical.matmul(x, w, ideal(), seed=seed), x @ w,
                                   rtol=EXACT_RTOL[np.float64])


def test_bad_config_and_chunks():
    with pytest.raises(TypeError, match="config: expected an OpticalConfig"):
        optical.matmul(np.ones((1, 2)), np.ones((2, 2)), {"adc.bits": 6}, seed=0)
    for bad in (0, True, 2.0, np.bool_(True)):
        with pytest.raises(ValueError, match="chunk_tokens"):
            optical.matmul(np.ones((1, 2)), np.ones((2, 2)), ideal(), seed=0, chunk_tokens=bad)
    # a numpy integer is an integer: the same result as the Python int
    x, w = np.ones((5, 2)), np.ones((2, 3))
    np.testing.assert_array_equal(
        optical.matmul(x, w, ideal(), seed=0, chunk_tokens=np.int64(2)),
        optical.matmul(x, w, ideal(), seed=0, chunk_tokens=2))


def test_zero_tokens_are_an_empty_result_or_a_clear_error(rng):
    w = rng.standard_normal((40, 5)).astype(np.float32)
    iris = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 8})
    pw = optical.program(w, iris, calibration=rng.standard_normal((20, 40)).astype(np.float32))
    y, st = optical.matmul(np.zeros((0, 40), np.float32), pw, iris, seed=0, return_stats=True)
    assert y.shape == (0, 5) and y.dtype == np.float32 and st.passes == 0
    # Raw weights would be calibrated on x, which has nothing to calibrate on.
    with pytest.raises(ValueError, match=r"x: shape \(0, 40\) holds no tokens, and "
                                         r"adc.full_scale = 'calibrated'"):
        optical.matmul(np.zeros((0, 40), np.float32), w, iris, seed=0)
    with pytest.raises(ValueError, match=r"x: shape \(3, 40\) is all zero, and "
                                         r"adc.full_scale = 'calibrated'.*optical.program"):
        optical.matmul(np.zeros((3, 40), np.float32), w, iris, seed=0)
    assert np.all(optical.matmul(np.zeros((3, 40), np.float32), pw, iris, seed=0) == 0)
    # tokens but no input channels: the weights' empty dimension is the problem
    with pytest.raises(ValueError, match=r"w: shape \(0, 5\) has an empty dimension"):
        optical.matmul(np.zeros((3, 0), np.float32), w[:0], iris, seed=0)


def test_numpy_bools_are_bools(rng):
    x, w = rng.standard_normal((3, 40)), rng.standard_normal((40, 5))
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    for flag in (True, False):
        np.testing.assert_array_equal(optical.matmul(x, w, cfg, seed=0, exact=np.bool_(flag)),
                                      optical.matmul(x, w, cfg, seed=0, exact=flag))


@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
@pytest.mark.parametrize("inputs", ["offset", "split"])
def test_a_static_input_range_clips_on_every_backend(rng, backend, exact, inputs):
    """Ideal converters (no DAC levels to clip to) and a static range r:
    inputs beyond r saturate their sources, so y = clip(x, -r, r) @ w to
    float rounding, in chunks too."""
    cal = rng.standard_normal((300, 40))
    x = rng.standard_normal((20, 40)) * 3
    w = rng.standard_normal((40, 7))
    cfg = ideal(**{"dac.scaling": "static", "dac.percentile": 90.0, "encoding.inputs": inputs,
                   "core.inputs": 32, "core.outputs": 8})
    pw = optical.program(w, cfg, calibration=cal)
    r = np.percentile(np.abs(cal), 90.0)
    assert np.mean(np.abs(x) > r) > 0.3
    y = optical.matmul(x, pw, cfg, seed=0, backend=backend, exact=exact, chunk_tokens=16)
    np.testing.assert_allclose(y, np.clip(x, -r, r) @ w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
def test_an_all_zero_token_gives_exactly_zero_whatever_the_units(rng, backend, exact):
    # Per-token scaling: the digital side multiplies a token's readouts by its
    # abs-max, 0 here, so its output is 0 -- not noise in whatever units the
    # other tokens happen to use. The other tokens scale with x.
    x = rng.standard_normal((4, 64))
    x[2] = 0.0
    w = rng.standard_normal((64, 16))
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "optics.model": "ideal"})
    y = optical.matmul(x, w, cfg, seed=0, backend=backend, exact=exact)
    small = optical.matmul(x * 1e-3, w, cfg, seed=0, backend=backend, exact=exact)
    assert np.all(y[2] == 0) and np.all(small[2] == 0)
    np.testing.assert_allclose(small[[0, 1, 3]], 1e-3 * y[[0, 1, 3]], rtol=1e-9)
    # Dynamic bypass: a token whose only nonzero inputs are outlier channels
    # gets their exact digital product.
    x[2, 5] = 50.0
    y = optical.matmul(x, w, cfg.replace({"outliers.policy": "dynamic"}), seed=0,
                       backend=backend, exact=exact)
    np.testing.assert_allclose(y[2], 50.0 * w[5], rtol=1e-12)


@pytest.mark.parametrize("scaling", ["per_column", "per_tile_column"])
@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
def test_an_all_zero_weight_column_gives_exactly_zero_whatever_the_units(rng, backend, exact,
                                                                         scaling):
    # A column's (or a K-tile column's) readouts are multiplied by its abs-max
    # weight scale: 0 for a pruned column, so its output is 0 -- not noise in
    # whatever units w happens to be in. The other columns scale with w.
    x = rng.standard_normal((4, 64))
    w = rng.standard_normal((64, 16))
    w[:, 5] = 0.0
    w[32:, 9] = 0.0  # zero in the second K-tile only
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "optics.model": "ideal",
                   "mask.scaling": scaling})
    y = optical.matmul(x, w, cfg, seed=0, backend=backend, exact=exact)
    small = optical.matmul(x, w * 1e-3, cfg, seed=0, backend=backend, exact=exact)
    assert np.all(y[:, 5] == 0) and np.all(small[:, 5] == 0)
    # column 9 too: per K-tile column, its second K-tile's readouts are dropped
    np.testing.assert_allclose(small, 1e-3 * y, rtol=1e-9, atol=0)


def test_numpy_backend_stats_do_not_depend_on_chunking(rng):
    # The detected photons are summed per token, then once: the same float64
    # bits whatever chunk_tokens (1000 tokens: chunks of 256, 512, 768).
    x = rng.standard_normal((1000, 100))
    w = rng.standard_normal((100, 40))
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 16})
    runs = [optical.matmul(x, w, cfg, seed=0, backend="numpy", chunk_tokens=c,
                           return_stats=True) for c in (None, 1, 700)]
    for y, st in runs[1:]:
        np.testing.assert_array_equal(y, runs[0][0])
        assert st == runs[0][1]


@pytest.mark.parametrize(("backend", "exact"), ALL_BACKENDS)
def test_infinite_photons_remove_dark_and_read_noise_too(rng, backend, exact):
    """Dark and read noise are fixed electron counts, referred to the signal's
    photons: at ``photons_per_mac = inf`` they vanish with the shot noise
    (SourceConfig's docstring), while at finite photons they add noise."""
    x = rng.uniform(-1, 1, (64, 32))
    w = rng.standard_normal((32, 8))
    loud = {"detector.read_noise_electrons": 1e4, "detector.dark_electrons": 1e4}
    at_inf = optical.presets.get("ideal").replace({"core.inputs": 16})
    quiet = _run(x, w, at_inf, 1, backend, exact)[0]
    np.testing.assert_array_equal(_run(x, w, at_inf.replace(loud), 1, backend, exact)[0], quiet)
    finite = at_inf.replace({"source.photons_per_mac": 1e6})
    clean = metrics.sqnr_db(x @ w, _run(x, w, finite, 1, backend, exact)[0])
    noisy = metrics.sqnr_db(x @ w, _run(x, w, finite.replace(loud), 1, backend, exact)[0])
    assert noisy < clean - 10, (noisy, clean)


def test_noise_budget_example_parts_add_up_to_the_preset():
    """examples/noise_budget.py switches iris-like's error sources on one at a
    time: independent errors add in power, so the parts' sum matches the
    preset's own error (within 0.3 dB); every source iris-like has gets a
    row, and the mask pre-distortion leaves the crosstalk at the floor."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "noise_budget.py"
    spec = importlib.util.spec_from_file_location("noise_budget", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 512), dtype=np.float32)
    w = rng.standard_normal((512, 512), dtype=np.float32) / np.float32(512 ** 0.5)
    x_calibration = rng.standard_normal((256, 512), dtype=np.float32)
    parts, floor, full = example.budget(optical.presets.get("iris-like"), x, w, x_calibration)
    assert list(parts) == [name for name, _, _ in example.TERMS]
    total = sum(max(p, 0.0) for p in parts.values()) + floor
    assert abs(10 * math.log10(total / full)) < 0.3, (total, full)
    assert parts["optics (crosstalk)"] < 1e-3 * full
    assert floor < 1e-6 * full


@pytest.mark.parametrize(("backend", "exact"), ALL_BACKENDS)
def test_rin_and_readout_noise_are_independent(rng, backend, exact):
    """Source intensity noise and detector readout noise are separate
    processes: with shot, RIN and read noise of like size on an identity
    matrix (output n sees source n alone), the variances add, var(all) =
    var(shot + RIN) + var(shot + read) - var(shot), where a shared random
    stream would add or remove 2 rho sigma_1 sigma_2, or correlate outputs
    whose sources and readouts are independent."""
    sigma, bandwidth, p, read = 1e-2, 1e9, 1e4, 100.0
    x = np.ones((20480, 16))  # whole 512-row chunks: one JAX program a config
    w = np.eye(16)
    base = {"encoding.inputs": "offset", "core.inputs": 16, "core.outputs": 16,
            "source.photons_per_mac": p, "detector.shot_noise": "gaussian"}  # fast paths
    rin = {"source.rin_db_per_hz": 10 * math.log10(sigma**2 / bandwidth),
           "source.rin_bandwidth": bandwidth}
    variances = {}
    for name, extra in (("shot", {}), ("rin", rin), ("read", {"detector.read_noise_electrons":
                                                                read}),
                        ("all", {**rin, "detector.read_noise_electrons": read})):
        y, _ = _run(x, w, ideal(**base, **extra), 3, backend, exact)
        variances[name] = y.var(axis=0).mean()
        # each output sees its own source and readouts: no two are correlated
        off_diagonal = np.corrcoef(y.T)[~np.eye(16, dtype=bool)]
        assert np.abs(off_diagonal).max() < 0.05, name
    # Offset inputs (one pass) decode as 2 a - 1: each noise reaches y doubled.
    assert variances["rin"] - variances["shot"] == pytest.approx(4 * sigma**2, rel=0.05)
    assert variances["read"] - variances["shot"] == pytest.approx(4 * (read / p) ** 2, rel=0.05)
    expected = variances["rin"] + variances["read"] - variances["shot"]
    assert variances["all"] == pytest.approx(expected, rel=0.03)


def test_memory_mapped_weights_are_accepted_as_arrays(tmp_path, rng):
    """Weights loaded with np.load(..., mmap_mode="r") (a numpy.memmap, as the
    validation allows) program and multiply as the same array in memory does."""
    x = rng.standard_normal((6, 40))
    w = rng.standard_normal((40, 24))
    np.save(tmp_path / "w.npy", w)
    mapped = np.load(tmp_path / "w.npy", mmap_mode="r")
    assert isinstance(mapped, np.memmap)
    cfg = ideal()
    np.testing.assert_array_equal(optical.matmul(x, mapped, cfg, seed=0),
                                  optical.matmul(x, w, cfg, seed=0))
    np.testing.assert_array_equal(optical.program(mapped, cfg).weights,
                                  optical.program(w, cfg).weights)


_BACKENDS = [pytest.param("numpy", False, id="numpy"),
            pytest.param("numba", False, id="numba-fast"),
            pytest.param("numba", True, id="numba-exact")]


@pytest.mark.parametrize("weights", ["split", "offset"])
@pytest.mark.parametrize(("backend", "exact"), _BACKENDS)
def test_each_k_tile_is_rescaled_by_its_own_column_scales(rng, backend, exact, weights):
    """mask.scaling = "per_tile_column": every K-tile column has its own
    abs-max scale. The two K-tiles' weights differ by a factor 1000, so a
    readout rescaled by another K-tile's scale is off by 1000x; the ideal
    machine must still give x @ w (float64, exact up to rounding)."""
    x = rng.standard_normal((5, 48))
    w = rng.standard_normal((48, 12))
    w[32:] *= 1000.0
    cfg = ideal(**{"core.inputs": 32, "core.outputs": 8, "mask.scaling": "per_tile_column",
                   "encoding.weights": weights})
    y = optical.matmul(x, w, cfg, seed=0, backend=backend, exact=exact)
    np.testing.assert_allclose(y, x @ w, rtol=0, atol=1e-9 * np.abs(x @ w).max())


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_programmed_weights_refuse_another_width_or_dtype(rng, backend):
    """optical.matmul's Raises: TypeError for x and w of different dtypes,
    ValueError for shapes that do not chain -- for ProgrammedWeights too."""
    cfg = ideal(**{"core.inputs": 16, "core.outputs": 16})
    pw = optical.program(rng.standard_normal((20, 8)), cfg)
    with pytest.raises(TypeError, match="dtype mismatch"):
        optical.matmul(rng.standard_normal((4, 20)).astype(np.float32), pw, cfg, seed=0,
                       backend=backend)
    with pytest.raises(ValueError, match="shape mismatch"):
        optical.matmul(rng.standard_normal((4, 5)), pw, cfg, seed=0, backend=backend)
    with pytest.raises(ValueError, match="shape mismatch"):  # 5 * 8 = 40 = 2 * 20 rows
        optical.matmul(rng.standard_normal((5, 8)), pw, cfg, seed=0, backend=backend)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_raw_weights_calibrate_on_an_x_with_some_zero_entries(rng, backend):
    """Raw weights with a static input range are calibrated on x; only an
    x *without a non-zero entry* is refused (core._check_calibrates_on). An
    x with zeros in it -- a ReLU's output, padding -- must run, and in the
    ideal limit with a 100th-percentile range give x @ w."""
    x = rng.standard_normal((6, 32))
    x[x < 0] = 0.0
    x[2] = 0.0
    w = rng.standard_normal((32, 8))
    cfg = ideal(**{"core.inputs": 16, "core.outputs": 16, "dac.scaling": "static",
                   "dac.percentile": 100.0})
    y = optical.matmul(x, w, cfg, seed=0, backend=backend)
    np.testing.assert_allclose(y, x @ w, rtol=0, atol=1e-9 * np.abs(x @ w).max())
    with pytest.raises(ValueError, match="is all zero"):
        optical.matmul(np.zeros_like(x), w, cfg, seed=0, backend=backend)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_an_all_zero_or_empty_x_runs_when_nothing_is_calibrated_on_it(rng, backend):
    """Without a setting that needs calibration inputs, raw weights are not
    calibrated on x: an all-zero x gives exactly 0 (core.input_scale: "0 for
    an all-zero row ... such a token's output is exactly 0") and an x
    without tokens an empty result."""
    w = rng.standard_normal((32, 8))
    cfg = ideal(**{"core.inputs": 16, "core.outputs": 16})
    assert not optical.quant.calibration_needs(cfg)
    y = optical.matmul(np.zeros((3, 32)), w, cfg, seed=0, backend=backend)
    np.testing.assert_array_equal(y, np.zeros((3, 8)))
    assert optical.matmul(np.zeros((0, 32)), w, cfg, seed=0, backend=backend).shape == (0, 8)


@pytest.mark.parametrize(("k", "n", "want"), [
    # K = 64 fills exactly two 32-input tiles, N = 48 three 16-output tiles
    (64, 48, dict(k_tiles=2, n_tiles=3, passes=36, weight_loads=6, dac_conversions=1152,
                  adc_conversions=1152, detector_readouts=1152, macs=9216)),
    # K = 50: a partial second K-tile; only the 50 real inputs are converted
    (50, 40, dict(k_tiles=2, n_tiles=3, passes=36, weight_loads=6, dac_conversions=900,
                  adc_conversions=960, detector_readouts=960, macs=6000)),
])
def test_schedule_counted_by_hand_on_non_square_tiles(k, n, want):
    """3 tokens, 32-input x 16-output tiles, split inputs (2 passes), split
    weights on unbalanced rails (2 readouts, 2 ADCs per column):
    passes = T k_tiles n_tiles 2, loads = k_tiles n_tiles, DAC = T 2 n_tiles K,
    readouts = ADC = T k_tiles 2 N 2, MACs = T K N."""
    cfg = ideal(**{"core.inputs": 32, "core.outputs": 16, "encoding.inputs": "split",
                   "encoding.weights": "split", "detector.balanced": False})
    got = optical.schedule(3, k, n, cfg).to_dict()
    assert {key: got[key] for key in want} == want


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_top_k_zero_bypasses_no_channel(policy):
    """"At most this many channels go digital": top_k = 0 is the mapping with
    no bypass, bit for bit."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 64))
    x[:, 3] *= 50
    w = rng.standard_normal((64, 32))
    base = optical.presets.get("ideal").replace({"core.inputs": 64, "core.outputs": 32,
                                                 "mask.bits": 4, "adc.bits": 6, "dac.bits": 6})
    none = optical.matmul(x, w, base, seed=0)
    zero = base.replace({"outliers.policy": policy, "outliers.threshold": None,
                         "outliers.top_k": 0})
    np.testing.assert_array_equal(optical.matmul(x, w, zero, seed=0), none)


@pytest.mark.parametrize("config", ["iris-like", None, {"core": {"inputs": 48}}])
def test_schedule_refuses_a_config_that_is_not_an_optical_config(config):
    """optical.schedule's docstring: "TypeError: config is not an OpticalConfig"."""
    with pytest.raises(TypeError, match="config"):
        optical.schedule(4, 64, 32, config)


#: The mean of max(1 + z, 0) for a standard normal z: Phi(1) + phi(1).
DARKENED_MEAN = 0.5 * (1 + math.erf(1 / math.sqrt(2))) + math.exp(-0.5) / math.sqrt(2 * math.pi)


def lone_source_under_full_rin(photons, **changes):
    """One source at full scale on one open pixel (split rails, x = w = 1)
    under RIN of sigma = 1, the model's limit: its light is max(1 + z, 0)."""
    return ideal(**{"source.photons_per_mac": photons, "source.rin_bandwidth": 1e9,
                    "source.rin_db_per_hz": 10 * math.log10(1.0 / 1e9),
                    "encoding.inputs": "split", "encoding.weights": "split",
                    "core.inputs": 1, "core.outputs": 1, **changes})


@pytest.mark.parametrize("photons", [1e6, math.inf])
@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
def test_rin_never_makes_light_negative(backend, exact, photons):
    """A RIN fluctuation below -1 leaves the source dark (16 % of passes at
    sigma = 1): y = max(1 + z, 0), up to Gaussian shot noise of sd
    sqrt(y / p) < 3e-3, so never below -0.01 and of mean Phi(1) + phi(1) =
    1.0833 (se 0.01 over 8000 tokens; negative light gave 1.0, y down to
    -2.7), on every path and with or without shot noise; the photons
    detected are never negative, token by token."""
    cfg = lone_source_under_full_rin(photons, **{"detector.shot_noise": "gaussian"})
    tokens, w = 8000, np.ones((1, 1))
    y, st = optical.matmul(np.ones((tokens, 1)), w, cfg, seed=1, backend=backend, exact=exact,
                           return_stats=True)
    assert y.min() > -0.01
    assert y.mean() == pytest.approx(DARKENED_MEAN, abs=0.04)
    if math.isfinite(photons):
        assert st.detected_photons / (photons * tokens) == pytest.approx(DARKENED_MEAN, abs=0.04)
        for seed in range(30):  # one token: several seeds draw z < -1
            _, one = optical.matmul(np.ones((1, 1)), w, cfg, seed=seed, backend=backend,
                                    exact=exact, return_stats=True)
            assert one.detected_photons >= 0, seed


@pytest.mark.parametrize(("backend", "exact"), BACKENDS)
def test_adc_codes_follow_the_discretised_gaussian_law(rng, backend, exact):
    """The readout noise's whole law, not only its variance (a tail change
    that kept the variance passed every other test of the fast path). Balanced
    split weights, offset inputs (the fast path's low-rank shot variance),
    Gaussian shot, dark and read noise, x = 0: each conversion reads mean +
    N(0, sigma^2), sigma^2 = sum_r sum_j t_rj / 2 / p + 2 dark / p^2 + read^2 /
    p^2. Windows at mean -+ 31.5 steps put the clip edges (half a step further)
    at -+3 sigma, so code k has probability Phi((k - 31) step / sigma) -
    Phi((k - 32) step / sigma) and a conversion clips with probability
    2 Phi(-3): a chi-square over every column's codes tests the shape, the clip
    count the tails. Decoding: y = 2 s (v - mean) / (1 - t_min)."""
    import dataclasses

    from scipy import stats
    from scipy.special import ndtr

    p, dark, read, t_min, tokens, n = 200.0, 400.0, 30.0, 0.02, 20000, 64
    x = _zero_tokens(tokens + 1, 16)
    w = rng.uniform(-2, 2, (16, n))
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": "gaussian",
                   "detector.dark_electrons": dark, "detector.read_noise_electrons": read,
                   "mask.contrast_ratio": 1 / t_min, "adc.bits": 6,
                   "encoding.inputs": "offset", "encoding.weights": "split",
                   "core.inputs": 16, "core.outputs": n, "dac.scaling": "per_tensor"})
    pw = optical.program(w, cfg)
    t = pw.transmissions.astype(np.float64)
    mean = (t[0] - t[1]).sum(axis=0) / 2
    sigma = np.sqrt(t.sum(axis=(0, 1)) / 2 / p + 2 * dark / p**2 + read**2 / p**2)
    step = 3.0 * sigma / 32
    lo, hi = mean - 31.5 * step, mean + 31.5 * step
    pw = dataclasses.replace(pw, adc_lo=lo[None, None].astype(pw.adc_lo.dtype),
                             adc_hi=hi[None, None].astype(pw.adc_hi.dtype))
    y, st = optical.matmul(x, pw, cfg, seed=3, backend=backend, exact=exact,
                           return_stats=True)
    s = np.abs(w).max(axis=0)
    codes = np.rint(31.5 + y[1:] * (1 - t_min) / (2 * s * step)).astype(int)
    assert codes.min() >= 0 and codes.max() <= 63

    def below(edge):  # P(code < edge + 1/2), in code units of 3 / 32 sigma
        edge = np.where(edge < 0, -np.inf, np.where(edge > 63, np.inf, edge - 31.5))
        return ndtr(edge * 3.0 / 32)

    k = np.arange(64)[:, None]
    law = (below(k + 0.5) - below(k - 0.5)) * tokens  # (64, 1): the same for every column
    seen = np.stack([np.bincount(codes[:, j], minlength=64) for j in range(n)], axis=1)
    keep = np.broadcast_to(law >= 5, seen.shape)
    chi2 = ((seen - law) ** 2 / law)[keep].sum()
    assert stats.chi2.sf(chi2, keep.sum() - n) > 1e-4, chi2
    # The tails: clipped conversions against 2 Phi(-3) per conversion (token 0 too).
    expected = 2 * ndtr(-3.0) * (tokens + 1) * n
    clipped = st.clipped_fraction * st.adc_conversions
    assert abs(clipped - expected) < 5 * math.sqrt(expected), (clipped, expected)


def test_ideal_offset_floor_follows_the_crest_factor():
    """The documented floor of the ideal limit (ARCHITECTURE.md, Dtypes):
    with offset inputs the pedestal the float32 GEMM carries costs about
    20 log10(R) dB when one channel is R times the values carrying the
    output (its weight row zero); split inputs stay near a plain float32
    matmul's error at every R. Truth in float64."""
    rng = np.random.default_rng(1)
    x0 = rng.standard_normal((16, 1024)).astype(np.float32)
    w = (rng.standard_normal((1024, 64)) / 32).astype(np.float32)
    w[7] = 0
    cfg = optical.presets.get("ideal")
    split = cfg.replace({"encoding.inputs": "split"})
    errors = {}
    for r in (1, 100, 1000):
        x = x0.copy()
        x[:, 7] = r * np.abs(x0).max()
        truth = x.astype(np.float64) @ w.astype(np.float64)
        plain = metrics.relative_error(truth, x @ w)
        errors[r] = metrics.relative_error(truth, optical.matmul(x, w, cfg, seed=0, backend="numpy"))
        assert metrics.relative_error(truth, optical.matmul(x, w, split, seed=0, backend="numpy")) \
            < 10 * plain
    assert errors[1] < 2e-5  # the Gaussian floor (102 dB)
    for r in (100, 1000):  # the documented 9e-4 and 9e-3: grows as R, within 3x
        assert 3e-6 * r < errors[r] < 3e-5 * r
