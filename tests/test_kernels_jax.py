"""The JAX backend: the reference's deterministic physics to float32 rounding,
its noise in distribution, vmap over seeds and noise levels, and
straight-through gradients."""

import math
import pathlib

import numpy as np
import pytest
from scipy import stats

import optical
from optical import _rng, metrics

from .configs import ENCODINGS, ideal, noisy

jax = pytest.importorskip("jax")
jnp = jax.numpy
jax_backend = pytest.importorskip("optical.kernels.jax_backend")
_jax_pass = pytest.importorskip("optical.kernels._jax_pass")


# One case by default; the whole grid (JIT compiles per config) in the slow run.
GRID = [pytest.param(i, w, b, marks=() if (i, w, b) == ("offset", "split", True)
                     else pytest.mark.slow)
        for (i, w) in ENCODINGS for b in (True, False)]


@pytest.mark.parametrize(("inputs", "weights", "balanced"), GRID)
def test_deterministic_physics_matches_the_reference(rng, inputs, weights, balanced):
    x = rng.standard_normal((6, 70)).astype(np.float32)
    w = rng.standard_normal((70, 23)).astype(np.float32)
    cfg = ideal(**{"encoding.inputs": inputs, "encoding.weights": weights,
                   "detector.balanced": balanced, "dac.bits": 5, "mask.bits": 4,
                   "adc.bits": 6, "mask.contrast_ratio": 20.0, "adc.headroom": 2.0,
                   "core.inputs": 32, "core.outputs": 10})
    reference = optical.matmul(x, w, cfg, seed=0, backend="numpy")
    y = optical.matmul(jnp.asarray(x), w, cfg, seed=0)
    assert isinstance(y, jax.Array) and y.dtype == jnp.float32 and y.shape == (6, 23)
    close = np.isclose(np.asarray(y), reference, rtol=1e-4, atol=1e-4 * np.abs(reference).max())
    assert close.mean() >= 0.99, f"{(~close).sum()} of {close.size} differ"
    # Those that differ sit at a converter code boundary (float32 rounding
    # moves one code): one code is at most ~1 % of the largest output here
    # (0.5-1.0 % over 5 seeds x 8 encodings), where a wrong output would be
    # of the output's own size (an acceptance audit: the 1 % allowed before
    # bounded how many, not by how much).
    worst = np.abs(np.asarray(y) - reference).max() / np.abs(reference).max()
    assert worst <= 0.02, f"an output differs by {worst:.3g} of the largest"
    ideal_y = optical.matmul(jnp.asarray(x), w, ideal(**{"core.inputs": 32}), seed=0)
    assert metrics.relative_error(x.astype(np.float64) @ w, np.asarray(ideal_y)) < 2e-4


@pytest.mark.slow
@pytest.mark.parametrize("changes", [
    {"detector.shot_noise": "gaussian", "detector.dark_electrons": 10.0},
    {"detector.shot_noise": "poisson", "detector.dark_electrons": 10.0},
    # Split inputs on balanced rails: per-rail shot noise, variance g**2 (T+ + T-) a / p.
    {"encoding.inputs": "split", "detector.read_noise_electrons": 0.0},
    # Dark counts dominate the readout noise (low-rank path).
    {"detector.read_noise_electrons": 0.0, "detector.dark_electrons": 2000.0,
     "source.rin_db_per_hz": -math.inf},
    # Poisson dark counts on one weight rail: their mean must be subtracted.
    {"encoding.weights": "offset", "detector.shot_noise": "poisson",
     "detector.dark_electrons": 200.0},
    # ENOB loss dominates: (4**enob_loss - 1) step**2 / 12 of added variance.
    {"adc.bits": 6, "adc.enob_loss": 3.0, "detector.read_noise_electrons": 0.0,
     "source.photons_per_mac": 1e6, "source.rin_db_per_hz": -math.inf},
])
def test_noise_has_the_reference_distribution(rng, changes):
    x = rng.standard_normal((2, 96)).astype(np.float32)
    w = rng.standard_normal((96, 6)).astype(np.float32)
    cfg = noisy(**{"adc.bits": 10, "core.inputs": 32, **changes})
    copies, seeds = 256, 20  # 512 rows: one chunk of the JAX backend, one program
    xs = np.broadcast_to(x, (copies, *x.shape)).copy()
    ref = np.concatenate([optical.matmul(xs, w, cfg, seed=s, backend="numpy")
                          for s in range(seeds)])
    f = jax.jit(jax.vmap(lambda s: jax_backend.matmul(jnp.asarray(xs), w, cfg, seed=s)))
    got = np.asarray(f(jnp.arange(seeds))).reshape(ref.shape)
    n = ref.shape[0]
    sd = ref.std(axis=0)
    assert np.all(np.abs(got.mean(axis=0) - ref.mean(axis=0)) < 5 * sd * math.sqrt(2 / n))
    ratio = got.var(axis=0) / ref.var(axis=0)
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(4 / n)), ratio
    assert all(stats.ks_2samp(got[:, i, j], ref[:, i, j]).pvalue > 1e-3
               for i in range(2) for j in range(6))


@pytest.mark.slow
def test_vmap_over_seeds_and_noise_levels(rng):
    x = jnp.asarray(rng.standard_normal((8, 100)).astype(np.float32))
    w = rng.standard_normal((100, 40)).astype(np.float32)
    cfg = noisy()
    ys = jax.vmap(lambda s: jax_backend.matmul(x, w, cfg, seed=s))(jnp.arange(3))
    for s in range(3):
        np.testing.assert_array_equal(ys[s], jax_backend.matmul(x, w, cfg, seed=s))
    assert float(jnp.mean(ys[0] != ys[1])) > 0.5
    photons = jnp.asarray([10.0, 100.0, 1000.0])
    path = "source.photons_per_mac"
    f = jax.jit(jax.vmap(lambda p: jax_backend.matmul(x, w, cfg, seed=0, params={path: p})))
    yp = f(photons)
    truth = np.asarray(x) @ w
    sqnr = [metrics.sqnr_db(truth, np.asarray(v)) for v in yp]
    assert sqnr[0] < sqnr[1] < sqnr[2]  # more light, less shot noise
    for i, p in enumerate([10.0, 100.0, 1000.0]):
        # The windows re-derived from a traced photon count are those program() sets.
        direct = jax_backend.matmul(x, w, cfg.replace({path: p}), seed=0)
        np.testing.assert_allclose(yp[i], direct, rtol=1e-4, atol=1e-3 * float(jnp.abs(direct).max()))


def test_gradients_are_the_straight_through_estimate(rng):
    x = rng.standard_normal((16, 100)).astype(np.float32)
    w = rng.standard_normal((100, 40)).astype(np.float32)
    cfg = noisy()

    def loss(xv, wv):
        return jnp.sum(jax_backend.matmul(xv, wv, cfg, seed=3) ** 2)

    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(w))
    assert np.isfinite(gx).all() and np.isfinite(gw).all()
    dy = 2 * np.asarray(jax_backend.matmul(jnp.asarray(x), w, cfg, seed=3), dtype=np.float64)
    # W_eff: the programmed machine without noise or converters, measured on unit inputs.
    clean = cfg.replace({"dac.bits": None, "adc.bits": None, "source.photons_per_mac": math.inf,
                         "source.rin_db_per_hz": -math.inf, "detector.dark_electrons": 0.0,
                         "detector.read_noise_electrons": 0.0})
    w_eff = optical.matmul(np.eye(100), optical.program(w.astype(np.float64), clean), clean,
                           seed=0, backend="numpy")
    np.testing.assert_allclose(gx, dy @ w_eff.T, rtol=1e-4, atol=1e-4 * np.abs(gx).max())
    np.testing.assert_allclose(gw, x.T @ dy, rtol=1e-4, atol=1e-4 * np.abs(gw).max())


@pytest.mark.slow
def test_chunking_stats_and_programmed_weights(rng):
    x = jnp.asarray(rng.standard_normal((50, 100)).astype(np.float32))
    w = rng.standard_normal((100, 40)).astype(np.float32)
    cfg = noisy()
    pw = optical.program(w, cfg)
    first, st = jax_backend.matmul(x, pw, cfg, seed=5, return_stats=True)
    np.testing.assert_array_equal(jax_backend.matmul(x, w, cfg, seed=5), first)
    # Every token draws from its own keys, so chunks draw the same noise; XLA's
    # GEMMs of other shapes round differently (float32), and an ADC code may move.
    poisson = optical.presets.get("wang-2022").replace({"core.inputs": 64, "core.outputs": 16})
    for c, whole in ((cfg, first), (poisson, jax_backend.matmul(x, w, poisson, seed=5))):
        chunked = np.asarray(jax_backend.matmul(x, w, c, seed=5, chunk_tokens=7))
        close = np.isclose(chunked, whole, rtol=1e-4, atol=1e-4 * float(jnp.abs(whole).max()))
        assert close.mean() > 0.99
    _, ref = optical.matmul(np.asarray(x), w, cfg, seed=5, backend="numpy", return_stats=True)
    # Equal up to the RIN draws (3% per source and pass, averaged over 50 x 4 x 2 passes).
    assert st.detected_photons == pytest.approx(ref.detected_photons, rel=5e-3)
    assert st.passes == ref.passes and st.adc_conversions == ref.adc_conversions


def test_noise_is_threefry_s_whatever_the_process_default_prng(rng):
    """Noise is keyed by (seed, noise, token) with threefry (module docstring),
    which keeps chunking and vmaps from moving any draw; a process whose JAX
    default is rbg (a common speed setting on accelerators) silently keyed it
    with rbg, whose vmapped draws depend on the batching (an audit: 6 sigma
    moves between chunk sizes). The default must not reach the pass."""
    x = jnp.asarray(rng.standard_normal((12, 40)).astype(np.float32))
    w = (rng.standard_normal((40, 16)) / 8).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 16})
    with jax.default_prng_impl("rbg"):
        whole = np.asarray(jax_backend.matmul(x, w, cfg, seed=7))
        chunked = np.asarray(jax_backend.matmul(x, w, cfg, seed=7, chunk_tokens=4))
    # Equal but for XLA's float32 GEMMs at another shape (an ADC code may move).
    close = np.isclose(chunked, whole, rtol=0, atol=1e-5 * np.abs(whole).max())
    assert close.mean() > 0.97, close.mean()


def test_poisson_noise_works_in_about_the_memory_gaussian_noise_does(rng):
    """Vmapped over a chunk's tokens, jax.random.poisson's while loops held
    their state for all of them: a chunk's XLA working memory was 3.5x the
    Gaussian-noise chunk's here (13.6 GB for a Llama-3.1-8B up_proj chunk of
    512 tokens on wang-2022). Deterministic: XLA's compiled memory analysis."""
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w = (rng.standard_normal((96, 64)) / 10).astype(np.float32)
    temps = {}
    for law in ("poisson", "gaussian"):
        cfg = optical.presets.get("wang-2022").replace(
            {"optics.model": "ideal", "core.inputs": 32, "core.outputs": 32,
             "detector.shot_noise": law})
        pw = optical.program(w, cfg)
        st = _jax_pass.static_of(pw.shape, cfg, True, frozenset(), np.dtype(np.float32))
        compiled = _jax_pass._chunk_jit.lower(
            st, _jax_pass.device_arrays(pw, st), _jax_pass.noise_params(cfg, None), x,
            np.abs(x).max(axis=1), jnp.uint32(0), jnp.uint32(0), jnp.int32(64),
            jnp.int32(96)).compile()
        temps[law] = compiled.memory_analysis().temp_size_in_bytes
    assert temps["poisson"] <= 1.5 * temps["gaussian"], temps


def test_bad_arguments(rng):
    x = jnp.ones((2, 4))
    w = np.ones((4, 3), np.float32)
    with pytest.raises(ValueError, match="params: 'adc.bits' cannot be varied"):
        jax_backend.matmul(x, w, noisy(), seed=0, params={"adc.bits": 6})
    with pytest.raises(ValueError, match="source.photons_per_mac: -1.0 is out of range"):
        jax_backend.matmul(x, w, noisy(), seed=0, params={"source.photons_per_mac": -1.0})
    with pytest.raises(ValueError, match=r"seed: .* valid: \[0, 2\*\*32\)"):
        jax_backend.matmul(x, w, noisy(), seed=2**40)
    with pytest.raises(ValueError, match="x: contains 1 NaN"):
        optical.matmul(x.at[0, 0].set(jnp.nan), w, noisy(), seed=0)
    with pytest.raises(TypeError, match="x: dtype int32"):
        optical.matmul(jnp.ones((2, 4), jnp.int32), w, noisy(), seed=0)
    with pytest.raises(ValueError, match="backend: 'numba' takes numpy arrays"):
        optical.matmul(x, w, noisy(), seed=0, backend="numba")
    with pytest.raises(TypeError, match="float64 needs"):
        jax_backend.matmul(np.ones((2, 4)), np.ones((4, 3)), noisy(), seed=0)
    # A numpy subclass is refused as on the other backends (a mask was dropped).
    with pytest.raises(TypeError, match="w: numpy.ma.MaskedArray, a numpy.ndarray subclass"):
        optical.matmul(x, np.ma.masked_array(w, mask=np.eye(4, 3)), noisy(), seed=0,
                       backend="jax")
    with pytest.raises(TypeError, match=r"w: numpy\.(rec\.)?recarray, a numpy.ndarray subclass"):
        optical.matmul(x, w.view(np.recarray), noisy(), seed=0, backend="jax")
    with pytest.raises(ValueError, match="return_stats: not available under jit"):
        jax.jit(lambda v: jax_backend.matmul(v, w, noisy(), seed=0, return_stats=True))(x)
    # Flags are bools ("False" is not read as truthy); a float JAX seed is not
    # truncated; a traced 1-D w and a 0-d x are named.
    for flag in ("exact", "return_stats"):
        with pytest.raises(TypeError, match=f"{flag}: expected a bool, got str"):
            jax_backend.matmul(x, w, noisy(), seed=0, **{flag: "False"})
    with pytest.raises(TypeError, match="seed: expected an integer scalar"):
        jax_backend.matmul(x, w, noisy(), seed=jnp.float32(2.7))
    with pytest.raises(ValueError, match=r"w: expected 2 dimensions, got shape \(4,\)"):
        jax.jit(lambda v: jax_backend.matmul(x, v, noisy(), seed=0))(jnp.ones(4, jnp.float32))
    with pytest.raises(ValueError, match="x: expected at least 1 dimension"):
        jax_backend.matmul(jnp.float32(1.0), w, noisy(), seed=0)
    # A numpy x against programmed weights is checked as a JAX x is.
    nan_x = np.ones((2, 4), np.float32)
    nan_x[0, 0] = np.nan
    with pytest.raises(ValueError, match="x: .*NaN"):
        jax_backend.matmul(nan_x, optical.program(w, noisy()), noisy(), seed=0)


def test_static_outlier_bypass_is_the_explicit_decomposition(rng):
    """As on the other backends: the calibrated outlier channels are multiplied
    digitally and the rest runs on the (JAX) optical core with the same seed."""
    x = rng.standard_normal((24, 96)).astype(np.float32)
    x[:, [5, 40]] *= 60.0
    cal = x.copy()
    w = rng.standard_normal((96, 20)).astype(np.float32)
    cfg = noisy(**{"outliers.policy": "static", "adc.full_scale": "calibrated"})
    pw = optical.program(w, cfg, calibration=cal)
    y, st = optical.matmul(jnp.asarray(x), pw, cfg, seed=3, return_stats=True)
    assert st.digital_channels == 2 and st.digital_mac_fraction == pytest.approx(2 / 96)
    keep = np.setdiff1d(np.arange(96), [5, 40])
    rest = optical.program(w[keep], cfg.replace({"outliers.policy": "none"}),
                           calibration=cal[:, keep])
    expect = x[:, [5, 40]] @ w[[5, 40]] + np.asarray(optical.matmul(
        jnp.asarray(x[:, keep]), rest, cfg.replace({"outliers.policy": "none"}), seed=3))
    np.testing.assert_allclose(np.asarray(y), expect, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="JAX backend runs only a static"):
        optical.matmul(jnp.asarray(x), w, cfg.replace({"outliers.policy": "dynamic"}), seed=0)


def _dot_precisions(jaxpr):
    """The precision of every dot_general in a jaxpr, sub-jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            found.append(eqn.params["precision"])
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    found += _dot_precisions(inner)
    return found


@pytest.mark.parametrize("changes", [{}, {"detector.balanced": False},
                                     {"detector.shot_noise": "gaussian"},
                                     {"encoding.inputs": "split", "encoding.weights": "offset"}])
def test_every_product_asks_for_full_float32_the_bypass_and_gradients_included(rng, changes):
    """An audit: the outlier bypass's product, the straight-through
    gradient's (dx W_eff, x dw) and the pass's combinations of rails and
    passes (einsums with +-1 coefficients over the readouts) set no
    precision, which a recent NVIDIA GPU runs through TF32 (10 mantissa
    bits, of the readouts themselves), unlike the pass's GEMMs and the numpy
    and numba backends. Read from the programs' jaxprs (no GPU here)."""
    x = rng.standard_normal((24, 96)).astype(np.float32)
    x[:, [5, 40]] *= 60.0
    w = rng.standard_normal((96, 20)).astype(np.float32)
    cfg = noisy(**{"outliers.policy": "static", "adc.full_scale": "calibrated", **changes})
    pw = optical.program(w, cfg, calibration=x)
    assert pw.bypass.channels.size == 2
    forward = jax.make_jaxpr(lambda v: jax_backend.matmul(v, pw, cfg, seed=1))(jnp.asarray(x))
    rules = cfg.replace({"outliers.policy": "none", "adc.full_scale": "rms"})  # a traced w
    backward = jax.make_jaxpr(jax.grad(
        lambda v, m: jax_backend.matmul(v, m, rules, seed=1).sum(), argnums=(0, 1)))(
        jnp.asarray(x), jnp.asarray(w))
    bypassed = jax.make_jaxpr(jax.grad(lambda v: jax_backend.matmul(v, pw, cfg, seed=1).sum()))(
        jnp.asarray(x))
    highest = (jax.lax.Precision.HIGHEST,) * 2
    for jaxpr in (forward, backward, bypassed):
        precisions = _dot_precisions(jaxpr.jaxpr)
        assert precisions and all(p == highest for p in precisions), precisions


def test_raw_weights_calibrate_on_one_token_itself(rng):
    """Raw weights calibrate on x (the oracle): one token's point windows read
    it exactly, where held-out (optical.program) they are refused."""
    cfg = ideal(**{"adc.bits": 8, "adc.full_scale": "calibrated"})
    x = rng.standard_normal((1, 96)).astype(np.float32)
    w = rng.standard_normal((96, 20)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0)),
                               x @ w, rtol=1e-5, atol=1e-5 * np.abs(x @ w).max())
    with pytest.raises(ValueError, match="there is one calibration row"):
        optical.program(w, cfg, calibration=x)


def test_matmul_runs_checks_every_argument(rng):
    x = rng.standard_normal((3, 40)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32})
    pw = optical.program(rng.standard_normal((40, 5)).astype(np.float32), cfg)
    path = "source.photons_per_mac"
    # Each run's values are the config's ranges (named), not traced through unchecked.
    with pytest.raises(ValueError, match=r"source.photons_per_mac: -5.0 is out of range"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[0, 1], params={path: [10.0, -5.0]})
    with pytest.raises(ValueError, match="detector.read_noise_electrons: nan"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[0],
                                params={"detector.read_noise_electrons": [math.nan]})
    with pytest.raises(ValueError, match="adc.enob_loss"):  # a cross-field rule: < adc.bits
        jax_backend.matmul_runs(x, pw, cfg, seeds=[0], params={"adc.enob_loss": [30.0]})
    with pytest.raises(ValueError, match=r"params\['source.photons_per_mac'\]: expected .* 2"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[0, 1], params={path: [10.0]})
    with pytest.raises(ValueError, match="params: 'adc.bits' cannot be varied"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[0], params={"adc.bits": [6]})
    # Seeds: integers in [0, 2**32), not truncated floats or wrapped negatives.
    with pytest.raises(TypeError, match="^seeds: expected a non-negative integer, got float$"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[1.7, 2.2])
    # A concrete JAX array of seeds is its ints (it was refused, as 'seed').
    np.testing.assert_array_equal(jax_backend.matmul_runs(x, pw, cfg, seeds=jnp.arange(2))[0],
                                  jax_backend.matmul_runs(x, pw, cfg, seeds=[0, 1])[0])
    with pytest.raises(ValueError, match=r"seeds: -1 is negative; valid for the JAX backend"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[-1])
    with pytest.raises(ValueError, match=r"seeds: 4294967296 is out of range"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[2**32])
    with pytest.raises(TypeError, match="seeds: expected a sequence of ints, got int"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=3)
    with pytest.raises(ValueError, match="seeds: empty"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=[])
    # x against the programmed weights.
    with pytest.raises(ValueError, match="x has 39 features"):
        jax_backend.matmul_runs(x[:, :39], pw, cfg, seeds=[0])
    with pytest.raises(TypeError, match="dtype mismatch: x is float64 but w is float32"):
        jax_backend.matmul_runs(x.astype(np.float64), pw, cfg, seeds=[0])
    # Raw weights are not programmed ones; chunks are positive ints, named.
    with pytest.raises(TypeError, match="pw: expected ProgrammedWeights, got ndarray"):
        jax_backend.matmul_runs(x, rng.standard_normal((40, 5)).astype(np.float32), cfg,
                                seeds=[0])
    for chunk in (0, -1, 2.5):
        with pytest.raises(ValueError, match="chunk_tokens"):
            jax_backend.matmul_runs(x, pw, cfg, seeds=[0], chunk_tokens=chunk)
    # A negative numpy seed is named as the argument it came in.
    with pytest.raises(ValueError, match=r"seeds: -1 is negative; valid for the JAX backend"):
        jax_backend.matmul_runs(x, pw, cfg, seeds=np.array([-1]))
    with pytest.raises(ValueError, match=r"seed: -1 is negative; valid for the JAX backend"):
        jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=np.int64(-1))
    # Numpy integer seeds are fine, and give the runs of matmul itself.
    ys, _, _ = jax_backend.matmul_runs(x, pw, cfg, seeds=np.array([4, 9]))
    for i, s in enumerate((4, 9)):
        np.testing.assert_array_equal(ys[i], np.asarray(jax_backend.matmul(x, pw, cfg, seed=s)))


def test_zero_tokens(rng):
    w = rng.standard_normal((40, 5)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32})
    y, st = jax_backend.matmul(jnp.zeros((0, 40), jnp.float32), optical.program(w, cfg), cfg,
                               seed=0, return_stats=True)
    assert y.shape == (0, 5) and y.dtype == jnp.float32
    assert st.passes == 0 and st.detected_photons == 0.0 and st.clipped_fraction == 0.0
    # Calibrating on x itself needs tokens: the error says so and what to do.
    iris = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 8})
    with pytest.raises(ValueError, match=r"x: shape \(0, 40\) holds no tokens.*optical.program"):
        jax_backend.matmul(jnp.zeros((0, 40), jnp.float32), w, iris, seed=0)
    with pytest.raises(ValueError, match=r"x: shape \(3, 40\) is all zero.*optical.program"):
        jax_backend.matmul(jnp.zeros((3, 40), jnp.float32), w, iris, seed=0)
    # tokens but no input channels: the weights' empty dimension is named
    with pytest.raises(ValueError, match=r"w: shape \(0, 5\) has an empty dimension"):
        jax_backend.matmul(jnp.zeros((3, 0), jnp.float32), w[:0], iris, seed=0)


def test_batched_runs_cast_nothing_silently(rng):
    w = rng.standard_normal((40, 5))
    cfg = noisy(**{"core.inputs": 32})
    with pytest.raises(TypeError, match="x: float64 needs jax.config.update"):
        jax_backend.matmul_runs(rng.standard_normal((4, 40)), optical.program(w, cfg), cfg,
                                seeds=[0, 1])


def test_programmed_weights_survive_a_jit_trace(rng):
    # The device arrays cached on a ProgrammedWeights must be concrete, even
    # when a jit trace asked for them first: later calls reuse them.
    x = jnp.asarray(rng.standard_normal((4, 64)).astype(np.float32))
    w = rng.standard_normal((64, 16)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    pw = optical.program(w, cfg)
    traced = jax.jit(lambda v: jax_backend.matmul(v, pw, cfg, seed=0))(x)
    eager = jax_backend.matmul(x, pw, cfg, seed=0)
    np.testing.assert_array_equal(np.asarray(traced), np.asarray(eager))
    again = jax.jit(lambda v: jax_backend.matmul(v * 1, pw, cfg, seed=1))(x)
    assert np.isfinite(np.asarray(again)).all()


def test_a_traced_seed_keeps_every_bit_behind_an_adc(rng):
    """docs/ARCHITECTURE.md (Reproducibility): an outer jit or a traced seed
    keeps every bit behind an ADC (wang-2022 with adc.bits=8), also with x and
    the weights closed over, constants of the jit that XLA must not fold
    (folded, 135 of these 720 outputs moved)."""
    cfg = optical.presets.get("wang-2022").replace({"adc.bits": 8})
    x = rng.standard_normal((16, 150)).astype(np.float32)
    pw = optical.program(rng.standard_normal((150, 45)).astype(np.float32), cfg)
    eager = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=9))
    traced = jax.jit(lambda s: jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=s))(
        jnp.uint32(9))
    np.testing.assert_array_equal(np.asarray(traced), eager)


@pytest.mark.parametrize("exact", [False, True])
def test_rin_never_makes_light_negative(exact):
    """As on numpy and numba (test_matmul.py): under RIN of sigma = 1 a lone
    source detects max(1 + z, 0) of its light, y of mean Phi(1) + phi(1)
    (negative light gave 1.0, y down to -2.6), and photons of that mean."""
    from .test_matmul import DARKENED_MEAN, lone_source_under_full_rin

    p, tokens = 1e6, 8000
    cfg = lone_source_under_full_rin(p, **{"detector.shot_noise": "gaussian"})
    y, st = jax_backend.matmul(jnp.ones((tokens, 1), jnp.float32), np.ones((1, 1), np.float32),
                               cfg, seed=1, exact=exact, return_stats=True)
    y = np.asarray(y, dtype=np.float64)
    assert y.min() > -0.01
    assert y.mean() == pytest.approx(DARKENED_MEAN, abs=0.04)
    assert st.detected_photons / (p * tokens) == pytest.approx(DARKENED_MEAN, abs=0.04)


def _assert_rederived_windows_are_programmed(rng, base, params):
    """``matmul`` with ``params`` passed through (the ADC windows re-derived
    from the rule in the trace) equals ``matmul`` of the config holding those
    values (windows set by program() on the host, in float64); returns the
    output. x (6, 70) @ w (70, 30)."""
    x = jnp.asarray(rng.standard_normal((6, 70)).astype(np.float32))
    w = rng.standard_normal((70, 30)).astype(np.float32)
    as_programmed = np.asarray(jax_backend.matmul(x, w, base.replace(params), seed=0))
    rederived = np.asarray(jax_backend.matmul(x, w, base, seed=0, params=params))
    np.testing.assert_allclose(rederived, as_programmed, rtol=1e-4,
                               atol=1e-4 * np.abs(as_programmed).max())
    return as_programmed, w


@pytest.mark.parametrize("full_scale", ["rms", "max"])
@pytest.mark.parametrize("window", ["per_column", "per_tile"])
def test_rederived_windows_keep_the_per_tile_policy(rng, full_scale, window):
    # Per-tile windows are shared by each tile's columns (30 columns in
    # tiles of 20: a partial last tile of 10).
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 20, "adc.window": window,
                   "adc.full_scale": full_scale, "source.photons_per_mac": 30.0})
    _assert_rederived_windows_are_programmed(rng, cfg, {"source.photons_per_mac": 40.0})


def test_rederived_rms_windows_stop_at_the_noise_free_extremes(rng):
    # A headroom of 20 deviations on one weight rail (offset weights, all
    # transmissions >= 0): mean -+ 20 sd of the signal reaches far below the
    # lowest noise-free readout (0) and above the highest, so the "rms" rule
    # stops the window there, widened by the noise alone (quant's
    # max(mean - half, floor - noise_half)).
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 20, "adc.full_scale": "rms",
                   "adc.headroom": 20.0, "encoding.weights": "offset", "adc.bits": 6})
    params = {"source.photons_per_mac": 1e4}
    _, w = _assert_rederived_windows_are_programmed(rng, cfg, params)
    pw = optical.program(w, cfg.replace(params))
    assert pw.adc_lo.min() > -0.1 * (pw.adc_hi - pw.adc_lo).max()  # the floor (0) binds


def test_rederived_windows_of_a_read_noise_past_float32_range(rng):
    # A read noise of 1e30 electrons per photon (valid, though unphysical):
    # its variance overflows float32, yet the windows re-derived in the trace
    # are program()'s, and the output is finite.
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 20, "adc.full_scale": "rms",
                   "detector.shot_noise": "gaussian", "source.photons_per_mac": 1.0})
    y, _ = _assert_rederived_windows_are_programmed(
        rng, cfg, {"detector.read_noise_electrons": 1e30})
    assert np.isfinite(y).all()


@pytest.mark.filterwarnings("ignore:overflow encountered")  # numpy's float32 noise
@pytest.mark.parametrize("exact", [False, True])
def test_a_deviation_past_float32_clips_every_conversion(rng, exact):
    # Read noise 1e40 times the photons per MAC: its deviation is inf in
    # float32, and every conversion clips to one of its window's rails, as
    # on the numpy reference (whose outputs' magnitudes are the rails'
    # combinations, whatever side the noise fell on) -- not NaN.
    x = rng.uniform(-1, 1, (8, 16)).astype(np.float32)
    w = rng.uniform(-1, 1, (16, 8)).astype(np.float32)
    cfg = ideal(**{"core.inputs": 16, "core.outputs": 8, "detector.shot_noise": "gaussian",
                   "adc.bits": 8, "adc.full_scale": "max", "source.photons_per_mac": 1e-10,
                   "detector.read_noise_electrons": 1e30})
    y, stats = jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0, exact=exact,
                                  return_stats=True)
    ref = optical.matmul(x, w, cfg, seed=0, backend="numpy")
    assert stats.clipped_fraction == 1.0
    np.testing.assert_allclose(np.sort(np.abs(np.asarray(y)).ravel()),
                               np.sort(np.abs(ref).ravel()), rtol=1e-5)


def test_poisson_shot_noise_at_large_and_infinite_photon_counts(rng):
    # jax.random.poisson counts in int32 and, in float32, overstates the
    # variance at large means; the backend draws the normal law there. Truth:
    # the numpy reference's SQNR at the same settings (within 1.5 dB), and at
    # photons_per_mac = inf (traced, through params) the noise-free result.
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    cfg = optical.presets.get("wang-2022").replace({
        "core.inputs": 32, "core.outputs": 16, "adc.full_scale": "rms", "adc.bits": None,
        "outliers.policy": "none", "detector.shot_noise": "poisson"})
    exact = x.astype(np.float64) @ w
    for p in (1e6, 1e9):
        c = cfg.replace({"source.photons_per_mac": p})
        got = metrics.sqnr_db(exact, np.asarray(jax_backend.matmul(jnp.asarray(x), w, c, seed=0)))
        want = metrics.sqnr_db(exact, optical.matmul(x, w, c, seed=0, backend="numpy"))
        assert abs(got - want) < 1.5, (p, got, want)
    c = cfg.replace({"source.photons_per_mac": 100.0})
    noiseless = cfg.replace({"source.photons_per_mac": math.inf})
    y = jax.vmap(lambda p: jax_backend.matmul(jnp.asarray(x), w, c, seed=0,
                                              params={"source.photons_per_mac": p}))(
        jnp.array([100.0, jnp.inf]))
    np.testing.assert_allclose(np.asarray(y[1]),
                               np.asarray(jax_backend.matmul(jnp.asarray(x), w, noiseless,
                                                             seed=0)), rtol=1e-5, atol=1e-5)


def test_large_poisson_means_have_poisson_moments():
    # Above POISSON_NORMAL_ABOVE the draws are the normal law: mean and
    # variance lam (standard errors 0.2 % of the variance at 2e5 draws).
    lam = jnp.full((4, 50_000), 3e6, jnp.float32)
    counts = np.asarray(_jax_pass._token_poisson(jax.random.PRNGKey(0), 1, 0, lam),
                        np.float64)
    assert abs(counts.mean() / 3e6 - 1) < 1e-5
    assert abs(counts.var() / 3e6 - 1) < 0.015


def _standard_deviations(lam):
    """2e5 Poisson deviations (counts - mean) of float32 means ``lam``, in
    units of sqrt(mean)."""
    m = jnp.full((4, 50_000), lam, jnp.float32)
    dev = np.asarray(_jax_pass._token_poisson(jax.random.PRNGKey(0), 2, 0, m, deviation=True),
                     np.float64)
    return dev / math.sqrt(float(np.float32(lam)))


@pytest.mark.parametrize("lam", [1e14, 1e16, 1e30])
def test_poisson_deviations_keep_their_law_at_huge_means_in_float32(lam):
    # Dark counts are drawn as deviations from their mean: counts - lam in
    # float32 kept the count's rounding to lam's spacing instead (variance
    # 1.06 lam at 1e14, none at all from 1e16 on).
    z = _standard_deviations(lam)
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / z.size)


@pytest.mark.parametrize("lam", [0.4, 3.7, 250.5])
def test_poisson_deviations_of_fractional_means_are_centred(lam):
    # Below a whole-number mean the deviation is counts - lam exactly, not
    # counts - round(lam), which would leave an offset of (lam - round(lam))
    # counts on every dark readout (0.4 counts at a mean of 0.4).
    z = _standard_deviations(lam)
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    assert abs(z.var() - 1) < 5 * math.sqrt(2 / z.size) * (1 + 1 / math.sqrt(lam))


@pytest.mark.parametrize("dark", [1e16, 1e30])
def test_poisson_dark_noise_keeps_its_variance_in_float32(dark):
    # A balanced pair of rails read out twice (split inputs): dark counts add
    # 4 D / p**2 to each output (the shot noise, x @ w / p = 10, is far below).
    tokens = 20_000
    x = np.ones((tokens, 16), np.float32)
    w = np.full((16, 2), 0.5, np.float32)
    w[0] = 1.0
    cfg = ideal(**{"source.photons_per_mac": 1.0, "encoding.inputs": "split",
                   "detector.dark_electrons": dark, "core.inputs": 16})
    y = np.asarray(jax_backend.matmul(jnp.asarray(x), w, cfg, seed=3, chunk_tokens=tokens),
                   np.float64)
    theory = 4 * dark
    assert np.all(np.abs(y.mean(axis=0) - x[0] @ w) < 5 * np.sqrt(theory / tokens))
    assert np.all(np.abs(y.var(axis=0) / theory - 1) < 5 * math.sqrt(2 / tokens))


def test_traced_arguments_are_checked_like_concrete_ones(rng):
    x = jnp.asarray(rng.standard_normal((4, 64)).astype(np.float32))
    w = rng.standard_normal((64, 16)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    # The dynamic bypass cannot run under a trace: refused, not skipped.
    dynamic = cfg.replace({"outliers.policy": "dynamic"})
    with pytest.raises(ValueError, match="outliers.policy = 'dynamic'"):
        jax.jit(lambda v: jax_backend.matmul(x, v, dynamic, seed=0))(jnp.asarray(w))
    # params are checked together, with the rules between fields.
    with pytest.raises(ValueError, match="relative intensity noise"):
        jax_backend.matmul(x, w, cfg, seed=0, params={"source.rin_db_per_hz": -100.0,
                                                      "source.rin_bandwidth": 1e12})
    with pytest.raises(TypeError, match="params: source.photons_per_mac = 'abc'"):
        jax_backend.matmul(x, w, cfg, seed=0, params={"source.photons_per_mac": "abc"})
    with pytest.raises(TypeError, match="params: expected a mapping"):
        jax_backend.matmul(x, w, cfg, seed=0, params=[("source.photons_per_mac", 1.0)])
    # A traced noise level goes through params, as a scalar per call.
    with pytest.raises(ValueError, match="source.photons_per_mac: a traced value cannot be a "
                                         "config field; pass traced noise levels .* as params"):
        jax.vmap(lambda p: jax_backend.matmul(
            x, w, cfg.replace({"source.photons_per_mac": p}), seed=0))(jnp.array([1e3, 1e4]))
    with pytest.raises(ValueError, match="adc.bits: a traced value cannot be a config field"):
        jax.vmap(lambda b: cfg.replace({"adc.bits": b}))(jnp.array([6, 8]))
    with pytest.raises(TypeError, match=r"params: source.photons_per_mac is traced with shape "
                                        r"\(3,\); expected a scalar"):
        jax.vmap(lambda p: jax_backend.matmul(x, w, cfg, seed=0, params={
            "source.photons_per_mac": p}))(jnp.full((2, 3), 1e3))
    # A concrete JAX seed is range-checked like an int.
    with pytest.raises(ValueError, match=r"seed: -1 is negative; valid for the JAX backend"):
        jax_backend.matmul(x, w, cfg, seed=jnp.int32(-1))
    with pytest.raises(ValueError, match=r"seed: -1 is negative"):
        jax_backend.matmul(x, w, cfg, seed=-1)


def test_vmap_over_x_gives_lanes_of_one_seed_the_same_noise(rng):
    """Noise is keyed by the token's index within the call (module
    docstring): vmapped lanes of equal inputs and one seed get equal
    outputs, while the same batch as leading axes of x draws each token's own."""
    w = rng.standard_normal((64, 16)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    pw = optical.program(w, cfg)
    token = rng.standard_normal((5, 64)).astype(np.float32)
    batch = jnp.asarray(np.stack([token, token]))
    lanes = np.asarray(jax.vmap(lambda v: jax_backend.matmul(v, pw, cfg, seed=3))(batch))
    np.testing.assert_array_equal(lanes[0], lanes[1])
    leading = np.asarray(jax_backend.matmul(batch, pw, cfg, seed=3))
    assert not np.array_equal(leading[0], leading[1])


def test_an_all_zero_token_gives_exactly_zero(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    x[2] = 0.0
    w = rng.standard_normal((64, 16)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    for scale in (1.0, 1e-3):
        y = np.asarray(jax_backend.matmul(jnp.asarray(x * scale), w, cfg, seed=0))
        assert np.all(y[2] == 0) and np.all(y[[0, 1, 3]] != 0)


def test_an_all_zero_weight_column_gives_exactly_zero(rng):
    x = rng.standard_normal((4, 64)).astype(np.float32)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    w[:, 5] = 0.0
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    for scale in (1.0, 1e-3):
        y = np.asarray(jax_backend.matmul(jnp.asarray(x), w * scale, cfg, seed=0))
        assert np.all(y[:, 5] == 0) and np.all(y[:, [4, 6]] != 0)


#: The largest core (``core.inputs``/``outputs`` are valid up to 1 << 20):
#: one rail of it padded in float32 is 4 TiB.
HUGE_CORE = {"core.inputs": 1 << 20, "core.outputs": 1 << 20}


def test_a_matrix_smaller_than_the_core_is_not_padded_to_it(rng):
    """A matrix smaller than the core sits at its first rows and outputs, as
    on the numpy and numba backends: the JAX pass's arrays are the matrix's
    size, not the core's, and the ideal machine computes x @ w (with w
    programmed, and traced through jit)."""
    x = rng.standard_normal((4, 70)).astype(np.float32)
    w = rng.standard_normal((70, 45)).astype(np.float32)
    cfg = ideal(**HUGE_CORE)
    st = _jax_pass.static_of(w.shape, cfg, False, frozenset(), np.float32)
    assert (st.tile_k, st.tile_n, st.k_tiles, st.n_tiles) == (70, 45, 1, 1)
    pw = optical.program(w, cfg)
    assert _jax_pass.device_arrays(pw, st)["sig"].shape == (1, 1, 1, 70, 45)
    expect = x.astype(np.float64) @ w
    atol = 1e-5 * np.abs(expect).max()
    np.testing.assert_allclose(np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=0)),
                               expect, rtol=1e-5, atol=atol)
    traced = jax.jit(lambda v: jax_backend.matmul(jnp.asarray(x), v, cfg, seed=0))(
        jnp.asarray(w))
    np.testing.assert_allclose(np.asarray(traced), expect, rtol=1e-5, atol=atol)
    # Larger than a smaller core: whole core-sized tiles, the last one partial.
    st = _jax_pass.static_of((70, 45), ideal(**{"core.inputs": 32, "core.outputs": 20}),
                             False, frozenset(), np.float32)
    assert (st.tile_k, st.tile_n, st.k_tiles, st.n_tiles) == (32, 20, 3, 3)


@pytest.mark.parametrize(("shot_noise", "exact"), [("gaussian", False), ("gaussian", True),
                                                   ("poisson", False)])
def test_a_noisy_matrix_smaller_than_the_core_has_the_numba_distribution(rng, shot_noise,
                                                                         exact):
    """Every noise, 8-bit ADC windows shared per tile, on the largest core:
    the JAX outputs have numba's mean and variance (one seed each, 250
    copies of two tokens, one jitted chunk; standard errors sd sqrt(2 / 250)
    and sqrt(4 / 250))."""
    x = rng.standard_normal((2, 70)).astype(np.float32)
    w = rng.standard_normal((70, 45)).astype(np.float32)
    cfg = ideal(**{**HUGE_CORE, "source.photons_per_mac": 40.0, "source.rin_db_per_hz": -120.0,
                   "detector.read_noise_electrons": 30.0, "detector.shot_noise": shot_noise,
                   "dac.bits": 6, "mask.bits": 6, "adc.bits": 8, "adc.window": "per_tile"})
    pw = optical.program(w, cfg)
    copies = 250
    xs = np.broadcast_to(x, (copies, *x.shape)).reshape(-1, 70).copy()
    ref = optical.matmul(xs, pw, cfg, seed=0, backend="numba", exact=exact).reshape(copies, 2, 45)
    got = np.asarray(jax_backend.matmul(jnp.asarray(xs), pw, cfg, seed=0, exact=exact)).reshape(
        copies, 2, 45)
    sd = ref.std(axis=0)
    assert np.all(np.abs(got.mean(axis=0) - ref.mean(axis=0)) < 5 * sd * math.sqrt(2 / copies))
    ratio = got.var(axis=0) / ref.var(axis=0)
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(4 / copies)), ratio


def test_rederived_per_tile_windows_of_a_matrix_smaller_than_the_core(rng):
    # One tile holds all 30 columns: the windows re-derived in the trace are
    # shared over them alone, as program() shares them.
    cfg = ideal(**{**HUGE_CORE, "source.photons_per_mac": 30.0,
                   "detector.read_noise_electrons": 30.0, "detector.shot_noise": "gaussian",
                   "adc.bits": 8, "adc.window": "per_tile"})
    _assert_rederived_windows_are_programmed(rng, cfg, {"source.photons_per_mac": 40.0})


def test_readout_stream_is_its_own():
    # The readout normals must not reuse a physical noise's stream (RIN's
    # normals would then be the readout's, correlated sample by sample).
    assert _jax_pass._STREAM_READOUT not in _rng.STREAMS.values()


def test_max_windows_never_clip(rng):
    # full_scale "max": the window holds every possible noise-free readout,
    # so a full-scale input on all-positive weights lands on the top code,
    # which is not a clipped conversion.
    cfg = ideal(**{"adc.bits": 6, "adc.full_scale": "max", "core.inputs": 32,
                   "core.outputs": 8})
    x = np.ones((4, 40), np.float32)
    w = rng.uniform(0.1, 1.0, (40, 12)).astype(np.float32)
    _, ref = optical.matmul(x, w, cfg, seed=0, backend="numpy", return_stats=True)
    _, got = jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0, return_stats=True)
    assert ref.clipped_fraction == 0.0
    assert got.clipped_fraction == 0.0


def test_per_tensor_input_scale_matches_the_reference(rng):
    x = rng.standard_normal((6, 40)).astype(np.float32)
    x[0] *= 30.0  # one loud token sets the per-tensor scale; the rest sit on few DAC levels
    w = rng.standard_normal((40, 12)).astype(np.float32)
    cfg = ideal(**{"dac.bits": 4, "dac.scaling": "per_tensor", "core.inputs": 32,
                   "core.outputs": 8})
    ref = optical.matmul(x, w, cfg, seed=0, backend="numpy")
    got = np.asarray(jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_a_traced_w_under_a_calibrating_config_names_what_would_work(rng):
    """jax.grad with respect to w under iris-like (calibrated windows, static
    outliers): refused, naming the rule-based settings that differentiate w;
    with them the gradient is the straight-through x^T dy."""
    x = jnp.asarray(rng.standard_normal((8, 64)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((64, 16)).astype(np.float32))
    iris = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 8})

    def loss(config):
        return lambda wv: jnp.sum(jax_backend.matmul(x, wv, config, seed=0))

    with pytest.raises(ValueError, match=r"adc.full_scale = 'calibrated' and outliers.policy = "
                                         r"'static' is set from calibration inputs.*"
                                         r"adc.full_scale='max' or 'rms'"):
        jax.grad(loss(iris))(w)
    rule = iris.replace({"adc.full_scale": "rms", "outliers.policy": "none"})
    np.testing.assert_allclose(jax.grad(loss(rule))(w), np.asarray(x).T @ np.ones((8, 16)),
                               rtol=1e-5)


@pytest.mark.parametrize("changes", [{}, {"dac.bits": 8}])
def test_every_order_and_mode_of_derivative_is_the_straight_through_estimate(rng, changes):
    """jax.hessian (jacfwd of jacrev) of sum(y**2) is 2 W_eff W_eff^T per token
    under the straight-through rule; on the ideal preset W_eff is w, so the
    truth is the exact matmul's 2 W W^T. (Seen: the outer derivative ran
    through the forward pass itself: 0 under an 8-bit DAC, and on ideal the
    abs-max channel's column halved by the clip at +-1.) Forward mode gives
    the reverse-mode Jacobian in x and w (jacfwd was refused outright)."""
    x = rng.standard_normal((1, 16)).astype(np.float32)
    w = rng.standard_normal((16, 16)).astype(np.float32)
    cfg = ideal(**{"core.inputs": 16, "core.outputs": 16, **changes})

    def loss(v):
        return jnp.sum(jax_backend.matmul(v, w, cfg, seed=0) ** 2)

    h = np.asarray(jax.hessian(loss)(jnp.asarray(x)), np.float64).reshape(16, 16)
    expected = 2 * w.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_allclose(h, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())
    xs = rng.standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(  # dy[t, n] / dw[k, m] = x[t, k] delta(n, m)
        jax.jacfwd(lambda v: jax_backend.matmul(xs, v, cfg, seed=0))(jnp.asarray(w)),
        np.einsum("tk,nm->tnkm", xs, np.eye(16)), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(  # dy[t, n] / dx[s, k] = w[k, n] delta(t, s)
        jax.jacfwd(lambda v: jax_backend.matmul(v, w, cfg, seed=0))(jnp.asarray(xs)),
        np.einsum("kn,ts->tnsk", w, np.eye(3)), rtol=1e-5, atol=1e-6)
    # Across x and w, in both orders, that of sum(x @ w): 1 where the K indices
    # match. (Seen: d2/dx dw was 0 while d2/dw dx was 1.)
    h = jax.hessian(lambda a, b: jnp.sum(jax_backend.matmul(a, b, cfg, seed=0)),
                    argnums=(0, 1))(jnp.asarray(xs), jnp.asarray(w))
    cross = np.einsum("kj,tn->tkjn", np.eye(16), np.ones((3, 16)))
    np.testing.assert_allclose(h[0][1], cross, atol=1e-6)
    np.testing.assert_allclose(h[1][0], cross.transpose(2, 3, 0, 1), atol=1e-6)


def test_raw_weights_under_a_calibrating_config_calibrate_on_a_numpy_x_inside_jit(rng):
    """The module docstring's jit(vmap) over seeds, with a numpy x closed over
    and raw weights under iris-like: calibrated on x (its values are known
    inside the trace), exactly as weights programmed on x beforehand. A traced
    x cannot be calibrated on: refused, naming the way out."""
    x = rng.standard_normal((8, 64)).astype(np.float32)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    iris = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 8})

    def seeds(weights):
        return jax.jit(jax.vmap(lambda s: jax_backend.matmul(x, weights, iris, seed=s)))(
            jnp.arange(3))

    expected = seeds(optical.program(w, iris, calibration=x))
    np.testing.assert_array_equal(np.asarray(seeds(w)), np.asarray(expected))
    with pytest.raises(ValueError, match=r"x is traced .* adc.full_scale = 'calibrated' and "
                                         r"outliers.policy = 'static' is calibrated on x .*"
                                         r"optical.program\(w, config, calibration=...\)"):
        jax.grad(lambda v: jnp.sum(jax_backend.matmul(v, w, iris, seed=0)))(jnp.asarray(x))


def test_a_new_static_input_range_does_not_recompile(rng):
    """The static range reaches the jitted code as an array: programming the
    same shapes again (another range) reuses the compiled pass."""
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "dac.scaling": "static"})
    w = rng.standard_normal((64, 16)).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((4, 64)).astype(np.float32))
    ranges = set()
    for i in range(3):
        pw = optical.program(w, cfg, calibration=(i + 1.0) * rng.standard_normal(
            (32, 64)).astype(np.float32))
        ranges.add(pw.input_range)
        jax_backend.matmul(x, pw, cfg, seed=0)
        if i == 0:
            compiled = _jax_pass._chunk_jit._cache_size()
    assert len(ranges) == 3
    assert _jax_pass._chunk_jit._cache_size() == compiled


def test_a_new_mask_contrast_does_not_recompile(rng):
    """The contrast ratio reaches the jitted pass as an array, not as part of
    its key: a soak audit found each value compiling a program (1.2-1.8 s
    and ~7 MB kept per value, for good) in a contrast sweep. The outputs are
    the pass's own (each against its numpy reference)."""
    w = rng.standard_normal((64, 16)).astype(np.float32)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    for i, contrast in enumerate((50.0, 51.0, 52.5)):
        cfg = ideal(**{"core.inputs": 32, "core.outputs": 8, "mask.contrast_ratio": contrast,
                       "mask.bits": 6})
        y = np.asarray(jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0))
        reference = optical.matmul(x, w, cfg, seed=0, backend="numpy")
        np.testing.assert_allclose(y, reference, rtol=0, atol=1e-4 * np.abs(reference).max())
        if i == 0:
            compiled = _jax_pass._chunk_jit._cache_size()
    assert _jax_pass._chunk_jit._cache_size() == compiled


def test_a_sweep_over_converter_bits_compiles_the_pass_once(rng):
    """``dac.bits`` and ``adc.bits`` reach the jitted pass as arrays (their top
    codes), not as part of its key: a precision sweep compiled a program per
    value (~4 s and ~8 MB kept per value on a CPU). Each value's outputs are
    its own: against the numpy reference, a code or two of float32 rounding
    at most (a top code left over from another value would be off by a
    whole 2-bit step, a third of the window)."""
    w = rng.standard_normal((64, 16)).astype(np.float32)
    x = rng.standard_normal((6, 64)).astype(np.float32)
    for i, (dac_bits, adc_bits) in enumerate(((8, 8), (2, 2), (5, 11), (12, 3))):
        cfg = ideal(**{"core.inputs": 32, "core.outputs": 8, "dac.bits": dac_bits,
                       "adc.bits": adc_bits, "adc.full_scale": "max"})
        y, st = jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0, return_stats=True)
        reference, ref_st = optical.matmul(x, w, cfg, seed=0, backend="numpy",
                                           return_stats=True)
        y = np.asarray(y)
        scale = np.abs(reference).max()
        close = np.isclose(y, reference, rtol=0, atol=1e-4 * scale)
        assert close.mean() >= 0.95, f"{(~close).sum()} of {close.size} differ"
        # and the rest a code boundary away: two steps of 2**bits - 1 over the outputs' range
        assert np.abs(y - reference).max() <= 2 * scale / (2 ** adc_bits - 1)
        assert st.clipped_fraction == ref_st.clipped_fraction
        if i == 0:
            compiled = _jax_pass._chunk_jit._cache_size()
    assert _jax_pass._chunk_jit._cache_size() == compiled


def test_traced_narrow_weights_and_jax_arrays_to_program_are_named(rng):
    x = jnp.ones((2, 8), jnp.float32)
    for dtype in (jnp.bfloat16, jnp.float16):
        with pytest.raises(TypeError, match=f"w: dtype {jnp.dtype(dtype).name} is not "
                                            "supported; use float32"):
            jax.jit(lambda v: jax_backend.matmul(x, v, noisy(), seed=0))(
                jnp.ones((8, 4), dtype))
    with pytest.raises(TypeError, match=r"got ArrayImpl \(numpy.asarray\(w\) makes one"):
        optical.program(jnp.ones((8, 4), jnp.float32), noisy())
    pw = optical.program(np.ones((8, 4), np.float32), noisy(**{"core.inputs": 4}))
    assert repr(pw) == "ProgrammedWeights(shape=(8, 4), dtype=float32, tiles=2x1)"


def test_a_static_input_range_is_the_programmed_one_in_matmul_and_matmul_runs(rng):
    """dac.scaling = 'static': every token is encoded on the range R set when
    the weights were programmed (not its own abs-max), by matmul and by the
    batched matmul_runs alike. Ideal machine, 4-bit offset-encoded DAC: x/R
    clipped to [-1, 1], mapped to [0, 1] and rounded to 15 steps, so
    y = q(x) @ w with q(x) = (round(15 (clip(x/R) + 1) / 2) / 15 * 2 - 1) R."""
    x = rng.standard_normal((6, 40)).astype(np.float32)
    x[0] *= 5.0  # a token past R: clipped at R, not rescaled to its own range
    w = rng.standard_normal((40, 12)).astype(np.float32)
    cfg = ideal(**{"dac.bits": 4, "dac.scaling": "static", "core.inputs": 32,
                   "core.outputs": 8})
    pw = optical.program(w, cfg, calibration=3.0 * rng.standard_normal((32, 40)).astype(
        np.float32))
    r = pw.input_range
    assert 5.0 < r < 15.0  # set by the calibration inputs, not by x

    def encoded(scale):
        return (np.round((np.clip(x / scale, -1, 1) + 1) / 2 * 15) / 15 * 2 - 1) * scale

    expect = encoded(np.float64(r)) @ w.astype(np.float64)
    own = encoded(np.abs(x).max(axis=1, keepdims=True).astype(np.float64)) @ w.astype(
        np.float64)
    atol = 1e-4 * np.abs(expect).max()
    assert np.abs(own - expect).max() > 100 * atol  # the two ranges tell apart
    np.testing.assert_allclose(np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=0)),
                               expect, rtol=1e-4, atol=atol)
    ys, _, _ = jax_backend.matmul_runs(x, pw, cfg, seeds=[0, 1])
    for y in ys:
        np.testing.assert_allclose(y, expect, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("lam", [100.0, 3000.0])
def test_poisson_counts_below_the_normal_switch_have_poisson_skewness(lam):
    """Below POISSON_NORMAL_ABOVE (2**16) the counts are Poisson's, whose third
    central moment is lam (skewness 1 / sqrt(lam)); a rounded normal law has
    none. 2e6 draws: the skewness's standard error is sqrt(6 / 2e6) = 1.7e-3."""
    m = jnp.full((4, 500_000), lam, jnp.float32)
    c = np.asarray(_jax_pass._token_poisson(jax.random.PRNGKey(0), 1, 0, m), np.float64)
    d = c - lam
    assert abs(d.mean()) < 5 * math.sqrt(lam / c.size)
    skew = (d**3).mean() / lam**1.5
    assert abs(skew - 1 / math.sqrt(lam)) < 5 * math.sqrt(6 / c.size)


def test_neighbouring_seeds_draw_different_noise(rng):
    """Noise is keyed by (seed, noise, token) (jax_backend's docstring): seeds
    2 and 3 give different outputs almost everywhere."""
    x = jnp.asarray(rng.standard_normal((4, 40)).astype(np.float32))
    w = rng.standard_normal((40, 8)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    pw = optical.program(w, cfg)
    a, b = (np.asarray(jax_backend.matmul(x, pw, cfg, seed=s)) for s in (2, 3))
    assert np.mean(a != b) > 0.9


def test_zero_tokens_report_zero_photoelectrons_as_the_reference(rng):
    w = rng.standard_normal((40, 5)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32})
    pw = optical.program(w, cfg)
    x = np.zeros((0, 40), np.float32)
    _, ref = optical.matmul(x, pw, cfg, seed=0, backend="numpy", return_stats=True)
    _, got = jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=0, return_stats=True)
    assert got.mean_photoelectrons == ref.mean_photoelectrons == 0.0


def test_raw_weights_under_a_static_range_encode_every_token_on_it(rng):
    """dac.scaling = 'static' with raw weights: the range R is calibrated on x
    itself (as optical.matmul does), and every token is encoded on R, not on
    its own abs-max. Ideal machine, 4-bit offset DAC:
    y = q(x) @ w with q(x) = (round(15 (clip(x/R) + 1) / 2) / 15 * 2 - 1) R."""
    x = rng.standard_normal((6, 40)).astype(np.float32)
    x[0] *= 5.0
    w = rng.standard_normal((40, 12)).astype(np.float32)
    cfg = ideal(**{"dac.bits": 4, "dac.scaling": "static", "core.inputs": 32,
                   "core.outputs": 8})
    r = np.float64(optical.program(w, cfg, calibration=x).input_range)
    expect = ((np.round((np.clip(x / r, -1, 1) + 1) / 2 * 15) / 15 * 2 - 1) * r) \
        @ w.astype(np.float64)
    got = np.asarray(jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0))
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=1e-4 * np.abs(expect).max())


def test_raw_weights_of_another_width_are_named_before_calibrating(rng):
    """x of 40 features against raw w of 30 rows under a calibrating config:
    the mismatch is named (as on the other backends), not reached as a
    reshape of x into calibration rows of 30."""
    iris = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 8})
    x = jnp.asarray(rng.standard_normal((5, 40)).astype(np.float32))
    w = rng.standard_normal((30, 8)).astype(np.float32)
    with pytest.raises(ValueError, match="x has 40 features"):
        jax_backend.matmul(x, w, iris, seed=0)


def test_a_jax_seed_with_a_numpy_x_says_to_run_on_the_jax_backend(rng):
    """backend='auto' runs a numpy x on numba, which takes int seeds only: a
    seed traced by vmap (or a concrete JAX integer) was refused as 'got
    BatchTracer' with no word of the JAX backend, which takes it."""
    x = rng.standard_normal((3, 40)).astype(np.float32)
    w = rng.standard_normal((40, 8)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32})
    hint = r"seed: a JAX \w+ runs on the JAX backend alone, not 'numba': pass backend='jax'"
    with pytest.raises(TypeError, match=hint):
        jax.vmap(lambda s: optical.matmul(x, w, cfg, seed=s))(jnp.arange(2))
    with pytest.raises(TypeError, match=hint):
        optical.matmul(x, w, cfg, seed=jnp.int32(1))
    with pytest.raises(TypeError, match=r"got float$"):  # no JAX hint where JAX is not involved
        optical.matmul(x, w, cfg, seed=1.5)
    # Elsewhere a JAX seed is refused without the advice (no backend to pass).
    from optical import transformer

    with pytest.raises(TypeError, match=r"^seed: expected a non-negative integer, got \w+$"):
        transformer.load(pathlib.Path(__file__).parents[1] / "models" / "llama-3.2-1b",
                         seed=jnp.int32(1))
    ys = jax.vmap(lambda s: optical.matmul(x, w, cfg, seed=s, backend="jax"))(jnp.arange(2))
    np.testing.assert_array_equal(ys[1], optical.matmul(x, w, cfg, seed=1, backend="jax"))


def test_a_traced_w_with_a_numpy_x_says_to_run_on_the_jax_backend(rng):
    """jax.grad with respect to w of optical.matmul(numpy x, w): backend='auto'
    picks numba from x, and the refusal advised numpy.asarray(w), which a
    tracer cannot take; as for a JAX seed, it names backend='jax', whose
    gradient is the straight-through x^T dy."""
    x = rng.standard_normal((3, 16)).astype(np.float32)
    w = jnp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    cfg = ideal()
    with pytest.raises(TypeError, match=r"w: a traced JAX value .* not 'numba': "
                                        r"pass backend='jax'"):
        jax.grad(lambda v: jnp.sum(optical.matmul(x, v, cfg, seed=0)))(w)
    g = jax.grad(lambda v: jnp.sum(optical.matmul(x, v, cfg, seed=0, backend="jax")))(w)
    np.testing.assert_allclose(g, x.T @ np.ones((3, 8), np.float32), rtol=1e-6)


def test_matrices_whose_k_differs_within_a_tile_share_one_compiled_pass(monkeypatch, rng):
    """A cold-start audit: the jit key held K itself, and an outlier bypass
    leaves another K per calibration, so each seed and each layer of a
    Llama layer on the JAX backend compiled the whole pass again (8 compiles,
    4.9 s for a new seed). K is padded to whole tiles before the pass, which
    masks the padding: K = 254 and 251 on 128-input tiles trace it once, and
    give the bits of the pass traced for each alone (and numpy's physics)."""
    traced = []

    def fresh_pass():  # a new function: JAX keeps the traces of a function it has seen
        def counting(st, *args):
            traced.append(st.k)
            return _jax_pass._chunk(st, *args)
        return jax.jit(counting, static_argnums=0)

    monkeypatch.setattr(_jax_pass, "_chunk_jit", fresh_pass())
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 128, "core.outputs": 128,
                                                    "outliers.policy": "none"})
    x = rng.standard_normal((24, 256)).astype(np.float32)
    w = rng.standard_normal((256, 96)).astype(np.float32)
    shared = {k: np.asarray(optical.matmul(x[:, :k], w[:k], cfg, seed=2, backend="jax"))
              for k in (254, 251)}
    assert traced == [254]  # one trace, for the first K
    for k, y in shared.items():
        traced.clear()
        monkeypatch.setattr(_jax_pass, "_chunk_jit", fresh_pass())
        np.testing.assert_array_equal(
            np.asarray(optical.matmul(x[:, :k], w[:k], cfg, seed=2, backend="jax")), y)
        assert traced == [k]
        exact = x[:, :k].astype(np.float64) @ w[:k]
        assert metrics.sqnr_db(exact, y) > 20
