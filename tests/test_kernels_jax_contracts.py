"""The JAX backend's contracts that the physics tests of test_kernels_jax.py do
not reach: statistics against the numpy reference's, tile padding, token
chunks, batched runs with an outlier bypass, the straight-through gradient
with per-K-tile weight scales, and noise parameters passed as ``params``.
Tiny shapes: each test compiles a few small passes."""

import math

import numpy as np
import pytest

import optical

from .configs import ideal, noisy

jax = pytest.importorskip("jax")
jnp = jax.numpy
jax_backend = pytest.importorskip("optical.kernels.jax_backend")


def test_detected_photons_of_a_partial_tile_are_the_references(rng):
    """No RIN: the light on the detectors is sum_t a_t . (sum over rails of the
    tile's transmissions), the same on every backend. 13 columns in tiles of 8
    and 40 rows in tiles of 32: the padding (zero transmissions) holds no light,
    and every detector rail counts."""
    x = rng.standard_normal((5, 40)).astype(np.float32)
    w = rng.standard_normal((40, 13)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "source.rin_db_per_hz": -math.inf})
    pw = optical.program(w, cfg)
    _, ref = optical.matmul(x, pw, cfg, seed=0, backend="numpy", return_stats=True)
    _, got = jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=0, return_stats=True)
    assert ref.detected_photons > 0
    assert got.detected_photons == pytest.approx(ref.detected_photons, rel=1e-5)
    assert got.mean_photoelectrons == pytest.approx(ref.mean_photoelectrons, rel=1e-5)


def test_clipped_conversions_are_counted_over_every_chunk(rng):
    """A read noise of 1e30 electrons per photon clips every conversion
    (as test_a_deviation_past_float32_clips_every_conversion): in chunks of 3
    tokens too, the clipped fraction is 1, not the last chunk's share."""
    x = rng.uniform(-1, 1, (8, 16)).astype(np.float32)
    w = rng.uniform(-1, 1, (16, 8)).astype(np.float32)
    cfg = ideal(**{"core.inputs": 16, "core.outputs": 8, "detector.shot_noise": "gaussian",
                   "adc.bits": 8, "adc.full_scale": "max", "source.photons_per_mac": 1e-10,
                   "detector.read_noise_electrons": 1e30})
    _, stats = jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0, chunk_tokens=3,
                                  return_stats=True)
    assert stats.adc_conversions > 0
    assert stats.clipped_fraction == 1.0


def test_token_chunks_draw_the_same_noise(rng):
    """Every token draws from its own keys, so chunks of 2 tokens give the
    whole pass's noise (XLA's GEMMs of other shapes may round the last bits
    differently, and rarely move an ADC code); a shared draw per chunk would
    give other values almost everywhere."""
    x = jnp.asarray(rng.standard_normal((6, 40)).astype(np.float32))
    w = rng.standard_normal((40, 8)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    whole = np.asarray(jax_backend.matmul(x, w, cfg, seed=7))
    chunked = np.asarray(jax_backend.matmul(x, w, cfg, seed=7, chunk_tokens=2))
    close = np.isclose(chunked, whole, rtol=1e-4, atol=1e-4 * np.abs(whole).max())
    assert close.mean() > 0.95, f"{(~close).sum()} of {close.size} differ"


def test_a_static_bypass_counts_its_digital_macs_as_the_reference_does(rng):
    """digital_macs = tokens x outlier channels x N, as on the numpy backend."""
    x = rng.standard_normal((2, 3, 40)).astype(np.float32)  # 6 tokens
    x[..., [4, 30]] *= 50.0
    w = rng.standard_normal((40, 8)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "outliers.policy": "static",
                   "adc.full_scale": "calibrated"})
    pw = optical.program(w, cfg, calibration=x.reshape(-1, 40))
    _, ref = optical.matmul(x, pw, cfg, seed=0, backend="numpy", return_stats=True)
    y, got = jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=0, return_stats=True)
    assert y.shape == (2, 3, 8)
    channels = got.digital_channels
    assert channels == ref.digital_channels >= 1
    assert got.digital_macs == ref.digital_macs == 6 * channels * 8
    assert got.digital_mac_fraction == pytest.approx(channels / 40)


def test_batched_runs_with_a_static_bypass_are_matmuls_runs(rng):
    """matmul_runs with a static outlier bypass: each run is matmul's run of
    the same seed (digital outlier rows plus the optical rest), and its
    detected photons are matmul's."""
    x = rng.standard_normal((5, 40)).astype(np.float32)
    x[:, [3, 21]] *= 50.0
    w = rng.standard_normal((40, 8)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "outliers.policy": "static",
                   "adc.full_scale": "calibrated", "source.rin_db_per_hz": -math.inf})
    pw = optical.program(w, cfg, calibration=x)
    assert pw.bypass.channels.size >= 1
    ys, photons, _ = jax_backend.matmul_runs(x, pw, cfg, seeds=[2, 5])
    assert ys.shape == (2, 5, 8) and photons.shape == (2,)
    for i, s in enumerate((2, 5)):
        y, st = jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=s, return_stats=True)
        y = np.asarray(y)
        np.testing.assert_allclose(ys[i], y, rtol=1e-5, atol=1e-5 * np.abs(y).max())
        assert photons[i] == pytest.approx(st.detected_photons, rel=1e-5)


def test_a_one_dimensional_x_is_one_token(rng):
    """x of shape (K,) is accepted as on the numpy backend: y has shape (N,)."""
    x = rng.standard_normal(40).astype(np.float32)
    w = rng.standard_normal((40, 8)).astype(np.float32)
    cfg = ideal(**{"core.inputs": 32, "core.outputs": 8})
    y = jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0)
    assert y.shape == (8,)
    np.testing.assert_allclose(np.asarray(y), x.astype(np.float64) @ w, rtol=1e-4,
                               atol=1e-4 * np.abs(x @ w).max())


def test_programmed_weights_for_another_config_are_refused(rng):
    """As on the other backends, in matmul and matmul_runs: weights programmed
    under one mask resolution do not run under another, nor on inputs of
    another width."""
    x = rng.standard_normal((3, 40)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8})
    pw = optical.program(rng.standard_normal((40, 8)).astype(np.float32), cfg)
    other = cfg.replace({"mask.bits": cfg.mask.bits - 1})
    with pytest.raises(ValueError, match="mask.bits"):
        jax_backend.matmul(jnp.asarray(x), pw, other, seed=0)
    with pytest.raises(ValueError, match="mask.bits"):
        jax_backend.matmul_runs(x, pw, other, seeds=[0])
    # ... nor with an x of another width
    with pytest.raises(ValueError, match="x has 39 features"):
        jax_backend.matmul(jnp.asarray(x[:, :39]), pw, cfg, seed=0)


@pytest.mark.parametrize("weights", ["split", "offset"])
def test_gradient_uses_each_k_tiles_weight_scale(rng, weights):
    """Straight-through dL/dx = dL/dy W_eff^T, W_eff measured with the numpy
    reference on unit inputs (no noise or converters), with a weight scale per
    K-tile column: the two K-tiles have scales 1 and 10. Offset weights (one
    rail) decode with the mask's floor t_min subtracted, split ones cancel it."""
    x = rng.standard_normal((4, 48)).astype(np.float32)
    w = rng.standard_normal((48, 8)).astype(np.float32)
    w[32:] *= 10.0
    cfg = ideal(**{"core.inputs": 32, "core.outputs": 8, "mask.scaling": "per_tile_column",
                   "mask.bits": 4, "mask.contrast_ratio": 20.0, "encoding.weights": weights})
    pw = optical.program(w.astype(np.float64), cfg)
    w_eff = optical.matmul(np.eye(48), pw, cfg, seed=0, backend="numpy")
    gx = jax.grad(lambda v: jnp.sum(jax_backend.matmul(v, w, cfg, seed=0)))(jnp.asarray(x))
    np.testing.assert_allclose(np.asarray(gx), np.ones((4, 8)) @ w_eff.T, rtol=1e-4,
                               atol=1e-4 * np.abs(w_eff).max())


def test_params_override_the_config_in_the_stats_too(rng):
    """A config without shot noise (photons_per_mac inf) given finite photons
    in params runs as the config holding them, bit for bit, and reports that
    config's (finite) detected photons, not inf."""
    x = jnp.asarray(rng.standard_normal((16, 64)).astype(np.float32))
    w = rng.standard_normal((64, 32)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 16})
    params = {"source.photons_per_mac": 100.0}
    y, st = jax_backend.matmul(x, w, cfg.replace({"source.photons_per_mac": math.inf}), seed=0,
                               return_stats=True, params=params)
    want, st_want = jax_backend.matmul(x, w, cfg.replace(params), seed=0, return_stats=True,
                                       params=params)
    np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
    assert math.isfinite(st.detected_photons) and st.detected_photons == st_want.detected_photons
    assert st.mean_photoelectrons == st_want.mean_photoelectrons


def test_batched_runs_report_each_runs_own_photons_and_clips(rng):
    """matmul_runs over three photon counts (and seeds): run r's output,
    detected photons and clipped conversions are matmul's for that run's
    seed and params, in order (they differ from run to run here)."""
    x = rng.standard_normal((16, 64)).astype(np.float32)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 16, "adc.headroom": 0.7})
    pw = optical.program(w, cfg)
    seeds, values = [1, 2, 3], [10.0, 1e2, 1e4]
    ys, photons, clipped = jax_backend.matmul_runs(
        x, pw, cfg, seeds=seeds, params={"source.photons_per_mac": values})
    assert len(set(clipped.tolist())) > 1
    for r, (seed, value) in enumerate(zip(seeds, values, strict=True)):
        y, st = jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=seed, return_stats=True,
                                   params={"source.photons_per_mac": value})
        np.testing.assert_array_equal(ys[r], np.asarray(y))
        assert photons[r] == pytest.approx(st.detected_photons, rel=1e-5)
        assert clipped[r] == round(st.clipped_fraction * st.adc_conversions)


def test_a_static_bypass_takes_params_as_matmul_runs_does(rng):
    """With outlier channels bypassed, params still set the noise of the
    optical rest: matmul with params is matmul_runs' run of the same seed and
    params (not the config's noise levels)."""
    x = rng.standard_normal((5, 40)).astype(np.float32)
    x[:, 3] *= 50.0
    w = rng.standard_normal((40, 8)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "outliers.policy": "static",
                   "outliers.threshold": None, "outliers.top_k": 1,
                   "source.rin_db_per_hz": -math.inf})
    pw = optical.program(w, cfg, calibration=x)
    for value in (1.0, 1e6):
        params = {"source.photons_per_mac": value}
        y = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=4, params=params))
        ys, _, _ = jax_backend.matmul_runs(x, pw, cfg, seeds=[4],
                                           params={"source.photons_per_mac": [value]})
        np.testing.assert_allclose(ys[0], y, rtol=1e-5, atol=1e-5 * np.abs(y).max())


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"chunk_tokens": 0}, ValueError, "chunk_tokens"),
    ({"chunk_tokens": -1}, ValueError, "chunk_tokens"),
    ({"chunk_tokens": 2.5}, ValueError, "chunk_tokens"),
    ({"params": {"adc.headroom": True}}, TypeError,
     "params: adc.headroom = True is not a real number"),
])
def test_matmul_refuses_bad_chunks_and_params_by_name(rng, kwargs, error, match):
    x = jnp.asarray(rng.standard_normal((4, 16)).astype(np.float32))
    w = rng.standard_normal((16, 8)).astype(np.float32)
    with pytest.raises(error, match=match):
        jax_backend.matmul(x, w, noisy(**{"core.inputs": 16, "core.outputs": 8}), seed=0,
                           **kwargs)


def _as_configured(rng, base, params):
    """matmul with ``params`` passed (traced through jit) against matmul of the
    config holding those values: the same machine, the same seed. Returns
    that output and the output of ``base`` itself."""
    x = jnp.asarray(rng.standard_normal((4, 40)).astype(np.float32))
    w = rng.standard_normal((40, 13)).astype(np.float32)
    want = np.asarray(jax_backend.matmul(x, w, base.replace(params), seed=0))
    got = np.asarray(jax.jit(lambda *v: jax_backend.matmul(
        x, w, base, seed=0, params=dict(zip(params, v, strict=True))))(
        *(jnp.float32(v) for v in params.values())))
    close = np.isclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    assert close.mean() > 0.97, f"{(~close).sum()} of {close.size} differ"
    return want, np.asarray(jax_backend.matmul(x, w, base, seed=0))


def test_rin_switched_on_through_params(rng):
    """A config without RIN, given a RIN level in params, runs with that RIN
    (as the config that holds it does), not without: RIN of -110 dB/Hz over
    1 GHz is 10 % per source, far above the other noises here."""
    base = noisy(**{"core.inputs": 32, "core.outputs": 8, "source.rin_db_per_hz": -math.inf,
                    "source.photons_per_mac": 1e6, "detector.read_noise_electrons": 0.0})
    with_rin, without = _as_configured(rng, base, {"source.rin_db_per_hz": -110.0})
    assert np.abs(with_rin - without).max() > 0.05 * np.abs(without).max()


@pytest.mark.parametrize("params", [{"adc.headroom": 1.5}, {"adc.headroom": 8.0}])
def test_headroom_through_params_rederives_the_windows(rng, params):
    """adc.headroom sets the "rms" windows: varied through params, the windows
    are re-derived from it, as program() sets them for the config holding it."""
    base = noisy(**{"core.inputs": 32, "core.outputs": 8, "adc.bits": 6})
    _as_configured(rng, base, params)


def test_rederived_per_tile_windows_ignore_the_padding(rng):
    """adc.window = "per_tile" with offset weights (one rail, every readout
    >= 0) and a small headroom: the "rms" windows sit above 0, and a partial
    last tile (13 columns in tiles of 8) shares the union of its real columns'
    windows only, as program() sets them (a padded column's zero window would
    widen it down to 0)."""
    base = noisy(**{"core.inputs": 32, "core.outputs": 8, "adc.window": "per_tile",
                    "encoding.weights": "offset", "adc.headroom": 1.0, "adc.bits": 6,
                    "source.photons_per_mac": 1e4})
    params = {"source.photons_per_mac": 2e4}
    x = rng.standard_normal((4, 40)).astype(np.float32)
    w = rng.uniform(0.5, 1.0, (40, 13)).astype(np.float32)
    pw = optical.program(w, base.replace(params))
    assert pw.adc_lo[:, :, 8:].min() > 0  # the partial tile's window sits above 0
    want = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, base.replace(params), seed=0))
    got = np.asarray(jax_backend.matmul(jnp.asarray(x), w, base, seed=0, params=params))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_rin_gives_the_output_variance_of_per_source_fluctuations(rng):
    """Only RIN, sigma = 1e-2 over 1 GHz:
    each source's light is scaled by (1 + sigma e_j), so output n errs by
    sigma sum_j a_j e_j v_jn and var(y_n) = sigma^2 sum_j a_j^2 v_jn^2
    (split inputs: a = x; x[0] = 1 and w[0] = 1 make both scales 1)."""
    sigma, bandwidth = 1e-2, 1e9
    rin_db = 10 * math.log10(sigma**2 / bandwidth)
    x = rng.uniform(0, 1, 24).astype(np.float32)
    x[0] = 1
    w = rng.uniform(0, 1, (24, 5)).astype(np.float32)
    w[0] = 1
    cfg = ideal(**{"source.rin_db_per_hz": rin_db, "source.rin_bandwidth": bandwidth,
                   "encoding.inputs": "split", "core.inputs": 24, "core.outputs": 5})
    assert cfg.source.rin_sigma == pytest.approx(sigma)
    tokens = 4096  # whole 512-row chunks: one compiled program
    ys = np.asarray(jax_backend.matmul(jnp.asarray(np.tile(x, (tokens, 1))), w, cfg, seed=11),
                    dtype=np.float64)
    theory = sigma**2 * (x.astype(np.float64) ** 2) @ (w.astype(np.float64) ** 2)
    ratio = ys.var(axis=0) / theory
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(2 / tokens)), ratio
    np.testing.assert_allclose(ys.mean(axis=0), x.astype(np.float64) @ w,
                               atol=5 * math.sqrt(theory.max() / tokens))


def test_poisson_dark_counts_add_no_offset(rng):
    """Poisson dark counts on one weight rail (offset weights, where nothing
    subtracts a common offset): their mean is subtracted, so zero tokens
    (dac.scaling per tensor, a lit first token) read 0 on average, with the
    numpy reference's variance."""
    x = np.zeros((2048, 16), np.float32)  # whole 512-row chunks: one compiled program
    x[0, 0] = 1.0
    w = rng.uniform(-1, 1, (16, 4)).astype(np.float32)
    cfg = ideal(**{"core.inputs": 16, "core.outputs": 4, "dac.scaling": "per_tensor",
                   "encoding.weights": "offset", "detector.shot_noise": "poisson",
                   "source.photons_per_mac": 100.0, "detector.dark_electrons": 200.0})
    got = np.asarray(jax_backend.matmul(jnp.asarray(x), w, cfg, seed=1), np.float64)[1:]
    ref = optical.matmul(x, w, cfg, seed=1, backend="numpy").astype(np.float64)[1:]
    n = got.shape[0]
    sd = ref.std(axis=0)
    assert np.all(np.abs(got.mean(axis=0)) < 5 * sd / math.sqrt(n))
    assert np.all(np.abs(ref.mean(axis=0)) < 5 * sd / math.sqrt(n))
    assert np.all(np.abs(got.var(axis=0) / ref.var(axis=0) - 1) < 5 * math.sqrt(4 / n))


def test_a_static_input_range_clips_without_a_dac(rng):
    """dac.scaling = "static" with no DAC quantiser (dac.bits = None): a value
    past the programmed range R is still clipped at +-R, so on the ideal
    machine y = clip(x, -R, R) @ w, as on the numpy reference."""
    x = rng.standard_normal((4, 40)).astype(np.float32)
    x[0] *= 8.0
    w = rng.standard_normal((40, 8)).astype(np.float32)
    cfg = ideal(**{"dac.scaling": "static", "core.inputs": 32, "core.outputs": 8})
    assert cfg.dac.bits is None
    pw = optical.program(w, cfg, calibration=rng.standard_normal((32, 40)).astype(np.float32))
    r = np.float64(pw.input_range)
    assert np.abs(x).max() > 2 * r
    expect = np.clip(x, -r, r) @ w.astype(np.float64)
    got = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=0))
    atol = 1e-4 * np.abs(expect).max()
    np.testing.assert_allclose(got, expect, rtol=1e-4, atol=atol)
    np.testing.assert_allclose(optical.matmul(x, pw, cfg, seed=0, backend="numpy"), expect,
                               rtol=1e-4, atol=atol)


def test_split_inputs_get_the_exact_shot_variance_not_the_low_rank_one():
    """The low-rank shot variance assumes offset inputs' nearly constant
    light; split inputs light only their own sign's sources, so they take the
    exact variance. One lit channel (j = 3, level 1) on ideal contrast:
    var(y_n) = s_n^2 |v_3n| / p exactly (balanced rails: t+ + t- = |v|),
    where a rank-1 light factor of the whole tile would spread channel 3's
    light over the other rows."""
    p = 50.0
    rng = np.random.default_rng(3)
    x = np.zeros((20480, 16), dtype=np.float32)  # whole 512-row chunks: one program
    x[:, 3] = 1.0
    w = rng.uniform(-2, 2, (16, 4)).astype(np.float32)
    w[3] = [1.9, -0.1, 0.05, -1.2]  # bright and dim outputs on the lit row
    s = np.abs(w).max(axis=0).astype(np.float64)
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": "gaussian",
                   "encoding.inputs": "split", "core.inputs": 16,
                   "dac.scaling": "per_tensor"})
    theory = s**2 * np.abs(w[3] / s) / p
    y = np.asarray(optical.matmul(x, w, cfg, seed=4, backend="jax"), dtype=np.float64)
    n = y.shape[0]
    assert np.all(np.abs(y.mean(axis=0) - w[3]) < 5 * np.sqrt(theory / n))
    ratio = y.var(axis=0) / theory
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(2 / n)), ratio


@pytest.mark.parametrize("k", [24, 40])
def test_low_rank_shot_noise_of_a_partial_last_k_tile(k):
    """As the numba backend's test (test_numba_backend_contracts): offset
    inputs, split weights, balanced rails, constant light (x = 0 after one lit
    token lights every source at 1/2), so var(y) = s**2 * 2 sum_j |v_j| / p
    exactly. The light factors were taken over the zero-padded K-tile: the
    last, partial tile's shot variance came out rows / tile_k of the truth (a
    walkthrough audit: 6 dB too little noise at K = 256 on 1024-row tiles)."""
    p = 50.0
    rng = np.random.default_rng(1)
    x = np.zeros((20480, k), dtype=np.float32)  # whole 512-row chunks: one program
    x[0, 0] = 1.0
    w = rng.uniform(-2, 2, (k, 4)).astype(np.float32)
    s = np.abs(w).max(axis=0).astype(np.float64)
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": "gaussian",
                   "core.inputs": 16, "dac.scaling": "per_tensor"})
    theory = s**2 * 2 * np.abs(w / s).sum(axis=0) / p
    y = np.asarray(optical.matmul(x, w, cfg, seed=2, backend="jax"), dtype=np.float64)[1:]
    n = y.shape[0]
    assert np.all(np.abs(y.mean(axis=0)) < 5 * np.sqrt(theory / n))
    ratio = y.var(axis=0) / theory
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(2 / n)), ratio


@pytest.mark.parametrize(("changes", "exact"), [
    # exact path, Gaussian shot noise: dark counts of sd sqrt(D) electrons (not D)
    ({"detector.shot_noise": "gaussian", "source.photons_per_mac": 1e3,
      "detector.dark_electrons": 50.0}, True),
    # fast path, balanced rails: the dark variance of both photodiodes of a pair
    ({"detector.shot_noise": "gaussian", "source.photons_per_mac": 1e3,
      "detector.dark_electrons": 2000.0}, False),
    # exact (Poisson) path: read noise and the ADC's ENOB noise, as large as
    # each other, are independent draws (their variances add)
    ({"detector.shot_noise": "poisson", "source.photons_per_mac": 1e9,
      "detector.read_noise_electrons": "enob", "adc.bits": 6, "adc.enob_loss": 3.0,
      "adc.full_scale": "max"}, True),
], ids=["exact-dark", "fast-dark-balanced", "exact-read-and-enob"])
def test_noise_variances_match_the_reference_backend(changes, exact):
    """The output variance of one token repeated 4096 times equals the numpy
    reference's, for the noises the other variance tests leave out (a dark
    sd of D / p on the exact path, a fast-path dark variance of one
    photodiode, and ENOB noise drawn from the read noise's stream each passed
    the non-slow tests)."""
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((1, 32)).astype(np.float32)
    w = rng.standard_normal((32, 8)).astype(np.float32)
    cfg = ideal(**{**changes, "detector.read_noise_electrons": 0.0, "core.inputs": 32})
    if changes.get("detector.read_noise_electrons") == "enob":
        pw = optical.program(w, cfg, calibration=x1.repeat(8, 0))
        step = float(np.median((pw.adc_hi - pw.adc_lo) / 63))
        enob_sd = step * math.sqrt((4.0**3 - 1) / 12)  # the ENOB noise of 3 lost bits
        cfg = cfg.replace({"detector.read_noise_electrons": enob_sd * 1e9})
    pw = optical.program(w, cfg, calibration=x1.repeat(8, 0))
    n = 4096  # whole 512-row chunks: one compiled program
    x = np.repeat(x1, n, axis=0)
    got = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=3, exact=exact),
                     np.float64)
    ref = optical.matmul(x, pw, cfg, seed=3, backend="numpy").astype(np.float64)
    ratio = got.var(axis=0) / ref.var(axis=0)
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(4 / n)), ratio


def test_zero_width_windows_never_count_a_clip(rng):
    """An all-zero weight matrix on ideal contrast under "max" windows: every
    transmission and noise-free readout is 0, so every ADC window has zero
    width, and a zero-width window returns lo and never clips
    (optical.physics.converters.adc_quantize), whatever the read noise (here
    2.5 readout units). The numpy reference reports 0 too."""
    x = rng.standard_normal((8, 40)).astype(np.float32)
    w = np.zeros((40, 12), np.float32)
    cfg = ideal(**{"core.inputs": 32, "core.outputs": 8, "source.photons_per_mac": 40.0,
                   "detector.shot_noise": "gaussian", "detector.read_noise_electrons": 100.0,
                   "adc.bits": 6, "adc.full_scale": "max"})
    _, ref = optical.matmul(x, w, cfg, seed=0, backend="numpy", return_stats=True)
    assert ref.clipped_fraction == 0.0
    for exact in (False, True):
        y, got = jax_backend.matmul(jnp.asarray(x), w, cfg, seed=0, exact=exact,
                                    return_stats=True)
        assert got.adc_conversions > 0
        assert got.clipped_fraction == 0.0
        assert np.all(np.asarray(y) == 0)


def test_padded_columns_of_rederived_windows_are_not_counted_as_clips(rng):
    """9 columns in tiles of 8: the last tile holds 7 padded columns. Windows
    re-derived from params ("rms", headroom 1) are also computed for the
    padding, whose noise then clips about a third of the time; only the 9
    real columns' conversions count (stats.adc_conversions counts them
    alone), as for the config holding the value (windows programmed on the
    host, same seed, same draws)."""
    x = jnp.asarray(rng.standard_normal((64, 40)).astype(np.float32))
    w = rng.standard_normal((40, 9)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "adc.bits": 6, "adc.headroom": 1.0})
    params = {"adc.headroom": 1.0}
    _, want = jax_backend.matmul(x, w, cfg, seed=0, return_stats=True)
    _, got = jax_backend.matmul(x, w, cfg, seed=0, params=params, return_stats=True)
    assert want.clipped_fraction > 0.05
    assert got.clipped_fraction == pytest.approx(want.clipped_fraction, abs=0.01)


def _enob_case(photons_per_mac):
    """One token, a 32 x 8 matrix and a 6-bit ADC losing 3 bits on "max"
    windows, with Gaussian shot noise at ``photons_per_mac``: the token,
    the weights, the config and the programmed weights."""
    rng = np.random.default_rng(0)
    x1 = rng.standard_normal((1, 32)).astype(np.float32)
    w = rng.standard_normal((32, 8)).astype(np.float32)
    cfg = ideal(**{"detector.shot_noise": "gaussian", "source.photons_per_mac": photons_per_mac,
                   "adc.bits": 6, "adc.enob_loss": 3.0, "adc.full_scale": "max",
                   "core.inputs": 32})
    return x1, w, cfg, optical.program(w, cfg)


def test_fast_path_enob_noise_matches_the_reference_backend():
    """The fast path (gaussian shot noise, exact=False) draws the readout's
    noises as one normal whose variance must include the ADC's ENOB noise
    (4**enob_loss - 1) step**2 / 12: here the only noise besides a read noise
    as large, so dropping it halves the variance. Truth: the numpy
    reference's variance (one token repeated 4096 times)."""
    x1, w, cfg, pw = _enob_case(1e9)
    step = float(np.median((pw.adc_hi - pw.adc_lo) / 63))
    enob_sd = step * math.sqrt((4.0**3 - 1) / 12)
    cfg = cfg.replace({"detector.read_noise_electrons": enob_sd * 1e9})
    pw = optical.program(w, cfg)
    n = 4096  # whole 512-row chunks: one compiled program
    x = np.repeat(x1, n, axis=0)
    got = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=3), np.float64)
    ref = optical.matmul(x, pw, cfg, seed=3, backend="numpy").astype(np.float64)
    ratio = got.var(axis=0) / ref.var(axis=0)
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(4 / n)), ratio


def test_enob_noise_has_the_reference_variance_to_one_percent():
    """ENOB noise alone (6-bit ADC, 3 bits lost, "max" windows, no other
    noise of note): each readout's noise is (4**3 - 1) step**2 / 12 with step
    = window / (2**6 - 1), as on the numpy reference. 100 000 copies of one
    token, pooled over 8 outputs: the variance ratio's standard error is
    sqrt(4 / 8e5) = 0.22 %; a step of window / 2**6 gives 3.1 % less."""
    x1, w, cfg, pw = _enob_case(1e12)
    n = 100_000
    x = np.repeat(x1, n, axis=0)
    got = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=3, chunk_tokens=n),
                     np.float64)
    ref = optical.matmul(x, pw, cfg, seed=3, backend="numpy").astype(np.float64)
    ratio = float(np.mean(got.var(axis=0) / ref.var(axis=0)))
    assert abs(ratio - 1) < 5 * math.sqrt(4 / (8 * n)), ratio


def test_matmul_runs_runs_the_exact_path_when_asked(rng):
    """matmul_runs(exact=True): each run is matmul(exact=True)'s run of that
    seed, not the fast path's."""
    x = rng.standard_normal((6, 40)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 8, "detector.shot_noise": "gaussian"})
    pw = optical.program(rng.standard_normal((40, 8)).astype(np.float32), cfg)
    ys, _, _ = jax_backend.matmul_runs(x, pw, cfg, seeds=[3], exact=True)
    exact = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=3, exact=True))
    fast = np.asarray(jax_backend.matmul(jnp.asarray(x), pw, cfg, seed=3))
    assert not np.allclose(exact, fast)
    np.testing.assert_allclose(ys[0], exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())


@pytest.mark.parametrize("magnitude", [1e38, 1e-30])
def test_inputs_near_the_ends_of_float32_are_scaled_not_zeroed(rng, magnitude):
    """Each token is divided by its abs-max: past 1 / tiny (~8.5e37) the
    reciprocal XLA multiplies by is subnormal and was flushed, zeroing the
    token. The ideal preset keeps x @ w there, as at small magnitudes whose
    normalised values stay normal (1e-30; tinier ones flush, as documented)."""
    x = (rng.standard_normal((4, 16)) * magnitude).astype(np.float32)
    w = (rng.standard_normal((16, 8)) * 1e-2).astype(np.float32)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    y = np.asarray(jax_backend.matmul(jnp.asarray(x), w, ideal(), seed=0))
    assert np.abs(y - exact).max() <= 1e-5 * np.abs(exact).max()


def test_the_jax_backend_module_without_jax_names_the_extra():
    """The README names optical.kernels.jax_backend; without JAX its import
    was a bare "No module named 'jax'" (a sweep's run and --vmap said no
    more). Run in a fresh interpreter, JAX blocked."""
    import subprocess
    import sys

    code = ("import sys\nsys.modules['jax'] = None\n"
            "import optical.kernels.jax_backend\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert result.stderr.rstrip().splitlines()[-1] == (
        "ImportError: optical's JAX backend needs JAX (import of jax halted; None in "
        "sys.modules): pip install 'optical[jax]'")


def test_a_sweep_over_token_counts_compiles_the_pass_once_per_bucket(rng):
    """Each token count compiled the pass anew (~1-2 s and ~15 MB held for
    the process's life each): chunks now run padded to a few row counts,
    so 17..32 tokens share one program, and the padding moves no output
    (each token keys its own noise; its ADC conversions are not counted)."""
    from optical.kernels import _jax_pass

    x = rng.standard_normal((40, 96)).astype(np.float32)
    w = (rng.standard_normal((96, 40)) / 10).astype(np.float32)
    cfg = noisy(**{"core.inputs": 32, "core.outputs": 16, "adc.bits": 6,
                   "adc.full_scale": "rms", "adc.headroom": 1.0,  # some conversions clip
                   "source.rin_db_per_hz": -math.inf})  # photons without RIN: deterministic
    pw = optical.program(w, cfg)
    whole, stats = jax_backend.matmul(jnp.asarray(x[:32]), pw, cfg, seed=3, return_stats=True)
    compiled = _jax_pass._chunk_jit._cache_size()
    runs = {t: jax_backend.matmul(jnp.asarray(x[:t]), pw, cfg, seed=3, return_stats=True)
            for t in (17, 18, 31)}
    assert _jax_pass._chunk_jit._cache_size() == compiled
    for tokens, (y, got) in runs.items():
        np.testing.assert_allclose(np.asarray(y), np.asarray(whole)[:tokens], rtol=1e-4,
                                   atol=1e-4 * float(np.abs(whole).max()))
        _, ref = optical.matmul(x[:tokens], pw, cfg, seed=3, backend="numpy",
                                return_stats=True)
        assert got.detected_photons == pytest.approx(ref.detected_photons, rel=1e-5)
        # Unpadded (a chunk of exactly the tokens): the same conversions clip.
        _, whole_chunk = jax_backend.matmul(jnp.asarray(x[:tokens]), pw, cfg, seed=3,
                                            return_stats=True, chunk_tokens=tokens)
        assert got.clipped_fraction == whole_chunk.clipped_fraction > 0
    assert [_jax_pass.chunk_rows(r, 1024) for r in (1, 16, 17, 33, 256, 257, 600)] == \
        [16, 16, 32, 64, 256, 288, 608]
    assert _jax_pass.chunk_rows(600, 300) == 600 and _jax_pass.chunk_rows(3, 3) == 3


@pytest.mark.parametrize("cfg", [ideal(**{"core.inputs": 32, "core.outputs": 16}),
                                 noisy(**{"core.inputs": 32, "core.outputs": 16})],
                         ids=["ideal", "noisy"])
def test_vmap_over_w_with_a_concrete_x(rng, cfg):
    """vmap over weight matrices, x concrete (numpy): each lane is the
    unbatched call on its own w, and x @ w in the ideal limit (a review
    found the eager chunk path taking the traced weights for concrete)."""
    import jax

    x = rng.standard_normal((5, 48)).astype(np.float32)
    w = (rng.standard_normal((48, 20)) / 10).astype(np.float32)
    ws = jnp.stack([w, -2 * w])
    lanes = np.asarray(jax.vmap(lambda v: jax_backend.matmul(x, v, cfg, seed=1))(ws))
    for lane, v in zip(lanes, ws, strict=True):
        one = np.asarray(jax_backend.matmul(x, v, cfg, seed=1))
        np.testing.assert_allclose(lane, one, rtol=1e-5, atol=1e-5 * np.abs(one).max())
        if cfg.source.photons_per_mac == float("inf"):
            exact = x.astype(np.float64) @ np.asarray(v, np.float64)
            np.testing.assert_allclose(lane, exact, rtol=0, atol=1e-5 * np.abs(exact).max())


def test_a_committed_x_keeps_its_device():
    """An x placed on a device runs and returns there (the eager chunk path
    goes through numpy). Two CPU devices, in a fresh interpreter."""
    import os
    import subprocess
    import sys

    code = ("import jax, jax.numpy as jnp, numpy as np, optical\n"
            "from optical.kernels import jax_backend\n"
            "cfg = optical.presets.get('ideal').replace({'core.inputs': 16, 'core.outputs': 8})\n"
            "x = jax.device_put(jnp.ones((3, 16), jnp.float32), jax.devices()[1])\n"
            "y = jax_backend.matmul(x, np.ones((16, 8), np.float32), cfg, seed=0)\n"
            "assert y.devices() == {jax.devices()[1]} and y.committed, y.devices()\n"
            "assert np.allclose(np.asarray(y), 16.0)\n")
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
           + " --xla_force_host_platform_device_count=2"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-800:]


def test_the_device_copy_of_programmed_weights_is_built_a_k_tile_at_a_time(rng):
    """The first JAX call on programmed weights built whole-matrix float64
    temporaries: a host peak of 17x the weights' bytes (3.8 GB for the 8B
    gate_proj), where one K-tile at a time needs ~5.6x (its float32 outputs
    alone are ~2.5x). The arrays are those of the same calls made whole
    (checked bit for bit over 864 configs when this changed)."""
    import tracemalloc

    from optical.kernels import _jax_pass

    cfg = noisy(**{"core.inputs": 128, "core.outputs": 128})  # 4 x 4 tiles
    w = (rng.standard_normal((512, 512)) / 20).astype(np.float32)
    pw = optical.program(w, cfg)
    st = _jax_pass.static_of(pw.shape, cfg, False, frozenset(), np.float32)
    tracemalloc.start()
    try:
        arrays = _jax_pass._host_arrays(pw, st)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 8 * w.nbytes, f"peak {peak / w.nbytes:.1f} x the weights' bytes"
    # w_eff is the machine's noise-free map: the ideal limit's weights here.
    np.testing.assert_allclose(arrays["w_eff"], w, rtol=0, atol=0.02 * np.abs(w).max())


def test_a_list_or_torch_w_is_refused_as_numpy_and_numba_refuse_it():
    """The JAX backend converted any w with numpy.asarray: a list of floats
    ran (or failed on "x is float32 but w is float64"), a torch tensor ran,
    where the other backends refuse both."""
    x = np.ones((2, 4), np.float32)
    w = np.ones((4, 3), np.float32)
    cfg = optical.presets.get("ideal")
    for backend in ("jax", "numpy"):
        with pytest.raises(TypeError, match="w: expected a .*got list"):
            optical.matmul(x, w.tolist(), cfg, seed=0, backend=backend)
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="w: expected a JAX or numpy array, got Tensor"):
        optical.matmul(x, torch.from_numpy(w), cfg, seed=0, backend="jax")


def test_an_empty_input_detects_no_photons_on_every_backend():
    """No token, no light: numpy said 0 detected photons where numba and JAX
    said inf on a noise-free (infinite photon) config."""
    w = np.ones((8, 3), np.float32)
    cfg = optical.presets.get("ideal")
    pw = optical.program(w, cfg)
    x = np.ones((0, 8), np.float32)
    for backend in ("numpy", "numba", "jax"):
        _, stats = optical.matmul(x, pw, cfg, seed=0, backend=backend, return_stats=True)
        assert stats.detected_photons == 0.0, backend
        _, stats = optical.matmul(np.ones((1, 8), np.float32), pw, cfg, seed=0,
                                  backend=backend, return_stats=True)
        assert stats.detected_photons == math.inf, backend


#: The programs test_the_suites_xla_level_computes_the_bits_of_xla_s_default
#: compiles in each process: the JAX pass's Gaussian, Poisson and exact
#: paths over two K-tiles, the straight-through gradient, and the numba
#: backend's GEMMs in XLA. (When the level was chosen, every preset's pass,
#: and float64's, were checked too, at a larger shape: the same bits.)
_BITS = """
import sys
import jax, jax.numpy as jnp, numpy as np, optical
from optical.kernels import jax_backend
rng = np.random.default_rng(0)
x = rng.standard_normal((33, 128)).astype(np.float32)
w = (rng.standard_normal((128, 30)) / 10).astype(np.float32)
small = {"core.inputs": 64, "core.outputs": 32, "source.photons_per_mac": 40.0,
         "source.rin_db_per_hz": -120.0, "detector.read_noise_electrons": 30.0,
         "adc.full_scale": "rms", "outliers.policy": "none"}
noisy = optical.presets.get("iris-like").replace(small)
poisson = noisy.replace({"detector.shot_noise": "poisson"})
out = {
    "gaussian": jax_backend.matmul(x, w, noisy, seed=1),
    "poisson": jax_backend.matmul(x, w, poisson, seed=2),
    "exact": jax_backend.matmul(x, w, noisy, seed=3, exact=True),
    "grad": jax.grad(lambda v: jnp.sum(jax_backend.matmul(v, w, noisy, seed=5) ** 2))(
        jnp.asarray(x)),
    "numba": optical.matmul(x, w, optical.presets.get("iris-like"), seed=6, backend="numba"),
}
np.savez(sys.argv[1], **{k: np.asarray(v) for k, v in out.items()})
"""


@pytest.mark.slow
def test_the_suites_xla_level_computes_the_bits_of_xla_s_default(tmp_path):
    """tests/conftest.py has XLA compile the suite's programs at a lower LLVM
    optimisation level than XLA's default (the compiling is most of the JAX
    tests' time); the programs a user runs are compiled at the default. The
    outputs of both, to the bit: were a level to change them (level 0 does,
    in the last bit of 40-90% of them), the suite would no longer test what
    users run, and this test fails naming the output that moved."""
    import os
    import re
    import subprocess
    import sys

    from .conftest import XLA_TEST_LEVEL

    suite = os.environ.get("XLA_FLAGS", "")
    default = re.sub(r"--xla_backend_optimization_level=\S*", "", suite).strip()
    outputs = {}
    for name, flags in (("suite", suite), ("default", default)):
        path = tmp_path / f"{name}.npz"
        done = subprocess.run([sys.executable, "-c", _BITS, str(path)], capture_output=True,
                              text=True, env={**os.environ, "XLA_FLAGS": flags}, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr[-800:]
        with np.load(path) as arrays:
            outputs[name] = dict(arrays)
    for key in outputs["default"]:
        same = outputs["suite"][key] == outputs["default"][key]
        assert same.all(), (f"{key}: {1 - same.mean():.0%} of the outputs differ between "
                            f"XLA_FLAGS={suite!r} and XLA's default level: the suite "
                            f"would not test the programs users run at that level "
                            f"(tests/conftest.py sets {XLA_TEST_LEVEL})")
