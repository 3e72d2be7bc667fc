"""Calibration (optical.calibration, optical.kernels._windows): the readouts,
noise, ranges and windows it computes, against hand calculation, the
documented contract and independent recomputation."""

import numpy as np
import pytest
from scipy import integrate

import optical
from optical import calibration

from .configs import ideal


def _capture(monkeypatch):
    """Record what readout_windows hands to mse_windows: (samples, sigma, groups)."""
    seen = []
    real = calibration.mse_windows

    def spy(samples, sigma, *args, **kwargs):
        seen.append((np.array(samples), np.array(sigma), kwargs.get("groups")))
        return real(samples, sigma, *args, **kwargs)

    monkeypatch.setattr(calibration, "mse_windows", spy)
    return seen


def _levels(xn, bits):
    """Offset-encoded DAC levels of normalised inputs, by hand: (x + 1) / 2 on
    2**bits evenly spaced levels."""
    top = 2**bits - 1
    return np.rint((xn + 1) / 2 * top) / top


@pytest.mark.parametrize("scaling", ["per_token", "per_tensor", "static"])
def test_calibration_readouts_are_dac_quantised_normalised_inputs_through_the_mask(
        monkeypatch, rng, scaling):
    """The readouts the windows are fitted to: the evenly spaced subsample of
    the calibration tokens that are not all zero (padding is left out of
    every statistic), scaled as matmul scales inputs (own abs-max per token,
    the whole batch's abs-max per tensor, the static percentile with
    clipping), on the 2-bit DAC's levels, times the programmed transmissions."""
    k, n, n_tokens, max_tokens = 12, 5, 21, 7
    cal = rng.standard_normal((n_tokens, k))
    cal[1] *= 50.0  # the batch's abs-max, in a token the subsample leaves out
    cal[3] = 0.0  # an all-zero token (padding): left out, the rows after it move up
    cal[8, :5] = 0.0  # zeros in a real token count
    signal = np.delete(cal, 3, axis=0)
    rows = np.linspace(0, n_tokens - 2, max_tokens).round().astype(int)  # [0 3 7 10 13 17 20]
    w = rng.standard_normal((k, n))
    cfg = ideal(**{"adc.bits": 6, "adc.full_scale": "calibrated", "dac.bits": 2,
                   "dac.scaling": scaling, "dac.percentile": 50.0,
                   "encoding.inputs": "offset", "encoding.weights": "offset",
                   "core.inputs": 16, "core.outputs": 8, "calibration.max_tokens": max_tokens})
    seen = _capture(monkeypatch)
    pw = optical.program(w, cfg, calibration=cal)
    sub = signal[rows]
    if scaling == "per_token":
        xn = sub / np.abs(sub).max(axis=1, keepdims=True)
    elif scaling == "per_tensor":
        xn = sub / np.abs(signal).max()
    else:
        r = np.percentile(np.abs(signal), 50.0)
        assert pw.input_range == pytest.approx(r, rel=1e-12)
        assert r != pytest.approx(np.percentile(np.abs(cal), 50.0), rel=1e-6)  # padding out
        xn = np.clip(sub / r, -1.0, 1.0)
    expected = _levels(xn, 2) @ pw.transmissions[0].astype(np.float64)
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0][0], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rin_db", [-100.0, -175.0])
def test_calibration_rin_variance_uses_the_mean_square_dac_level(monkeypatch, rin_db):
    """RIN alone (infinite photons): the readout variance of column n is
    rin**2 sum_k E[a_k**2] (T+ - T-)[k, n]**2. Tokens alternately all +1 and
    all -1 put every source at level 1 or 0: E[a**2] = 1/2, not E[a]**2 = 1/4.
    A RIN far below every other noise (-175 dB/Hz over 1 kHz) still counts."""
    cfg = ideal(**{"core.inputs": 8, "core.outputs": 4, "adc.bits": 6,
                   "adc.full_scale": "calibrated", "encoding.inputs": "offset",
                   "encoding.weights": "split", "detector.balanced": True,
                   "source.rin_db_per_hz": rin_db, "source.rin_bandwidth": 1e3})
    seen = _capture(monkeypatch)
    w = np.random.default_rng(3).standard_normal((8, 3))
    cal = np.repeat([[1.0], [-1.0]], 3, axis=0) * np.ones((1, 8))
    pw = optical.program(w, cfg, calibration=cal)
    t = pw.transmissions.astype(np.float64)
    expected = cfg.source.rin_sigma ** 2 * 0.5 * np.square(t[0] - t[1]).sum(axis=0)
    assert len(seen) == 1
    np.testing.assert_allclose(np.square(seen[0][1]), expected, rtol=1e-9)


def test_one_calibration_token_is_enough_for_a_range_not_for_noise_free_windows(rng):
    """A single (non-zero) token is a valid calibration batch for a static
    input range, and for calibrated ADC windows where noise widens them; a
    noise-free window fitted to one token is a point, which read every other
    input as that token's readout without counting a clip (relative error
    1.37 on a 40 x 11 product): refused, naming why."""
    w = rng.standard_normal((6, 3))
    cal = rng.standard_normal((1, 6))
    static = {"dac.scaling": "static", "dac.percentile": 100.0, "adc.bits": 6}
    pw = optical.program(w, ideal(**static), calibration=cal)
    assert pw.input_range == pytest.approx(np.abs(cal).max(), rel=1e-12)
    assert calibration.check_inputs(cal[0], 6).shape == (1, 6)
    windows = {**static, "adc.full_scale": "calibrated"}
    with pytest.raises(ValueError, match=r"^calibration: 3 of 3 calibrated ADC windows "
                                         r"collapsed to a point, .* without counting a clip: "
                                         r"there is one calibration row; give rows that vary"):
        optical.program(w, ideal(**windows), calibration=cal)
    # Rows that are one row up to scale are one row once normalised, per token.
    dynamic = {"adc.bits": 6, "adc.full_scale": "calibrated"}
    with pytest.raises(ValueError, match=r"the 3 calibration rows are all one row once "
                                         r"normalised"):
        optical.program(w, ideal(**dynamic), calibration=cal * np.array([[1.0], [2.0], [0.5]]))
    noisy = ideal(**windows, **{"source.photons_per_mac": 1e3})
    pw = optical.program(w, noisy, calibration=cal)
    assert np.all(np.isfinite(pw.adc_lo)) and np.all(pw.adc_hi - pw.adc_lo > 0)
    # The oracle: the one token is the input itself, and its point windows
    # read it exactly (as optical.matmul calibrates raw weights on x).
    pw = optical.program(w, ideal(**windows), calibration=cal, oracle=True)
    np.testing.assert_allclose(optical.matmul(cal, pw, ideal(**windows), seed=0), cal @ w,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(optical.matmul(cal, w, ideal(**windows), seed=0), cal @ w,
                               rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match=r"^oracle: expected a bool, got int$"):
        optical.program(w, ideal(**windows), calibration=cal, oracle=1)


@pytest.mark.parametrize("inputs", ["split", "offset"])
def test_a_k_tile_constant_in_varied_calibration_rows_keeps_its_point_windows(rng, inputs):
    """A K-tile the calibration leaves dark (or constant: a bias column) in
    varied rows fitted its readouts point windows, and a tile lit at run time
    read as that point with almost nothing counted clipped (relative error
    0.57 in an audit). Such windows are widened upward by 1e-5 of the
    readout's span: the constant still reads exactly, and a shift from it is
    counted. (Refusing them, a first version, refused a bias column and a
    tile of dynamic outliers, a review found.) In float32 the low end sits
    a readout's rounding under the value: the constant computed in another
    order fell an ulp under it, and the numpy backend counted 6 % of offset
    inputs' conversions clipped where float64 counts none. The subsample
    may not make several rows one, not even the oracle's."""
    w = rng.standard_normal((40, 11))
    cal = rng.standard_normal((256, 40))
    cal[:, 16:32] = 0
    cfg = ideal(**{"core.inputs": 16, "core.outputs": 8, "adc.bits": 8,
                   "adc.full_scale": "calibrated", "encoding.inputs": inputs})
    pw = optical.program(w, cfg, calibration=cal)
    x = rng.standard_normal((64, 40))
    x[:, 16:32] = 0
    np.testing.assert_allclose(optical.matmul(x, pw, cfg, seed=0), x @ w, rtol=0.05,
                               atol=0.05 * np.abs(x @ w).max())
    _, dark = optical.matmul(x, pw, cfg, seed=0, backend="numpy", return_stats=True)
    pw32 = optical.program(w.astype(np.float32), cfg, calibration=cal.astype(np.float32))
    for backend in ("numpy", "numba"):
        _, dark32 = optical.matmul(x.astype(np.float32), pw32, cfg, seed=0, backend=backend,
                                   return_stats=True)
        assert dark32.clipped_fraction == dark.clipped_fraction, backend
    x[:, 16:32] = rng.standard_normal((64, 16))
    _, stats = optical.matmul(x, pw, cfg, seed=0, return_stats=True)
    assert stats.clipped_fraction > 0.25  # most of tile 1's readouts (1/3 of all)
    _, stats32 = optical.matmul(x.astype(np.float32), pw32, cfg, seed=0, return_stats=True)
    assert stats32.clipped_fraction > 0.25
    width = pw.adc_hi - pw.adc_lo
    assert np.all(width[1] > 0) and np.all(width[1] < 1e-4 * width[[0, 2]].min())
    # One window per tile stays one window per tile, widened: under split
    # inputs the dark tile's columns all read 0, a point each column would
    # widen by its own span (its weights differ), shared again after.
    tiled = optical.program(w, cfg.replace({"adc.window": "per_tile"}), calibration=cal)
    for ns in (slice(0, 8), slice(8, 11)):
        assert np.all(tiled.adc_hi[..., ns] == tiled.adc_hi[..., ns][..., :1])
        assert np.all(tiled.adc_lo[..., ns] == tiled.adc_lo[..., ns][..., :1])
    assert np.all(tiled.adc_hi[1] > tiled.adc_lo[1])
    one = cfg.replace({"calibration.max_tokens": 1})
    for oracle in (False, True):
        with pytest.raises(ValueError, match=r"collapsed to a point, .*: calibration.max_tokens "
                                             r"= 1 kept 1 of the 256 calibration rows, all one "
                                             r"row once normalised; raise it$"):
            optical.program(w, one, calibration=cal, oracle=oracle)



@pytest.mark.parametrize("dac_bits", [None, 6])
def test_rows_that_are_one_row_at_the_dacs_levels_are_refused(rng, dac_bits):
    """Rows were one row only where their normalised values were equal to
    the bit: a row and its copies scaled by 3 and 7 (an ulp apart once
    normalised per token) kept point windows, neither refused nor widened,
    and read every later input as that row's readout (an audit: relative
    error 1.52, nothing counted clipped)."""
    w = rng.standard_normal((48, 10))
    cfg = ideal(**{"dac.bits": dac_bits, "adc.bits": 6, "core.inputs": 16,
                   "core.outputs": 4, "adc.full_scale": "calibrated"})
    row = rng.standard_normal((1, 48))
    with pytest.raises(ValueError, match=r"the 3 calibration rows are all one row once "
                                         r"normalised"):
        optical.program(w, cfg, calibration=row * np.array([[1.0], [3.0], [7.0]]))


@pytest.mark.parametrize("inputs", ["split", "offset"])
def test_a_k_tile_within_half_a_dac_step_of_constant_gets_widened_windows(rng, inputs):
    """Whether a K-tile was constant in calibration was judged on its
    normalised inputs, not on the levels the DAC drives: a tile under half
    a DAC step (every row one level, so one readout) kept its point windows,
    and lit at run time read as that point with next to nothing counted
    clipped (an audit: relative error 0.61-0.64, clipping 0-0.0007), where
    an exactly dark tile's windows are widened and its clipping counted."""
    w = rng.standard_normal((48, 8))
    cal = rng.standard_normal((256, 48))
    tiny = 1e-3 * rng.standard_normal((256, 16))
    cal[:, 16:32] = np.abs(tiny) if inputs == "offset" else tiny
    cfg = ideal(**{"dac.bits": 6, "adc.bits": 6, "mask.bits": 6, "core.inputs": 16,
                   "core.outputs": 8, "adc.full_scale": "calibrated",
                   "encoding.inputs": inputs})
    pw = optical.program(w, cfg, calibration=cal)
    width = pw.adc_hi - pw.adc_lo
    assert np.all(width[1] > 0) and np.all(width[1] < 1e-4 * width[[0, 2]].min())
    x = rng.standard_normal((64, 48))
    _, stats = optical.matmul(x, pw, cfg, seed=0, return_stats=True)
    assert stats.clipped_fraction > 0.25  # most of tile 1's readouts (a third of all)

def test_the_public_calibration_helpers_refuse_what_the_config_would():
    """``input_range(cal, 0)`` gave the smallest |cal| and 150 or NaN numpy's
    error unnamed; ``subsample(cal, 0)`` no rows (an audit). The config
    refuses these values; the public helpers now do too, by name."""
    cal = np.arange(1.0, 13.0).reshape(3, 4)
    for bad in (0.0, -1.0, 150.0, float("nan"), True):
        with pytest.raises(ValueError, match=r"^percentile: .* must be a number in \(0, 100\]"):
            calibration.input_range(cal, bad)
    assert calibration.input_range(cal, 100.0) == 12.0
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match=r"^max_tokens: .* must be a positive integer"):
            calibration.subsample(cal, bad)
    np.testing.assert_array_equal(calibration.subsample(cal, 2), cal[[0, 2]])

@pytest.mark.parametrize("unit", [1e-3, 1.0, 1e3])
def test_static_range_of_a_mostly_zero_calibration_is_its_largest_value(rng, unit):
    """The percentile of |cal| is 0 when most entries are zero (sparse or
    ReLU activations): the range falls back to the largest |cal|, in the
    inputs' units. (It was 1 whatever the units: inputs in thousands clipped
    to +-1, a relative error of 0.999 on the ideal preset, without a word.)"""
    cal = np.zeros((10, 6))
    cal[0, 0], cal[3, 2] = -3.0 * unit, 0.5 * unit  # the largest magnitude is negative
    assert calibration.input_range(cal, 50.0) == 3.0 * unit
    assert calibration.input_range(cal, 100.0) == 3.0 * unit
    w = rng.standard_normal((6, 2))
    cfg = ideal(**{"dac.scaling": "static", "dac.percentile": 50.0})
    pw = optical.program(w, cfg, calibration=cal)
    assert pw.input_range == 3.0 * unit
    x = rng.uniform(-2.9, 2.9, (4, 6)) * unit
    np.testing.assert_allclose(optical.matmul(x, pw, cfg, seed=0), x @ w, rtol=1e-10,
                               atol=1e-10 * unit)
    # Signal only on a channel that bypasses the optics: nothing to fit the
    # range to (it was 1, clipping inputs in hundreds: 0.99 relative error).
    cal = np.zeros((10, 6))
    cal[:, 0] = rng.uniform(500, 1000, 10) * unit
    for policy in ("static", "dynamic"):
        bypassed = cfg.replace({"outliers.policy": policy, "outliers.top_k": 1,
                                "outliers.threshold": None})
        with pytest.raises(ValueError, match="every channel left on the optics is zero"):
            optical.program(w, bypassed, calibration=cal)


def test_per_tile_calibrated_windows_are_the_windows_of_each_n_tiles_pooled_readouts(rng):
    """adc.window = "per_tile": every column of an N-tile shares the window that
    mse_windows gives the tile's readouts as one group (readouts recomputed
    here: exact DAC, offset encodings, one K-tile)."""
    k, n = 10, 10
    cal = rng.standard_normal((40, k))
    w = rng.standard_normal((k, n))
    cfg = ideal(**{"adc.bits": 5, "adc.full_scale": "calibrated", "adc.window": "per_tile",
                   "encoding.inputs": "offset", "encoding.weights": "offset",
                   "core.inputs": 16, "core.outputs": 4})
    pw = optical.program(w, cfg, calibration=cal)
    xn = cal / np.abs(cal).max(axis=1, keepdims=True)
    readouts = (xn + 1) / 2 @ pw.transmissions[0].astype(np.float64)
    for start in range(0, n, 4):
        ns = slice(start, min(start + 4, n))
        part = readouts[:, ns]
        lo, hi = calibration.mse_windows(part, 0.0, 5, groups=np.zeros(part.shape[1], int))
        np.testing.assert_allclose(pw.adc_lo[0, 0, ns], lo[0], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(pw.adc_hi[0, 0, ns], hi[0], rtol=1e-9, atol=1e-12)


# --------------------------------------------------------------------------- #
# mse_windows
# --------------------------------------------------------------------------- #


def test_sigma_of_shape_one_applies_to_every_column(rng):
    samples = rng.standard_normal((60, 3))
    for backend in ("numpy", "numba"):
        lo, hi = calibration.mse_windows(samples, np.array([0.3]), 5, backend=backend)
        ref_lo, ref_hi = calibration.mse_windows(samples, 0.3, 5, backend=backend)
        np.testing.assert_array_equal(lo, ref_lo)
        np.testing.assert_array_equal(hi, ref_hi)


def test_a_negative_group_id_is_refused_clearly():
    with pytest.raises(ValueError, match="groups: expected 2 non-negative integer group ids"):
        calibration.mse_windows(np.ones((4, 2)), 0.0, 4, groups=np.array([-1, 0]))


@pytest.mark.parametrize("spread", [10.0, 100.0])
def test_one_noisy_column_gets_its_noise_window_beside_noise_free_ones(rng, spread):
    """Columns are independent (one window each): a column whose readouts are
    all 5.0 under noise of sigma 2 gets the window it gets alone -- the noise's
    (4 bits: about +-2.5 sigma) -- whatever noise-free columns sit beside it,
    even one spanning ~600, of which NEGLIGIBLE_NOISE (2 %) is 12 > 2: noise is
    negligible only against every column's own range."""
    samples = np.column_stack([rng.standard_normal(200) * spread, np.full(200, 5.0)])
    for backend in ("numpy", "numba"):
        lo, hi = calibration.mse_windows(samples, np.array([0.0, 2.0]), 4, backend=backend)
        alone = calibration.mse_windows(samples[:, 1:], np.array([2.0]), 4, backend=backend)
        assert lo[1] == pytest.approx(alone[0][0], rel=1e-12)
        assert hi[1] == pytest.approx(alone[1][0], rel=1e-12)
        assert 4.0 < hi[1] - lo[1] < 14.0  # 2 x (2 to 3.5) sigma, not a point


@pytest.mark.parametrize(("n", "count"), [(8, None), (9, 1), (16, 1), (17, 2), (128, 15),
                                          (129, 16), (1000, 16)])
def test_exponential_tails_take_one_sample_per_eight_beyond_the_first(n, count):
    """count = min(TAIL_SAMPLES, (n - 1) // 8): at least eight samples for each
    tail sample, none below nine samples."""
    tails = calibration._exponential_tails(np.arange(float(n))[None, :])
    if count is None:
        assert tails is None
    else:
        assert tails.count == count
        assert (tails.u_lo[0], tails.u_hi[0]) == (count, n - 1 - count)


def test_exponential_tail_mean_excess_by_hand():
    """Uneven tails: the mean (not the median) distance of the 16 extreme
    samples past the next one inward."""
    top = 200.0 + 2.0 ** np.arange(16)  # excesses over 200: 1, 2, 4, ..., 32768
    bottom = -100.0 - np.arange(16) ** 2  # excesses below -100: 0, 1, 4, ..., 225
    body = np.linspace(-100.0, 200.0, 105)  # holds both thresholds
    samples = np.concatenate([bottom, body, top])[None, :]  # 137 samples
    tails = calibration._exponential_tails(samples)
    assert tails.count == 16
    assert (tails.u_lo[0], tails.u_hi[0]) == (-100.0, 200.0)
    assert tails.e_hi[0] == pytest.approx((2.0**16 - 1) / 16, rel=1e-12)
    assert tails.e_lo[0] == pytest.approx(sum(i * i for i in range(16)) / 16, rel=1e-12)


@pytest.mark.parametrize("bits", [4, 8])
def test_window_of_mirrored_readouts_is_the_mirrored_window(rng, bits):
    """The conversion error is symmetric under r -> -r: skewed readouts (a long
    upper tail) mirrored give the mirrored window, tails and all."""
    samples = rng.exponential(1.0, (400, 3)) * [1.0, 2.0, 5.0]
    for backend in ("numpy", "numba"):
        lo, hi = calibration.mse_windows(samples, np.zeros(3), bits, backend=backend)
        m_lo, m_hi = calibration.mse_windows(-samples, np.zeros(3), bits, backend=backend)
        np.testing.assert_allclose(m_lo, -hi, rtol=0, atol=1e-9 * np.max(hi - lo))
        np.testing.assert_allclose(m_hi, -lo, rtol=0, atol=1e-9 * np.max(hi - lo))


def test_tails_are_fitted_from_a_hundred_samples(rng):
    """With 100 samples (12 per tail) the fitted tails still widen an 8-bit
    window past the samples, where the samples alone end it inside."""
    samples = rng.standard_normal((100, 4))
    lo, hi = calibration.mse_windows(samples, np.zeros(4), 8)
    raw_lo, raw_hi = calibration.mse_windows(samples, np.zeros(4), 8, tails=False)
    slack = 1e-9 * np.ptp(samples, axis=0)  # the top edge is g_lo + n_bins * width
    assert np.all(raw_hi <= samples.max(axis=0) + slack)
    assert np.all(raw_lo >= samples.min(axis=0) - slack)
    assert np.all(hi > samples.max(axis=0)) and np.all(lo < samples.min(axis=0))


def _conversion_cost(s, lo, hi, bits):
    clip = np.sum(np.where(s > hi, (s - hi) ** 2, 0.0) + np.where(s < lo, (lo - s) ** 2, 0.0))
    return clip + s.size * ((hi - lo) / (2**bits - 1)) ** 2 / 12


@pytest.mark.parametrize("seed", range(4))
def test_window_is_the_brute_force_best_among_the_ranges_edges(seed):
    """No noise, no tails: the ends are among n_bins + 1 evenly spaced edges
    of [min, max], and no pair of those edges converts the samples better."""
    rng = np.random.default_rng(seed)
    n_bins, bits = 8, 3
    s = rng.integers(-20, 21, 60).astype(np.float64)
    edges = s.min() + np.arange(n_bins + 1) * (s.max() - s.min()) / n_bins
    best = min(_conversion_cost(s, a, b, bits) for i, a in enumerate(edges) for b in edges[i:])
    for backend in ("numpy", "numba"):
        lo, hi = calibration.mse_windows(s[:, None], 0.0, bits, tails=False, n_bins=n_bins,
                                         backend=backend)
        assert np.min(np.abs(edges - lo[0])) <= 1e-12 * np.ptp(s)
        assert np.min(np.abs(edges - hi[0])) <= 1e-12 * np.ptp(s)
        assert _conversion_cost(s, lo[0], hi[0], bits) == pytest.approx(best, rel=1e-12)


def test_a_narrow_window_by_hand_and_a_point_for_constant_readouts():
    """Readouts 1 and 3, one bit, an ENOB loss of 0.99 bits (kappa = 4**0.99):
    a window of width w centred on 2 costs 2 (1 - w/2)**2 + 2 kappa w**2 / 12,
    least at w = 0.864; among the edges 1.0, 1.2, ..., 3.0 the best is
    [1.6, 2.4] (cost 1.141; [1.4, 2.6] costs 1.267, [1.6, 2.6] 1.178). Constant
    readouts get the point itself. Both backends."""
    for backend in ("numpy", "numba"):
        lo, hi = calibration.mse_windows(np.array([[1.0], [3.0]]), 0.0, 1, 0.99, tails=False,
                                         n_bins=10, backend=backend)
        assert (lo[0], hi[0]) == (pytest.approx(1.6, abs=1e-12), pytest.approx(2.4, abs=1e-12))
        lo, hi = calibration.mse_windows(np.full((5, 1), 2.0), 0.0, 1, 0.5, tails=False,
                                         n_bins=10, backend=backend)
        assert (lo[0], hi[0]) == (2.0, 2.0)


def test_numba_spreads_a_column_whose_noise_is_under_a_bin_like_numpy():
    """Readouts 0 and 1 with noise of ~0.2 bin (under one bin, 1 / 465 of the
    range) beside a noisy column that makes the call noisy: the outer nodes
    still move the column down one bin, its top bin included, as in the
    reference; a top bin left in place moves the 6-bit window's upper end."""
    b = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    samples = np.column_stack([b, np.zeros(7)])
    for scale in (1.0, 1.0 / 1024):
        for loss in (0.9871523816915098, 1.0):
            sigma = np.array([0.00215284, 1.0]) * scale
            args = (samples * scale, sigma, 6, loss)
            lo, hi = calibration.mse_windows(*args, tails=False, n_bins=92, backend="numba")
            ref_lo, ref_hi = calibration.mse_windows(*args, tails=False, n_bins=92,
                                                     backend="numpy")
            np.testing.assert_array_equal(lo, ref_lo)
            np.testing.assert_array_equal(hi, ref_hi)


def test_numba_bins_float32_readouts_in_float32_like_numpy():
    """float32 readouts are binned from their float32 offsets above the range's
    lower end, in both backends: here an offset that float64 would put in the
    other bin moves the 2-bit window's upper end by one bin (the noise, under
    NEGLIGIBLE_NOISE of the range, is left out)."""
    s = np.array([5.868598937988281, 6.201932430267334, -5.1314005851745605,
                  2.5352656841278076, -2.798067569732666, 1.5352658033370972,
                  0.20193243026733398, -0.798067569732666, -5.798067569732666,
                  5.868598937988281, 8.201932907104492, -0.13140082359313965],
                 dtype=np.float32)[:, None]
    sigma = np.array([0.21688922])
    lo, hi = calibration.mse_windows(s, sigma, 2, tails=False, n_bins=59, backend="numba")
    ref_lo, ref_hi = calibration.mse_windows(s, sigma, 2, tails=False, n_bins=59,
                                             backend="numpy")
    np.testing.assert_array_equal(lo, ref_lo)
    np.testing.assert_array_equal(hi, ref_hi)


def test_tail_clip_is_the_expected_clipping_error_of_an_exponential_excess():
    """count * E[(X - b)_+ ** 2] for X ~ Exp(e), by quadrature of the density,
    for window ends inside the threshold (b < 0: every excess clips) and
    outside it (b > 0: only the excess beyond b)."""
    e = np.array([0.3, 1.7])
    step = np.array([0.25, 0.4])
    # each row increases by its step (as _tail_clip requires), crossing the threshold
    beyond = np.array([-1.0, -0.9])[:, None] + step[:, None] * np.arange(6)
    got = calibration._tail_clip(beyond, 5, e, step)
    for c in range(2):
        for j, b in enumerate(beyond[c]):
            want = 5 * integrate.quad(lambda x, b=b, c=c: (x - b) ** 2 * np.exp(-x / e[c]) / e[c],
                                      max(b, 0.0), np.inf, epsabs=0, epsrel=1e-12)[0]
            assert got[c, j] == pytest.approx(want, rel=1e-9), (c, b)


def test_numba_windows_with_fitted_tails_match_numpy_on_skewed_readouts():
    """Skewed (gamma) readouts at few bits put window ends inside the fitted
    tails' thresholds, where the clipping error is 2 e**2 - 2 e b + b**2:
    the compiled search and the numpy reference agree (the docstring allows
    a window one bin apart at equal cost, from libm's exp: at most two of 64
    here; none today; a sign error there moved half of them)."""
    rng = np.random.default_rng(11)
    for bits in (2, 3, 4):
        samples = rng.gamma(2.0, 1.0, size=(512, 64))
        sigma = np.full(64, 0.05)
        lo, hi = calibration.mse_windows(samples, sigma, bits, backend="numba")
        ref_lo, ref_hi = calibration.mse_windows(samples, sigma, bits, backend="numpy")
        for got, want in ((lo, ref_lo), (hi, ref_hi)):
            assert np.count_nonzero(got != want) <= 2, bits


def _capture(monkeypatch):
    """Record what readout_windows hands to mse_windows: (samples, sigma, enob_loss)."""
    seen = []
    real = calibration.mse_windows

    def spy(samples, sigma, bits, enob_loss=0.0, **kwargs):
        seen.append((np.array(samples), np.array(sigma), enob_loss))
        return real(samples, sigma, bits, enob_loss, **kwargs)

    monkeypatch.setattr(calibration, "mse_windows", spy)
    return seen


def _offset_levels(xn):
    """Offset encoding on an exact DAC: (x + 1) / 2."""
    return (xn + 1) / 2


def test_a_calibration_batch_within_the_cap_is_used_whole_each_token_once(monkeypatch):
    """calibration.max_tokens is a cap ("at most this many", CalibrationConfig):
    10 tokens under a cap of 16 are all pushed through the readouts, each once
    (not resampled to 16 evenly spaced rows with repeats)."""
    rng = np.random.default_rng(1)
    k, n, tokens = 12, 5, 10
    cal = rng.standard_normal((tokens, k))
    w = rng.standard_normal((k, n))
    cfg = ideal(**{"adc.bits": 6, "adc.full_scale": "calibrated", "encoding.inputs": "offset",
                   "encoding.weights": "offset", "core.inputs": 16, "core.outputs": 8,
                   "calibration.max_tokens": 16})
    seen = _capture(monkeypatch)
    pw = optical.program(w, cfg, calibration=cal)
    xn = cal / np.abs(cal).max(axis=1, keepdims=True)
    expected = _offset_levels(xn) @ pw.transmissions[0].astype(np.float64)
    assert len(seen) == 1
    assert seen[0][0].shape == (tokens, n)
    np.testing.assert_allclose(seen[0][0], expected, rtol=1e-12, atol=1e-12)


def test_each_k_tile_is_calibrated_on_its_own_input_channels(monkeypatch):
    """Three K-tiles (8 + 8 + 4 rows): the readouts behind K-tile i's windows
    are the inputs of that tile's rows through that tile's transmissions (by
    hand in float64), not the first tile's inputs."""
    rng = np.random.default_rng(2)
    k, n = 20, 3
    cal = rng.standard_normal((30, k)) * np.linspace(0.2, 3.0, k)  # channels differ
    w = rng.standard_normal((k, n))
    cfg = ideal(**{"adc.bits": 6, "adc.full_scale": "calibrated", "encoding.inputs": "offset",
                   "encoding.weights": "offset", "core.inputs": 8, "core.outputs": 4})
    seen = _capture(monkeypatch)
    pw = optical.program(w, cfg, calibration=cal)
    levels = _offset_levels(cal / np.abs(cal).max(axis=1, keepdims=True))
    t = pw.transmissions[0].astype(np.float64)
    assert len(seen) == 3  # one N-tile, one ADC rail
    for i, (start, stop) in enumerate([(0, 8), (8, 16), (16, 20)]):
        np.testing.assert_allclose(seen[i][0], levels[:, start:stop] @ t[start:stop],
                                   rtol=1e-12, atol=1e-12)


#: Photons per MAC, dark electrons and read-noise electrons of _noisy_calibrated.
_P, _DARK, _READ = 100.0, 400.0, 28.0


def _noisy_calibrated(*, inputs, balanced):
    """An 8 x 4 core of split weights, calibrated 6-bit ADC windows and every
    readout noise (shot, dark, read, RIN) at a strength the windows feel."""
    return ideal(**{"core.inputs": 8, "core.outputs": 4, "adc.bits": 6,
                    "adc.full_scale": "calibrated", "encoding.inputs": inputs,
                    "encoding.weights": "split", "detector.balanced": balanced,
                    "source.photons_per_mac": _P, "detector.dark_electrons": _DARK,
                    "detector.read_noise_electrons": _READ,
                    "source.rin_db_per_hz": -100.0, "source.rin_bandwidth": 1e8})


def test_calibrated_noise_of_each_unbalanced_rail_is_that_rails_own(monkeypatch):
    """Split weights, unbalanced detector: each weight rail has its own ADC
    and its own noise. Inputs at full scale (offset: every level 1): the
    variance of rail r, column n, is shot sum_k T_r[k, n] / p + dark D / p**2
    + read R**2 / p**2 + RIN rin**2 sum_k T_r[k, n]**2."""
    p, dark, read = _P, _DARK, _READ
    cfg = _noisy_calibrated(inputs="offset", balanced=False)
    seen = _capture(monkeypatch)
    w = np.random.default_rng(3).standard_normal((8, 3))
    pw = optical.program(w, cfg, calibration=np.ones((5, 8)))
    t = pw.transmissions.astype(np.float64)  # (2, 8, 3)
    rin2 = cfg.source.rin_sigma ** 2
    assert len(seen) == 2
    for rail in range(2):
        expected = (t[rail].sum(axis=0) / p + dark / p**2 + read**2 / p**2
                    + rin2 * np.square(t[rail]).sum(axis=0))
        np.testing.assert_allclose(np.square(seen[rail][1]), expected, rtol=1e-9)
        np.testing.assert_allclose(seen[rail][0], np.ones((5, 8)) @ t[rail], rtol=1e-12)


def test_calibrated_windows_follow_the_adcs_enob_loss():
    """An 8-bit ADC with an ENOB loss of 2 bits quantises like a 6-bit one
    (kappa = 4**enob_loss in mse_windows): its calibrated windows are the
    6-bit ADC's (to 2 %): narrower than the lossless 8-bit ADC's, as the
    coarser effective step makes clipping cheaper by comparison."""
    rng = np.random.default_rng(4)
    cal = rng.standard_normal((256, 64))
    w = rng.standard_normal((64, 16))
    base = ideal(**{"adc.full_scale": "calibrated", "core.inputs": 64, "core.outputs": 16})

    def width(bits, loss):
        pw = optical.program(w, base.replace({"adc.bits": bits, "adc.enob_loss": loss}),
                             calibration=cal)
        return pw.adc_hi - pw.adc_lo

    lossy, six, eight = width(8, 2.0), width(6, 0.0), width(8, 0.0)
    np.testing.assert_allclose(lossy, six, rtol=0.02)
    assert np.all(lossy < eight)


def test_calibrated_noise_with_split_inputs_averages_both_input_passes(monkeypatch):
    """Split inputs take two passes per token (positive parts, then negative
    parts). Every token all +1: the first pass lights every source (level 1),
    the second none (level 0), so over the readouts E[a] = E[a**2] = 1/2:
    variance shot sum_k (T+ + T-)[k, n] / (2 p) + dark 2 D / p**2
    + read R**2 / p**2 + RIN rin**2 sum_k (T+ - T-)[k, n]**2 / 2 (balanced)."""
    p, dark, read = _P, _DARK, _READ
    cfg = _noisy_calibrated(inputs="split", balanced=True)
    seen = _capture(monkeypatch)
    w = np.random.default_rng(5).standard_normal((8, 3))
    pw = optical.program(w, cfg, calibration=np.ones((5, 8)))
    t = pw.transmissions.astype(np.float64)
    rin2 = cfg.source.rin_sigma ** 2
    expected = (t.sum(axis=(0, 1)) / (2 * p) + 2 * dark / p**2 + read**2 / p**2
                + rin2 * np.square(t[0] - t[1]).sum(axis=0) / 2)
    assert len(seen) == 1
    np.testing.assert_allclose(np.square(seen[0][1]), expected, rtol=1e-9)
    # the readouts: five of the full-scale pass, then five dark ones
    full = np.ones(8) @ (t[0] - t[1])
    np.testing.assert_allclose(seen[0][0], np.vstack([np.tile(full, (5, 1)), np.zeros((5, 3))]),
                               rtol=1e-12, atol=1e-12)
