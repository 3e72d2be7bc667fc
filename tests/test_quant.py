"""Hardware-aware mapping: weight scales per tile, static input ranges,
calibrated ADC windows, programmed matrices. Truth: exact matmul in the
ideal limit, the plain loop re-derivation, hand-computed scales and
percentiles, the analytic optimum of a Gaussian's clipping, brute force."""

import copy
import dataclasses
import math
import pickle

import numpy as np
import pytest
from scipy import integrate, optimize, stats

import optical
from optical import calibration, metrics
from optical.calibration import mse_windows
from optical.physics import converters

from .configs import ideal
from .conftest import EXACT_RTOL
from .reference_loops import reference_matmul

SCALINGS = ["per_tensor", "per_column", "per_tile", "per_tile_column"]


# --------------------------------------------------------------------------- #
# Weight scales
# --------------------------------------------------------------------------- #


def test_weight_scales_by_hand():
    w = np.array([[1.0, -2.0, 0.5], [4.0, 1.0, -8.0], [0.5, 3.0, 1.0]])
    cfg = ideal(**{"core.inputs": 2, "core.outputs": 2})
    # K-tiles: rows {0, 1} and {2}; N-tiles: columns {0, 1} and {2}.
    expect = {
        "per_tensor": [[8, 8, 8], [8, 8, 8]],
        "per_column": [[4, 3, 8], [4, 3, 8]],
        "per_tile_column": [[4, 2, 8], [0.5, 3, 1]],
        "per_tile": [[4, 4, 8], [3, 3, 1]],
    }
    for policy, scale in expect.items():
        pw = optical.program(w, cfg.replace({"mask.scaling": policy}))
        np.testing.assert_array_equal(pw.scale, scale, err_msg=policy)
        # The normalised weights reproduce w tile by tile and reach 1 somewhere.
        np.testing.assert_allclose(pw.weights * np.repeat(pw.scale, [2, 1], axis=0), w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scaling", SCALINGS)
@pytest.mark.parametrize(("inputs", "weights"), [("offset", "split"), ("split", "offset")])
def test_every_weight_scaling_is_exact_in_the_ideal_limit(rng, dtype, scaling, inputs, weights):
    x = rng.standard_normal((9, 200)).astype(dtype)
    w = rng.standard_normal((200, 90)).astype(dtype)
    w[130:] *= 20  # K-tiles of very different magnitude
    cfg = ideal(**{"mask.scaling": scaling, "core.inputs": 70, "core.outputs": 40,
                   "encoding.inputs": inputs, "encoding.weights": weights})
    y = optical.matmul(x, w, cfg, seed=0)
    assert y.dtype == dtype
    assert metrics.relative_error(x.astype(np.float64) @ w, y) < EXACT_RTOL[dtype]


@pytest.mark.parametrize("scaling", ["per_tile", "per_tile_column"])
@pytest.mark.parametrize("window", ["per_column", "per_tile"])
@pytest.mark.parametrize("full_scale", ["max", "rms"])
@pytest.mark.parametrize("backend", ["numpy", "numba"])  # numba: a core below its auto size
def test_tile_scales_and_shared_windows_match_independent_loops(rng, scaling, window, full_scale,
                                                                backend):
    x = rng.standard_normal((6, 70))
    w = rng.standard_normal((70, 23))
    w[40:] *= 5
    cfg = ideal(**{"mask.scaling": scaling, "adc.window": window, "adc.full_scale": full_scale,
                   "dac.bits": 5, "mask.bits": 4, "adc.bits": 6, "mask.contrast_ratio": 20.0,
                   "adc.headroom": 2.0, "core.inputs": 32, "core.outputs": 10})
    y = optical.matmul(x, w, cfg, seed=0, backend=backend)
    truth = reference_matmul(x, w, cfg)
    close = np.isclose(y, truth, rtol=1e-9, atol=1e-9 * np.abs(truth).max())
    assert close.mean() >= 0.99, f"{(~close).sum()} of {close.size} differ"


def test_finer_weight_scales_help_when_k_tiles_differ_in_magnitude(rng):
    x = rng.standard_normal((64, 256))
    w = rng.standard_normal((256, 64))
    w[:128] *= 0.05  # the first K-tile's weights are small
    exact = x @ w
    cfg = ideal(**{"mask.bits": 4, "core.inputs": 128})
    sqnr = {s: metrics.sqnr_db(exact, optical.matmul(x, w, cfg.replace({"mask.scaling": s}),
                                                     seed=0)) for s in SCALINGS}
    assert sqnr["per_tile_column"] > sqnr["per_column"] > sqnr["per_tensor"]
    assert sqnr["per_tile"] > sqnr["per_tensor"]


# --------------------------------------------------------------------------- #
# Static input range
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("percentile", [50.0, 99.0, 100.0])
def test_static_input_range_is_the_calibration_percentile_and_clips(rng, percentile):
    cal = rng.standard_normal((300, 40)) * 2
    x = rng.standard_normal((20, 40)) * 2
    w = rng.standard_normal((40, 7))
    cfg = ideal(**{"dac.scaling": "static", "dac.percentile": percentile})
    pw = optical.program(w, cfg, calibration=cal)
    r = np.percentile(np.abs(cal), percentile)
    assert pw.input_range == pytest.approx(r, rel=1e-12)
    # Ideal converters: the only error is the clipping of inputs beyond r.
    y = optical.matmul(x, pw, cfg, seed=0)
    np.testing.assert_allclose(y, np.clip(x, -r, r) @ w, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- #
# Calibrated ADC windows
# --------------------------------------------------------------------------- #


def _gaussian_window_mse(a, bits):
    """E(clip error) + step^2 / 12 of the window [-a, a] for N(0, 1) readouts."""
    clip = 2 * integrate.quad(lambda z: (z - a) ** 2 * stats.norm.pdf(z), a, np.inf)[0]
    return clip + (2 * a / (2**bits - 1)) ** 2 / 12


def _gaussian_optimal_half_width(bits):
    """Half-width a of [-a, a] minimising :func:`_gaussian_window_mse`."""
    return optimize.minimize_scalar(lambda a: _gaussian_window_mse(a, bits), bounds=(0.5, 8),
                                    method="bounded").x


@pytest.mark.parametrize("bits", [3, 4, 6])
def test_mse_window_of_gaussian_readouts_matches_the_analytic_optimum(rng, bits):
    samples = rng.standard_normal((200_000, 1)) * 3.0 + 10.0
    lo, hi = calibration.mse_windows(samples, np.zeros(1), bits)
    a = _gaussian_optimal_half_width(bits)
    assert (hi[0] - 10.0) / 3.0 == pytest.approx(a, rel=0.03)
    assert (10.0 - lo[0]) / 3.0 == pytest.approx(a, rel=0.03)


@pytest.mark.parametrize("bits", [4, 6])
@pytest.mark.parametrize("noise", [0.5, 1.0])
def test_mse_window_of_gaussian_readouts_with_gaussian_noise_is_their_sums(rng, bits, noise):
    """N(0, 1) readouts plus N(0, noise^2) readout noise are N(0, 1 + noise^2):
    the window is that Gaussian's optimum. The noise is 5-11 % of the
    readouts' range, above NEGLIGIBLE_NOISE (2 %), so it must be counted."""
    samples = rng.standard_normal((100_000, 1))
    lo, hi = calibration.mse_windows(samples, np.array([noise]), bits)
    a = np.sqrt(1 + noise**2) * _gaussian_optimal_half_width(bits)
    assert hi[0] == pytest.approx(a, rel=0.03) and -lo[0] == pytest.approx(a, rel=0.03)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, pytest.param(7, marks=pytest.mark.xfail(
    strict=True, reason="the nine-point Hermite rule's window is 11% narrow at 7 bits "
    "(1.1 dB of conversion MSE; calibration._HERMITE_NODES)")), 8, 9, 10])
def test_mse_window_of_pure_noise_matches_the_analytic_optimum(bits):
    """Noise-free readouts all equal: the window comes from the noise alone,
    within 6% of the optimal half-width and 0.1 dB of the optimal MSE."""
    lo, hi = calibration.mse_windows(np.full((50, 2), 5.0), np.array([0.5, 2.0]), bits)
    a = _gaussian_optimal_half_width(bits)
    np.testing.assert_allclose((hi - 5.0) / [0.5, 2.0], a, rtol=0.06)
    np.testing.assert_allclose((5.0 - lo) / [0.5, 2.0], a, rtol=0.06)
    ours = _gaussian_window_mse((hi[0] - lo[0]) / 2 / 0.5, bits)
    assert 10 * np.log10(ours / _gaussian_window_mse(a, bits)) < 0.1


@pytest.mark.parametrize("bits", [11, 12, 16, 24])
def test_mse_window_of_pure_noise_above_10_bits_levels_off_far_below_the_noise(bits):
    """Past 10 bits the nine-point rule's window stops at its outermost node
    (4.5 sigma) as the optimum widens: the conversion MSE levels off at
    ~5e-7 of the noise's variance, 2.1e-6 at 11 bits (calibration's comment on the rule)."""
    lo, hi = calibration.mse_windows(np.full((50, 1), 5.0), np.array([2.0]), bits)
    half = (hi[0] - lo[0]) / 2 / 2.0
    assert half == pytest.approx(np.max(calibration._HERMITE_NODES), rel=0.01)
    assert _gaussian_window_mse(half, bits) < 2.5e-6  # 2.1e-6 at 11 bits, 5.1e-7 at 16
    assert _gaussian_window_mse(half, bits) >= _gaussian_window_mse(
        _gaussian_optimal_half_width(bits), bits)


def test_enob_loss_widens_the_window(rng):
    samples = rng.standard_normal((20_000, 1))
    _, hi8 = calibration.mse_windows(samples, np.zeros(1), 8)
    _, hi6 = calibration.mse_windows(samples, np.zeros(1), 6)
    _, lossy = calibration.mse_windows(samples, np.zeros(1), 8, enob_loss=2.0)
    assert lossy[0] == pytest.approx(hi6[0], rel=0.02)  # an 8-bit ADC with ENOB 6 acts as 6 bits
    assert hi6[0] < hi8[0]


@pytest.mark.parametrize("bits", [3, 5])
def test_mse_window_on_its_own_samples_is_near_the_brute_force_best(rng, bits):
    """Skewed, heavy-tailed readouts, no smoothing: the chosen window's real
    quantisation error on the samples is within 10% of the best window on a
    fine grid."""
    samples = np.column_stack([rng.gamma(2.0, 1.0, 3000), rng.standard_t(3, 3000)])
    lo, hi = calibration.mse_windows(samples, np.zeros(2), bits, tails=False)
    for col in range(2):
        s = samples[:, col]
        grid = np.quantile(s, np.linspace(0, 1, 81))
        best = min(np.mean((converters.adc_quantize(s, a, b, bits)[0] - s) ** 2)
                   for a in grid for b in grid if b > a)
        ours = np.mean((converters.adc_quantize(s, lo[col], hi[col], bits)[0] - s) ** 2)
        assert ours <= 1.10 * best, (col, ours, best)


@pytest.mark.parametrize("bits", [6, 8])
def test_window_with_fitted_tails_holds_new_readouts(bits):
    """A window chosen from 512 samples must hold new readouts' tails. Over
    50 draws each of Gaussian and of gamma samples, its error on 20 000
    fresh samples against the best window for those (an oracle on a grid):
    median within 2 dB, 90 % of draws within 4 dB (measured at 8 bits: 1.4
    and 2.8 dB; the worst draw 10 dB, a window the noisy tail fit made
    narrow; at 6 bits 0.4, 1.4 and 5 dB). The window fitted to the samples
    alone, ending near the largest sample, loses a median 10 dB at 8 bits.
    (Four draws, as this test had, passed a bound of 3x that 14 of 400
    draws break: a quality claim needs the distribution.)"""
    ratios, raw = [], []
    for seed in range(50):
        rng = np.random.default_rng(seed)
        for sample in (rng.standard_normal, lambda n, rng=rng: rng.gamma(3.0, 1.0, n)):
            fit, fresh = sample(512)[:, None], sample(20_000)

            def error(a, b, fresh=fresh):
                return np.mean((converters.adc_quantize(fresh, a, b, bits)[0] - fresh) ** 2)

            tail = np.geomspace(1e-5, 0.05, 12)
            best = min(error(a, b) for a in np.quantile(fresh, tail)
                       for b in np.quantile(fresh, 1 - tail))
            lo, hi = calibration.mse_windows(fit, np.zeros(1), bits)
            raw_lo, raw_hi = calibration.mse_windows(fit, np.zeros(1), bits, tails=False)
            ratios.append(error(lo[0], hi[0]) / best)
            raw.append(error(raw_lo[0], raw_hi[0]) / best)
    loss_db = 10 * np.log10(ratios)
    assert np.median(loss_db) < 2.0 and np.quantile(loss_db, 0.9) < 4.0, loss_db
    if bits == 8:
        assert np.median(10 * np.log10(raw)) > 6.0


def test_shared_window_is_the_window_of_the_pooled_readouts(rng):
    samples = rng.standard_normal((500, 6)) * np.array([1, 2, 3, 1, 1, 1]) + np.arange(6)
    groups = np.array([0, 0, 0, 1, 1, 1])
    lo, hi = calibration.mse_windows(samples, np.zeros(6), 5, groups=groups, tails=False)
    for g in range(2):
        pooled = samples[:, groups == g].reshape(-1, 1)
        plo, phi = calibration.mse_windows(pooled, np.zeros(1), 5, tails=False)
        assert lo[g] == pytest.approx(plo[0], abs=1e-9)
        assert hi[g] == pytest.approx(phi[0], abs=1e-9)


def _adc_only(**changes):
    """Exact DAC and mask, a 5-bit ADC: the ADC window is the only error."""
    return ideal(**{"adc.bits": 5, "core.inputs": 64, "core.outputs": 16, **changes})


@pytest.mark.parametrize(("inputs", "weights", "balanced"),
                         [("offset", "split", True), ("split", "split", False),
                          ("offset", "offset", False)])
def test_calibrated_windows_are_near_the_best_rescaling_on_new_inputs(rng, inputs, weights,
                                                                      balanced):
    """End to end, calibrated on one batch and evaluated on another: no
    rescaling of every window about its centre gains more than 0.5 dB, and
    the calibrated windows beat the uniform-input "rms" ones."""
    cal = rng.standard_normal((512, 128))
    x = rng.standard_normal((400, 128))
    w = rng.standard_normal((128, 40))
    cfg = _adc_only(**{"adc.full_scale": "calibrated", "encoding.inputs": inputs,
                       "encoding.weights": weights, "detector.balanced": balanced})
    pw = optical.program(w, cfg, calibration=cal)
    exact = x @ w

    def sqnr(factor):
        centre, half = (pw.adc_hi + pw.adc_lo) / 2, (pw.adc_hi - pw.adc_lo) / 2
        scaled = dataclasses.replace(pw, adc_lo=centre - factor * half,
                                     adc_hi=centre + factor * half)
        return metrics.sqnr_db(exact, optical.matmul(x, scaled, cfg, seed=0))

    ours = sqnr(1.0)
    for factor in (0.7, 0.85, 1.2, 1.5):
        assert ours > sqnr(factor) - 0.5, factor
    rms = optical.matmul(x, w, cfg.replace({"adc.full_scale": "rms"}), seed=0)
    assert ours > metrics.sqnr_db(exact, rms) + 1.0


def test_calibrated_windows_account_for_noise(rng):
    """At a few photons per MAC the windows widen to hold the noise."""
    x = rng.standard_normal((200, 128))
    w = rng.standard_normal((128, 16))
    quiet = _adc_only(**{"adc.full_scale": "calibrated"})
    loud = quiet.replace({"source.photons_per_mac": 0.5})
    width = {c: optical.program(w, c, calibration=x) for c in (quiet, loud)}
    ratio = ((width[loud].adc_hi - width[loud].adc_lo)
             / (width[quiet].adc_hi - width[quiet].adc_lo))
    assert np.all(ratio > 1.2)


def test_calibration_is_deterministic_and_capped(rng):
    x = rng.standard_normal((3000, 64)).astype(np.float32)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    cfg = _adc_only(**{"adc.full_scale": "calibrated", "calibration.max_tokens": 500,
                       "source.photons_per_mac": 100.0})
    a = optical.program(w, cfg, calibration=x)
    b = optical.program(w, cfg, calibration=x.copy())
    np.testing.assert_array_equal(a.adc_lo, b.adc_lo)
    np.testing.assert_array_equal(a.adc_hi, b.adc_hi)
    assert a.adc_lo.dtype == np.float32
    # The cap picks evenly spaced rows: the same windows as those rows alone.
    rows = np.linspace(0, 2999, 500).round().astype(int)
    c = optical.program(w, cfg, calibration=x[rows])
    np.testing.assert_array_equal(a.adc_hi, c.adc_hi)


# --------------------------------------------------------------------------- #
# Programmed matrices
# --------------------------------------------------------------------------- #


def _noisy(**changes):
    """iris-like's physics, small, with the naive mapping (nothing calibrated)."""
    return optical.presets.get("iris-like").replace({
        "core.inputs": 64, "core.outputs": 32, "source.photons_per_mac": 40.0,
        "source.rin_db_per_hz": -120.0, "adc.bits": 6, "dac.bits": 6,
        "adc.full_scale": "rms", "outliers.policy": "none", "mask.compensate": False, **changes})


@pytest.mark.parametrize("changes", [
    {"mask.scaling": "per_tile"},
    {"mask.scaling": "per_tile_column", "adc.window": "per_tile"},
    {"adc.full_scale": "max", "adc.window": "per_tile"},
    {"outliers.policy": "dynamic", "outliers.top_k": 3},
])
def test_programmed_matrix_gives_the_same_output_as_programming_every_call(rng, changes):
    x = rng.standard_normal((20, 100))
    x[:, 7] *= 50
    w = rng.standard_normal((100, 40))
    cfg = _noisy(**changes)
    programmed = optical.program(w, cfg)
    np.testing.assert_array_equal(optical.matmul(x, programmed, cfg, seed=3),
                                  optical.matmul(x, w, cfg, seed=3))


def test_programmed_matrix_refuses_configs_it_was_not_programmed_for(rng):
    x = rng.standard_normal((5, 100))
    w = rng.standard_normal((100, 40))
    cfg = _noisy(**{"adc.full_scale": "calibrated"})
    pw = optical.program(w, cfg, calibration=x)
    optical.matmul(x, pw, cfg.replace({"energy.cores": 4}), seed=0)  # prices, not arithmetic
    for changes, path in [
        # Calibrated windows were set for 6-bit, per-token scaled inputs.
        ({"dac.bits": 4}, "dac.bits = 6 when programmed, 4 now"),
        ({"core.outputs": 16}, "core.outputs = 32 when programmed, 16 now"),
        ({"mask.bits": 4}, "mask.bits"),
        ({"mask.scaling": "per_tile"}, "mask.scaling"),
        ({"mask.compensate": True}, "mask.compensate"),
        ({"adc.window": "per_tile"}, "adc.window"),
        ({"adc.full_scale": "rms"}, "adc.full_scale"),
        ({"dac.scaling": "per_tensor"}, "dac.scaling"),
        ({"outliers.policy": "dynamic"}, "outliers.policy"),
        ({"calibration.max_tokens": 7}, "calibration.max_tokens"),
    ]:
        with pytest.raises(ValueError, match=path):
            optical.matmul(x, pw, cfg.replace(changes), seed=0)
    # Without calibrated windows or a static range, the DAC settings are free.
    plain = optical.program(w, _noisy())
    optical.matmul(x, plain, _noisy(**{"dac.scaling": "per_tensor", "dac.percentile": 50.0,
                                       "dac.bits": 4}), seed=0)
    with pytest.raises(ValueError, match="dac.scaling"):
        optical.matmul(x, plain, _noisy(**{"dac.scaling": "static"}), seed=0)
    static = optical.program(w, _noisy(**{"dac.scaling": "static"}), calibration=x)
    with pytest.raises(ValueError, match="dac.percentile"):
        optical.matmul(x, static, _noisy(**{"dac.scaling": "static", "dac.percentile": 50.0}),
                       seed=0)


# --------------------------------------------------------------------------- #
# Bad calibration input
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(("cal", "error", "match"), [
    (np.ones((10, 5)), ValueError, "calibration: has 5 features .* but w has 6 rows"),
    (np.ones((0, 6)), ValueError, r"calibration: shape \(0, 6\) holds no tokens"),
    (np.array([[np.nan] + [1.0] * 5]), ValueError, "calibration: contains 1 NaN"),
    (np.ones((3, 6), dtype=np.int32), TypeError, "calibration: dtype int32"),
    ([[1.0] * 6], TypeError, "calibration: expected a numpy.ndarray"),
    (np.array(1.0), ValueError, "calibration: expected at least 1 dimension"),
    (np.zeros((4, 6)), ValueError, "calibration: all 24 entries are zero"),
])
def test_bad_calibration_inputs_are_refused_clearly(cal, error, match):
    cfg = ideal(**{"adc.full_scale": "calibrated", "adc.bits": 6})
    with pytest.raises(error, match=match):
        optical.program(np.ones((6, 3)), cfg, calibration=cal)


@pytest.mark.parametrize(("changes", "match"), [
    ({"adc.full_scale": "calibrated"}, "adc.full_scale = 'calibrated' needs calibration"),
    ({"dac.scaling": "static"}, "dac.scaling = 'static' needs calibration"),
    ({"outliers.policy": "static"}, "outliers.policy = 'static' needs calibration"),
])
def test_missing_calibration_names_the_setting_that_needs_it(rng, changes, match):
    w = rng.standard_normal((6, 3))
    cfg = ideal(**{"adc.bits": 6, **changes})
    assert optical.quant.calibration_needs(cfg) == [match.split(" needs")[0]]
    assert optical.quant.calibration_needs(ideal()) == []
    with pytest.raises(ValueError, match=match):
        optical.program(w, cfg)
    # Raw weights given to matmul are calibrated on the call's own inputs.
    x = rng.standard_normal((40, 6))
    np.testing.assert_array_equal(optical.matmul(x, w, cfg, seed=0),
                                  optical.matmul(x, optical.program(w, cfg, calibration=x), cfg,
                                                 seed=0))


def test_calibration_with_three_dimensions_is_flattened(rng):
    cal = rng.standard_normal((2, 50, 12))
    cfg = ideal(**{"dac.scaling": "static", "dac.percentile": 90.0})
    pw = optical.program(rng.standard_normal((12, 3)), cfg, calibration=cal)
    assert pw.input_range == pytest.approx(np.percentile(np.abs(cal), 90.0))


def test_all_zero_calibration_rows_are_left_out(rng):
    """A calibration audit: padding rows in a calibration set narrowed the
    static range's percentile and pulled calibrated windows toward zero
    (1024 zero rows beside 128 real: 31.2 -> 28.6 dB). Programmed with zero
    rows interleaved, the weights are those of the real rows alone: the same
    range, outlier channels and windows; an exactly zero entry of a real row
    still counts (the range's percentile is taken over it)."""
    w = (rng.standard_normal((48, 24)) / 7 + 0.05).astype(np.float32)
    real = rng.standard_normal((40, 48)).astype(np.float32)
    real[:, 5] *= 20
    real[3, :10] = 0
    padded = np.zeros((130, 48), np.float32)
    padded[::3][:40] = real
    cfg = optical.presets.get("iris-like").replace({
        "dac.scaling": "static", "dac.percentile": 60.0, "core.inputs": 32,
        "core.outputs": 16})
    alone, with_zeros = (optical.program(w, cfg, calibration=c) for c in (real, padded))
    assert alone.input_range == with_zeros.input_range == pytest.approx(
        np.percentile(np.abs(np.delete(real, alone.bypass.channels, axis=1)), 60.0),
        rel=1e-6)
    assert list(alone.bypass.channels) == [5]
    np.testing.assert_array_equal(alone.bypass.channels,
                                  with_zeros.bypass.channels)
    np.testing.assert_array_equal(alone.adc_lo, with_zeros.adc_lo)
    np.testing.assert_array_equal(alone.adc_hi, with_zeros.adc_hi)


def test_config_validates_new_fields():
    base = ideal()
    with pytest.raises(ValueError, match="mask.scaling: 'per_row' is not valid"):
        base.replace({"mask.scaling": "per_row"})
    with pytest.raises(ValueError, match=r"dac.percentile: 0.0 is out of range"):
        base.replace({"dac.percentile": 0.0})
    with pytest.raises(ValueError, match=r"dac.percentile: 100.5 is out of range"):
        base.replace({"dac.percentile": 100.5})
    with pytest.raises(ValueError, match="adc.window"):
        base.replace({"adc.window": "global"})
    with pytest.raises(ValueError, match="calibration.max_tokens"):
        base.replace({"calibration.max_tokens": 0})
    assert math.isclose(base.dac.percentile, 99.99)


# --------------------------------------------------------------------------- #
# What the mapping choices buy (the numbers behind docs/quantisation.md)
# --------------------------------------------------------------------------- #


def test_mapping_choices_at_6_bits_on_activations_with_outlier_channels(rng):
    """Gaussian weights; Gaussian activations with 4 of 1024 channels scaled
    x10 to x100; 6-bit DAC and ADC, 8-bit mask; calibration and evaluation
    inputs drawn separately."""
    k, n = 1024, 256
    w = rng.standard_normal((k, n))
    channels, scales = rng.choice(k, 4, replace=False), np.array([10.0, 25.0, 50.0, 100.0])

    def activations(tokens, outliers=True):
        x = rng.standard_normal((tokens, k))
        if outliers:
            x[:, channels] *= scales
        return x

    base = ideal(**{"core.inputs": 512, "core.outputs": 128, "dac.bits": 6, "adc.bits": 6,
                    "mask.bits": 8})

    def sqnr(changes, outliers=True):
        cal, x = activations(256, outliers), activations(128, outliers)
        cfg = base.replace(changes)
        y, st = optical.matmul(x, optical.program(w, cfg, calibration=cal), cfg, seed=0,
                               return_stats=True)
        return metrics.sqnr_db(x @ w, y), st

    naive = {"dac.scaling": "per_tensor", "mask.scaling": "per_tensor", "adc.full_scale": "max"}
    mapped = {**naive, "mask.scaling": "per_column", "adc.full_scale": "calibrated"}
    for outliers in (True, False):
        gain = sqnr(mapped, outliers)[0] - sqnr(naive, outliers)[0]
        assert gain > 15.0, (outliers, gain)  # measured: ~29 dB with outliers, ~22 dB without

    per_token = {**mapped, "dac.scaling": "per_token"}
    bypass = {**per_token, "outliers.policy": "static", "outliers.top_k": 10}
    with_outliers, _ = sqnr(per_token)
    clean, _ = sqnr(per_token, outliers=False)
    bypassed, st = sqnr(bypass)
    assert st.digital_mac_fraction <= 0.01 and st.digital_channels == 4
    # The bypass removes nearly all the error the outliers cost (> 90%) and
    # leaves less error than the same mapping sees without outliers.
    assert bypassed > with_outliers + 10.0, (with_outliers, bypassed)
    assert bypassed > clean, (clean, bypassed)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"samples": np.array([[0.0, np.nan]])}, ValueError, "samples: contains 1 NaN"),
    ({"samples": np.ones(5)}, ValueError, "samples: expected 2 dimensions"),
    ({"samples": np.ones((0, 3))}, ValueError, r"samples: shape \(0, 3\) is empty"),
    ({"samples": np.ones((4, 2)) + 1j}, TypeError, "samples: dtype complex128"),
    ({"bits": None}, ValueError, "bits: None is not valid"),
    ({"bits": 0}, ValueError, "bits: 0 is not valid"),
    ({"sigma": -1.0}, ValueError, "sigma: expected finite, non-negative"),
    ({"groups": np.array([0])}, ValueError, "groups: expected 2 non-negative integer"),
    ({"groups": np.array([0.0, 1.0])}, ValueError, "groups: expected 2 non-negative integer"),
    ({"n_bins": 0}, ValueError, "n_bins: 0 is not valid"),
    ({"enob_loss": -1.0}, ValueError, "enob_loss: -1.0 is not valid"),
    ({"enob_loss": math.nan}, ValueError, "enob_loss: nan is not valid"),
    ({"enob_loss": math.inf}, ValueError, "enob_loss: inf is not valid"),
    # No effective bits (ADCConfig refuses it too): the search could stop at
    # the corner [min, min], 10x worse than the best window.
    ({"enob_loss": 4.0}, ValueError, "enob_loss: 4.0 leaves no effective bits of bits = 4"),
    ({"sigma": np.zeros(5)}, ValueError, r"sigma: shape \(5,\) does not match the 2 columns"),
    # Not parsed from text, no imaginary part dropped, no mask dropped:
    ({"sigma": "0.1"}, TypeError, "sigma: dtype <U3 is not supported"),
    ({"sigma": 0.1 + 5j}, TypeError, "sigma: dtype complex128 is not supported"),
    ({"sigma": True}, TypeError, "sigma: dtype bool is not supported"),
    ({"sigma": np.ma.masked_array([0.1, 1e3], mask=[False, True])}, TypeError,
     "sigma: numpy.ma.MaskedArray, a numpy.ndarray subclass"),
    ({"samples": np.ma.masked_array(np.ones((4, 2)), mask=np.eye(4, 2))}, TypeError,
     r"samples: numpy.ma.MaskedArray, a numpy.ndarray subclass.*\.filled"),
    ({"samples": np.ones((4, 3)), "groups": np.array([0, 2, 2])}, ValueError,
     r"groups: ids must be 0..2, .* no column has id\(s\) \[1\]"),
    # The ADC's bits, integer in [1, 24]; a bool is not a count, and a string is
    # not a flag ("no" is not read as True).
    ({"bits": 25}, ValueError, "bits: 25 is not valid"),
    ({"bits": 64}, ValueError, "bits: 64 is not valid"),
    ({"bits": True}, ValueError, "bits: True is not valid"),
    ({"n_bins": True}, ValueError, "n_bins: True is not valid"),
    ({"enob_loss": True}, ValueError, "enob_loss: True is not valid"),
    ({"tails": "no"}, TypeError, "tails: expected a bool, got str"),
    # A batch with no columns is empty (S, C >= 1); sigma is one per column, not
    # one per sample (4 samples, 2 columns).
    ({"samples": np.ones((3, 0))}, ValueError, r"samples: shape \(3, 0\) is empty"),
    ({"sigma": np.full(4, 0.1)}, ValueError,
     r"sigma: shape \(4,\) does not match the 2 columns"),
])
def test_mse_windows_refuses_bad_arguments(kwargs, error, match):
    args = {"samples": np.arange(8.0).reshape(4, 2), "sigma": 0.1, "bits": 4, **kwargs}
    with pytest.raises(error, match=match):
        mse_windows(args.pop("samples"), args.pop("sigma"), args.pop("bits"), **args)


def test_integer_samples_give_the_windows_of_their_float_values():
    codes = np.arange(40).reshape(20, 2) % 7
    lo, hi = mse_windows(codes, 0.2, 3)
    lo_f, hi_f = mse_windows(codes.astype(np.float64), 0.2, 3)
    np.testing.assert_array_equal(lo, lo_f)
    np.testing.assert_array_equal(hi, hi_f)


def test_huge_but_valid_photon_counts_are_the_shot_noise_free_limit(rng):
    """The windows and outputs at the largest finite p = 1e30 are those of
    p = inf (every noise term below float resolution)."""
    x = rng.standard_normal((30, 40))
    w = rng.standard_normal((40, 6))
    for name in ("iris-like", "wang-2022"):
        base = optical.presets.get(name).replace({"core.inputs": 32, "core.outputs": 8,
                                                   "source.rin_db_per_hz": -math.inf,
                                                   "detector.dark_electrons": 1.0,
                                                   "detector.read_noise_electrons": 1.0})
        huge = optical.matmul(x, w, base.replace({"source.photons_per_mac": 1e30}), seed=0)
        limit = optical.matmul(x, w, base.replace({"source.photons_per_mac": math.inf}), seed=0)
        np.testing.assert_allclose(huge, limit, rtol=1e-12, atol=1e-12 * np.abs(limit).max())


def test_normalise_scales_each_token_by_its_own_absmax():
    cal = np.array([[1.0, -4.0, 2.0], [0.5, 0.25, -0.125]])
    np.testing.assert_allclose(calibration.normalise(cal, ideal(), None),
                               [[0.25, -1.0, 0.5], [1.0, 0.5, -0.25]], rtol=0, atol=0)
    per_tensor = ideal(**{"dac.scaling": "per_tensor"})
    np.testing.assert_allclose(calibration.normalise(cal, per_tensor, None), cal / 4.0,
                               rtol=0, atol=0)


def test_exponential_tail_threshold_is_the_next_sample_inward():
    # 137 samples 0..136: 16 per tail; thresholds at the 17th from each end
    # (16 and 120), mean excess of the 16 beyond each: 8.5.
    tails = calibration._exponential_tails(np.arange(137.0)[None, :])
    assert tails.count == 16
    assert (tails.u_lo[0], tails.u_hi[0]) == (16.0, 120.0)
    assert (tails.e_lo[0], tails.e_hi[0]) == (8.5, 8.5)


def test_calibrated_window_noise_is_the_sum_of_every_readout_noise(monkeypatch, rng):
    """All calibration inputs at full scale (offset: every DAC level 1), split
    weights on a balanced detector: the readout noise variance of column n is
    shot sum_k (T+ + T-)[k, n] / p + dark 2 D / p**2 + read R**2 / p**2
    + RIN rin**2 sum_k (T+ - T-)[k, n]**2, each term of similar size."""
    p, dark, read = 100.0, 400.0, 28.0
    cfg = ideal(**{"core.inputs": 8, "core.outputs": 4, "adc.bits": 6,
                   "adc.full_scale": "calibrated", "encoding.inputs": "offset",
                   "encoding.weights": "split", "detector.balanced": True,
                   "source.photons_per_mac": p, "detector.dark_electrons": dark,
                   "detector.read_noise_electrons": read,
                   "source.rin_db_per_hz": -100.0, "source.rin_bandwidth": 1e8})
    seen = []
    real = calibration.mse_windows
    monkeypatch.setattr(calibration, "mse_windows",
                        lambda s, sigma, *a, **k: (seen.append(np.array(sigma)),
                                                   real(s, sigma, *a, **k))[1])
    w = rng.standard_normal((8, 3))
    pw = optical.program(w, cfg, calibration=np.ones((5, 8)))
    t = pw.transmissions.astype(np.float64)  # (2, 8, 3)
    rin2 = cfg.source.rin_sigma ** 2
    expected = (t.sum(axis=(0, 1)) / p + 2 * dark / p**2 + read**2 / p**2
                + rin2 * np.square(t[0] - t[1]).sum(axis=0))
    assert len(seen) == 1
    np.testing.assert_allclose(np.square(seen[0]), expected, rtol=1e-9)
    # DAC levels that differ by channel: the first 4 channels alternate
    # +1/-1 (levels 1 and 0: E[a] = E[a^2] = 1/2), the last 4 stay at 0
    # (level 1/2: E[a] = 1/2, E[a^2] = 1/4). Shot noise follows E[a] and
    # RIN E[a^2]: sum_k E[a_k] (T+ + T-)[k, n] / p + rin^2 sum_k E[a_k^2] (T+ - T-)[k, n]^2.
    cal = np.zeros((6, 8))
    cal[:, :4] = np.where(np.arange(6) % 2, -1.0, 1.0)[:, None]
    pw = optical.program(w, cfg, calibration=cal)
    t = pw.transmissions.astype(np.float64)
    mean, mean_square = np.repeat([0.5, 0.5], 4), np.repeat([0.5, 0.25], 4)
    expected = (mean @ (t[0] + t[1]) / p + 2 * dark / p**2 + read**2 / p**2
                + rin2 * mean_square @ np.square(t[0] - t[1]))
    assert len(seen) == 2
    np.testing.assert_allclose(np.square(seen[1]), expected, rtol=1e-9)


def test_rms_window_of_read_noise_is_read_electrons_over_photons_per_mac():
    # Read noise alone dominating: sigma = read_noise_electrons / photons_per_mac
    # full-scale MACs, so the window's half-width is headroom * that, whatever p.
    for p in (100.0, 400.0):
        cfg = optical.presets.get("ideal").replace({
            "source.photons_per_mac": p, "detector.read_noise_electrons": 1e4,
            "adc.full_scale": "rms", "adc.headroom": 4.0, "core.inputs": 16,
            "core.outputs": 8})
        w = np.random.default_rng(0).standard_normal((16, 8))
        pw = optical.program(w, cfg)
        half = (pw.adc_hi - pw.adc_lo) / 2
        np.testing.assert_allclose(half, 4.0 * 1e4 / p, rtol=1e-2)


def test_balanced_detector_shot_noise_is_the_sum_of_both_rails():
    # Shot noise of the two rails is independent: variances add under the
    # analogue subtraction, so balanced half-width^2 = rail0^2 + rail1^2.
    base = optical.presets.get("ideal").replace({
        "source.photons_per_mac": 1e-3, "adc.full_scale": "rms", "adc.headroom": 3.0,
        "encoding.weights": "split", "core.inputs": 16, "core.outputs": 8})
    w = np.random.default_rng(1).standard_normal((16, 8))
    bal = optical.program(w, base.replace({"detector.balanced": True}))
    sep = optical.program(w, base.replace({"detector.balanced": False}))
    assert bal.adc_lo.shape[1] == 1 and sep.adc_lo.shape[1] == 2
    half_bal = (bal.adc_hi - bal.adc_lo)[:, 0] / 2
    half_sep = (sep.adc_hi - sep.adc_lo) / 2
    np.testing.assert_allclose(half_bal ** 2, (half_sep ** 2).sum(axis=1), rtol=1e-3)


def test_programmed_weights_repr_is_a_summary_that_names_a_bypass(rng):
    """repr: the whole matrix's shape, dtype, tiles (K x N: ceil(12/4) x
    ceil(5/4) = 3 x 2) and whether outlier channels bypass the mask; no arrays."""
    x = rng.standard_normal((16, 12)).astype(np.float32)
    x[:, 3] *= 100.0  # one outlier channel: static policy sends it to the digital side
    w = rng.standard_normal((12, 5)).astype(np.float32)
    core = {"core.inputs": 4, "core.outputs": 4}
    plain = optical.program(w, ideal(**core))
    assert repr(plain) == "ProgrammedWeights(shape=(12, 5), dtype=float32, tiles=3x2)"
    bypassed = optical.program(w, ideal(**core, **{"outliers.policy": "static"}), calibration=x)
    assert bypassed.bypass is not None and list(bypassed.bypass.channels) == [3]
    # 11 channels left on the mask: still ceil(11/4) = 3 row tiles
    assert repr(bypassed) == "ProgrammedWeights(shape=(12, 5), dtype=float32, tiles=3x2, bypass)"
    assert repr(optical.program(w.astype(np.float64), ideal(**core))) == \
        "ProgrammedWeights(shape=(12, 5), dtype=float64, tiles=3x2)"


def test_programmed_arrays_are_read_only_and_a_replaced_one_is_seen_by_every_backend():
    """The fast backends derive their plans from a ProgrammedWeights' arrays
    once and find them again by identity: an array changed in place left
    numba with stale transmissions and JAX with stale windows and scales.
    program() returns them read-only; a field replaced by a new array is
    seen at once, the same bits as a fresh copy of every array."""
    pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 16,
                                                    "adc.full_scale": "rms",
                                                    "outliers.policy": "none"})
    w = rng.standard_normal((48, 20)).astype(np.float32)  # float32: JAX without x64
    x = rng.standard_normal((6, 48)).astype(np.float32)
    pw = optical.program(w, cfg)
    fields = ("scale", "weights", "weight_sums", "transmissions", "adc_lo", "adc_hi")
    for name in fields:
        assert not getattr(pw, name).flags.writeable, name
    with pytest.raises(ValueError, match="read-only"):
        pw.adc_hi[...] = 0
    narrow = dataclasses.replace(pw, adc_hi=pw.adc_hi * 0.5, scale=pw.scale * 2.0)
    fresh = dataclasses.replace(narrow, **{f: getattr(narrow, f).copy() for f in fields})
    for backend in ("numpy", "numba", "jax"):
        optical.matmul(x, pw, cfg, seed=1, backend=backend)  # plans of pw cached first
        np.testing.assert_array_equal(optical.matmul(x, narrow, cfg, seed=1, backend=backend),
                                      optical.matmul(x, fresh, cfg, seed=1, backend=backend))


@pytest.mark.parametrize("clone", [
    lambda p: pickle.loads(pickle.dumps(p)), lambda p: pickle.loads(pickle.dumps(p, protocol=5)),
    copy.deepcopy, lambda p: dataclasses.replace(p, adc_hi=p.adc_hi * 0.5)],
    ids=["pickle", "pickle5", "deepcopy", "replace"])
@pytest.mark.parametrize("policy", ["none", "static", "dynamic"])
def test_copies_of_programmed_weights_stay_read_only(clone, policy):
    """A pickled (to a worker), deep-copied or replaced ProgrammedWeights is
    read-only as program()'s (pickle's default protocol, deepcopy and a
    replaced field gave writeable arrays, and an in-place edit then left
    numba and JAX on their cached plans while numpy followed it), its bypass
    included, and runs the same bits as the original."""
    rng = np.random.default_rng(0)
    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 32, "core.outputs": 16, "outliers.policy": policy,
        "adc.full_scale": "rms", "dac.scaling": "per_token"})
    w = rng.standard_normal((48, 20)).astype(np.float32)
    x = rng.standard_normal((6, 48)).astype(np.float32)
    x[:, 3] *= 40.0  # an outlier channel for the bypass to take
    pw = optical.program(w, cfg, calibration=x if policy == "static" else None)
    q = clone(pw)
    arrays = [getattr(q, name) for name in ("scale", "weights", "weight_sums", "transmissions",
                                            "adc_lo", "adc_hi")]
    if policy != "none":
        arrays += [a for a in (q.bypass.channels, q.bypass.optical_channels, q.bypass.weights)
                   if a is not None]
    assert arrays and not any(a.flags.writeable for a in arrays)
    if q.adc_hi is pw.adc_hi or not np.array_equal(q.adc_hi, pw.adc_hi):
        return  # replace: another weight, checked read-only above
    np.testing.assert_array_equal(optical.matmul(x, q, cfg, seed=2, backend="numpy"),
                                  optical.matmul(x, pw, cfg, seed=2, backend="numpy"))


def test_a_replaced_view_is_copied_so_its_base_cannot_change_it():
    """A field replaced by a view of a writeable array is copied before it is
    made read-only: marking the view alone would leave the base to change
    it behind the fast backends' cached plans."""
    rng = np.random.default_rng(0)
    cfg = optical.presets.get("ideal").replace({"core.inputs": 32, "core.outputs": 16})
    pw = optical.program(rng.standard_normal((48, 20)).astype(np.float32), cfg)
    base = np.concatenate([pw.adc_hi, pw.adc_hi], axis=-1)
    q = dataclasses.replace(pw, adc_hi=base[..., :20])
    base[...] = 7.0
    np.testing.assert_array_equal(q.adc_hi, pw.adc_hi)
    assert base.flags.writeable  # the caller's own array is left as it was


def test_a_read_only_view_of_a_writeable_array_is_copied_too():
    """np.broadcast_to gives a read-only view of a writeable array: kept as
    it was, the numba and JAX backends reused plans derived from its old
    values once the caller changed the base (numpy used the new ones)."""
    rng = np.random.default_rng(0)
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 16})
    x = rng.standard_normal((6, 48)).astype(np.float32)
    pw = optical.program(rng.standard_normal((48, 20)).astype(np.float32), cfg, calibration=x)
    base = pw.transmissions.copy()
    q = dataclasses.replace(pw, transmissions=np.broadcast_to(base, base.shape))
    first = optical.matmul(x, q, cfg, seed=1, backend="numba")
    base[...] = base[..., ::-1]  # the caller changes its own array afterwards
    np.testing.assert_array_equal(optical.matmul(x, q, cfg, seed=1, backend="numba"), first)
    np.testing.assert_array_equal(optical.matmul(x, q, cfg, seed=1, backend="numpy"),
                                  optical.matmul(x, pw, cfg, seed=1, backend="numpy"))


@pytest.mark.parametrize(("change", "error", "message"), [
    # A masked NaN passed the finiteness check, then every backend gave NaN.
    (lambda pw: {"adc_lo": np.ma.masked_invalid(np.where(np.arange(pw.adc_lo.size).reshape(
        pw.adc_lo.shape) == 0, np.nan, pw.adc_lo))}, TypeError,
     r"adc_lo: numpy.ma.MaskedArray, a numpy.ndarray subclass, is not supported"),
    # numba failed inside its typing ('non-precise type pyobject'), numpy ran.
    (lambda pw: {"transmissions": pw.transmissions.astype(">f4")}, TypeError,
     r"transmissions: expected float32 or float64 in native byte order, got >f4"),
    (lambda pw: {"transmissions": pw.transmissions.astype(np.float16)}, TypeError,
     r"transmissions: expected float32 or float64 .* got float16"),
    # numpy computed in float64 here, numba and JAX in float32.
    (lambda pw: {"scale": pw.scale.astype(np.float64)}, TypeError,
     r"scale: float64, but weights are float32"),
    (lambda pw: {"adc_lo": pw.adc_lo.tolist()}, TypeError,
     r"adc_lo: expected a numpy.ndarray, got list"),
])
def test_replaced_fields_of_another_kind_are_refused(rng, change, error, message):
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 64, "core.outputs": 64})
    x = rng.standard_normal((8, 128)).astype(np.float32)
    pw = optical.program(rng.standard_normal((128, 96)).astype(np.float32), cfg, calibration=x)
    with pytest.raises(error, match=message):
        dataclasses.replace(pw, **change(pw))


def test_a_config_of_another_weight_encoding_is_refused_with_its_transmissions(rng):
    """Weights programmed offset (one rail) given a split config (two): both
    have one ADC rail, so the replacement passed, and numba returned a
    result 25x off (the review of kernel safety)."""
    offset = optical.presets.get("ideal").replace({"encoding.weights": "offset",
                                                   "core.inputs": 32, "core.outputs": 32})
    pw = optical.program(rng.standard_normal((40, 24)), offset)
    with pytest.raises(ValueError, match=r"transmissions: expected an array of shape "
                                         r"\(2, 40, 24\) \(encoding.weights = 'split'"):
        dataclasses.replace(pw, config=offset.replace({"encoding.weights": "split"}))


def test_readout_windows_refuses_arguments_that_disagree(rng):
    """calibration.readout_windows is public, and its kernel indexes by the
    arguments' shapes unchecked: rails of another rail count wrote past an
    array (heap corruption), a larger tiling read past the transmissions
    (finite, wrong windows), narrower inputs were refolded without a word."""
    from optical.calibration import readout_windows
    from optical.quant import Tiling, adc_rails

    cfg = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 32,
                                                   "detector.balanced": False})
    pw = optical.program(rng.standard_normal((48, 40)), cfg,
                         calibration=rng.standard_normal((16, 48)))
    xn = rng.uniform(-1, 1, (16, 48))
    rails, t = adc_rails(cfg), pw.transmissions
    lo, hi = readout_windows(xn, t, pw.tiling, rails, cfg)  # consistent: runs
    assert lo.shape == hi.shape == (2, 2, 40) and np.all(lo <= hi)
    for args, message in (((xn, t, pw.tiling, rails[:1, :1]), r"rails: expected shape"),
                          ((xn, t, Tiling(64, 40, 32, 32), rails), r"transmissions: expected"),
                          ((xn[:, :40], t, pw.tiling, rails), r"xn: expected shape \(tokens, "
                                                              r"48\)")):
        with pytest.raises(ValueError, match=message):
            readout_windows(*args, cfg)
    # dtypes too (a style audit: float16 transmissions failed inside numba,
    # int64 ones gave integer windows, widths such as 445 and 609)
    for x_, t_, name in ((xn, t.astype(np.float16), "transmissions: dtype float16"),
                         (xn, (t * 100).astype(np.int64), "transmissions: dtype int64"),
                         (xn.astype(np.float16), t, "xn: dtype float16")):
        with pytest.raises(TypeError, match=rf"{name} is not supported; use float32 or float64"):
            readout_windows(x_, t_, pw.tiling, rails, cfg)
    lo32, hi32 = readout_windows(xn, t.astype(np.float32), pw.tiling, rails, cfg)  # as program
    assert lo32.shape == lo.shape


def test_a_static_bypass_leaves_the_callers_channels_writeable():
    """DigitalBypass.static made the caller's own channel array read-only."""
    from optical.outliers import DigitalBypass

    channels = np.array([3, 1])
    bypass = DigitalBypass.static(np.ones((6, 2)), channels)
    assert channels.flags.writeable and not bypass.channels.flags.writeable
    channels[0] = 5
    assert bypass.channels.tolist() == [3, 1]


def _lower(a):
    return a[..., :-1]


@pytest.mark.parametrize(("change", "message"), [
    (lambda pw: {"adc_lo": pw.adc_hi + 1.0}, r"adc_lo, adc_hi: every ADC window needs "
     r"adc_lo <= adc_hi; got .* at \(k_tile, rail, column\)"),
    (lambda pw: {"adc_hi": np.full_like(pw.adc_hi, np.nan)}, r"adc_hi: expected finite"),
    (lambda pw: {"adc_lo": np.full_like(pw.adc_lo, -np.inf)}, r"adc_lo: expected finite"),
    (lambda pw: {"adc_hi": _lower(pw.adc_hi)}, r"adc_hi: expected an array of shape"),
    (lambda pw: {"scale": _lower(pw.scale)}, r"scale: expected an array of shape"),
    (lambda pw: {"transmissions": _lower(pw.transmissions)},
     r"transmissions: expected an array of shape"),
    # One rail of split weights' two: numba's fast path read past the array
    # (NaN; a segfault at 3072 x 3072), numpy raised IndexError.
    (lambda pw: {"transmissions": pw.transmissions[:1].copy()},
     r"transmissions: expected an array of shape \(2, 128, 96\) \(encoding.weights = "
     r"'split': 2 rail\(s\)\), got \(1, 128, 96\)"),
    # A tiling of another core with the same tile counts: numba's cached plan
    # kept the old cut (the result hung on the call history).
    (lambda pw: {"tiling": optical.quant.Tiling(128, 96, 100, 64)},
     r"tiling: expected a Tiling of the config's core 64 x 64"),
    (lambda pw: {"input_range": -1.0}, r"input_range: -1.0 is not valid"),
    (lambda pw: {"input_range": 0.0}, r"input_range: 0.0 is not valid"),
    (lambda pw: {"input_range": math.nan}, r"input_range: nan is not valid"),
    (lambda pw: {"input_range": True}, r"input_range: True is not valid"),
    (lambda pw: {"input_range": "1"}, r"input_range: '1' is not valid"),
])
def test_replaced_fields_are_checked_so_every_backend_refuses_them(rng, change, message):
    """ProgrammedWeights invites ``dataclasses.replace`` of its windows; bad
    values were refused by the numpy backend only (lo > hi, by adc_quantize)
    while numba and JAX returned garbage (-7.9 dB) or NaN, and a negative or
    zero input range passed everywhere. They are now refused on construction."""
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 64, "core.outputs": 64})
    x = rng.standard_normal((8, 128)).astype(np.float32)
    pw = optical.program(rng.standard_normal((128, 96)).astype(np.float32), cfg, calibration=x)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(pw, **change(pw))
    # What stays valid: wider windows, zero-width ones, another positive range.
    wider = dataclasses.replace(pw, adc_lo=pw.adc_lo - 1.0, adc_hi=pw.adc_hi + 1.0)
    dataclasses.replace(pw, adc_lo=pw.adc_hi, adc_hi=pw.adc_hi)
    dataclasses.replace(pw, input_range=np.float64(2.5))
    y_numpy = optical.matmul(x, wider, cfg, seed=0, backend="numpy")
    y_numba = optical.matmul(x, wider, cfg, seed=0, backend="numba", exact=True)
    assert metrics.sqnr_db(y_numpy, y_numba) > 60


@pytest.mark.parametrize("inputs", ["offset", "split"])
def test_rms_window_terms_against_their_analytic_variances(inputs):
    """The rms ADC window of one K-tile, term by term, on balanced split
    weights (the ADC sees c = t+ - t- per row, sum_g g^2 = 2):
    - noise-free: half = h sqrt(var_a sum c^2), the input level a uniform on
      [0, 1] (offset: mean 1/2, variance 1/12) or the positive part of one
      uniform on [-1, 1] (split: mean 1/4, E[a^2] = 1/6, variance 5/48);
    - RIN adds h^2 sigma^2 E[a^2] sum c^2 to half^2 (the relative fluctuation
      multiplies the whole level, mean included), sigma^2 = 10^(RIN/10) B;
    - shot noise adds h^2 E[a] sum t / p over both rails' transmissions;
    - dark current adds h^2 sum g^2 dark / p^2 (electrons over the
      photoelectrons of a full-scale MAC, on each rail);
    - and where the headroom reaches past the noise-free extremes, the window
      stops there: [sum min(c, 0), sum max(c, 0)]."""
    mean_a, var_a = {"offset": (1 / 2, 1 / 12), "split": (1 / 4, 5 / 48)}[inputs]
    h = 1.5
    base = optical.presets.get("ideal").replace({
        "adc.full_scale": "rms", "adc.headroom": h, "encoding.inputs": inputs,
        "mask.contrast_ratio": 20.0, "core.inputs": 16, "core.outputs": 8})
    w = np.random.default_rng(7).standard_normal((16, 8))

    def window(cfg):
        pw = optical.program(w, cfg)
        c = pw.transmissions[0] - pw.transmissions[1]
        return pw.adc_lo[0, 0], pw.adc_hi[0, 0], c.astype(np.float64)

    lo, hi, c = window(base)
    square = np.square(c).sum(axis=0)
    np.testing.assert_allclose((hi - lo) / 2, h * np.sqrt(var_a * square), rtol=1e-5)
    np.testing.assert_allclose((hi + lo) / 2, mean_a * c.sum(axis=0), rtol=1e-5, atol=1e-6)

    rin = base.replace({"source.rin_db_per_hz": -100.0, "source.rin_bandwidth": 1e9})
    lo_r, hi_r, _ = window(rin)
    sigma2 = 10 ** (-100 / 10) * 1e9
    np.testing.assert_allclose(((hi_r - lo_r) / 2) ** 2 - ((hi - lo) / 2) ** 2,
                               h ** 2 * sigma2 * (var_a + mean_a ** 2) * square, rtol=1e-4)

    p, dark = 100.0, 1e6
    lit = base.replace({"source.photons_per_mac": p})
    lo_l, hi_l, _ = window(lit)
    # shot noise adds h^2 E[a] sum_{rails, k} t / p: each rail's photon count
    # is Poisson, its variance its mean, in full-scale units over p
    t = optical.program(w, lit).transmissions.astype(np.float64)
    np.testing.assert_allclose(((hi_l - lo_l) / 2) ** 2 - ((hi - lo) / 2) ** 2,
                               h ** 2 * mean_a * (t[0].sum(axis=0) + t[1].sum(axis=0)) / p,
                               rtol=1e-4)
    lo_d, hi_d, _ = window(lit.replace({"detector.dark_electrons": dark}))
    np.testing.assert_allclose(((hi_d - lo_d) / 2) ** 2 - ((hi_l - lo_l) / 2) ** 2,
                               h ** 2 * 2 * dark / p ** 2, rtol=1e-4)

    lo_w, hi_w, _ = window(base.replace({"adc.headroom": 50.0}))
    np.testing.assert_allclose(lo_w, np.minimum(c, 0).sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(hi_w, np.maximum(c, 0).sum(axis=0), rtol=1e-6)


def test_mse_windows_takes_up_to_24_bits():
    """The ADC's range, integer in [1, 24]: 24 bits run (25 are refused)."""
    lo, hi = calibration.mse_windows(np.arange(8.0).reshape(4, 2), 0.1, 24)
    assert np.all(lo < hi)


@pytest.mark.parametrize("magnitude", [1e50, 1e-50])
def test_a_static_range_beyond_the_weights_dtype_is_refused(rng, magnitude):
    """float64 calibration inputs for float32 weights: a static range past
    float32's range became inf (NaN outputs) or 0 (all-zero outputs) when
    the matmul cast it, with RuntimeWarnings at most."""
    cfg = optical.presets.get("iris-like").replace({"dac.scaling": "static"})
    w = rng.standard_normal((40, 30)).astype(np.float32)
    calibration = rng.standard_normal((10, 40)) * magnitude
    with pytest.raises(ValueError, match=r"input_range: .* is (inf|0\.0) in the weights' dtype "
                                         "float32"):
        optical.program(w, cfg, calibration=calibration)
    pw = optical.program(w.astype(np.float64), cfg, calibration=calibration)  # float64: fine
    assert np.isfinite(optical.matmul(calibration, pw, cfg, seed=0)).all()


def test_programs_own_views_are_not_copied():
    """program()'s arrays are views of the transformer engines' recycled
    buffers (writeable bases, handed out again only once no view holds them):
    kept as they are. Copying every read-only view of a writeable base (the
    interop fix, before this) copied 2.6 GB per Llama-3.1-8B layer and raised
    the README job's peak from 2.39 to 3.17 GB (final read)."""
    from optical import _memory

    rng = np.random.default_rng(0)
    cfg = optical.presets.get("iris-like")
    x = rng.standard_normal((8, 2048)).astype(np.float32)
    w = rng.standard_normal((2048, 2048)).astype(np.float32)  # 16 MiB: recycled
    with _memory.recycling():
        pw = optical.program(w, cfg, calibration=x)
        views = {name: getattr(pw, name) for name in ("weights", "transmissions")}
        for name, array in views.items():
            assert array.base is not None and not array.flags.writeable, name
        # A replace of another field keeps them too.
        again = dataclasses.replace(pw, input_range=pw.input_range)
        assert all(getattr(again, name) is array for name, array in views.items())
    _memory.release()


def test_an_rms_window_past_float32_is_named():
    """A warnings audit: 1e9 read-noise electrons over 1e-30 photons per MAC
    (both in range) gave a float32 "rms" window of inf: numpy's overflow
    warning from quant.py, then "adc_lo: expected finite float window ends".
    Named now, with what to change; float64 holds it."""
    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (64, 32))
    cfg = optical.presets.get("iris-like").replace({
        "adc.full_scale": "rms", "source.photons_per_mac": 1e-30, "outliers.policy": "none",
        "detector.read_noise_electrons": 1e9})
    with pytest.raises(ValueError, match=r"adc.full_scale 'rms': the noise makes a window wider "
                                         r"than float32 holds .* raise source.photons_per_mac"):
        optical.program(w.astype(np.float32), cfg)
    pw = optical.program(w, cfg)
    assert np.isfinite(pw.adc_lo).all() and np.isfinite(pw.adc_hi).all()
