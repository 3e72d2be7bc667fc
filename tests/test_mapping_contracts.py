"""Contracts of programming and of the outlier bypass that the other tests
left open: the "rms" ADC window's RIN and dark-count terms from the physics,
a static input range under a static bypass, the choice of outlier channels
among many ties, zero-token calls, and what program() must not share with or
change in the caller's arrays. Truth: the physical description (per-source
RIN, per-detector dark counts), hand-written expectations and the documented
contracts."""

import numpy as np
import pytest

import optical
from optical import quant
from optical.config import OutliersConfig
from optical.outliers import channel_magnitude, select_channels

from .configs import ideal

# --------------------------------------------------------------------------- #
# The "rms" ADC window's noise terms
# --------------------------------------------------------------------------- #


def _rms_window(g, headroom, mean_a, var_a, noise_var):
    """The documented "rms" window of ADC-side transmissions g (K, N): the
    signal's spread (inputs uniform on [-1, 1]) plus the noise, the signal part
    never beyond the noise-free extremes."""
    mean = mean_a * g.sum(axis=0)
    half = headroom * np.sqrt(var_a * np.square(g).sum(axis=0) + noise_var)
    noise_half = headroom * np.sqrt(noise_var)
    floor, ceiling = np.minimum(g, 0).sum(axis=0), np.maximum(g, 0).sum(axis=0)
    return np.maximum(mean - half, floor - noise_half), np.minimum(mean + half, ceiling + noise_half)


def test_rms_window_holds_rin_of_the_sources_mean_square_level():
    """RIN multiplies each source's level a by (1 + sigma e): the readout's
    RIN variance is sigma**2 sum_k E[a_k**2] g_k**2, and with offset inputs
    uniform on [-1, 1] (a uniform on [0, 1]) E[a**2] = 1/3, not Var a = 1/12."""
    cfg = ideal(**{"adc.full_scale": "rms", "adc.bits": 8, "adc.headroom": 3.0,
                   "core.inputs": 16, "core.outputs": 8, "encoding.inputs": "offset",
                   "encoding.weights": "split", "detector.balanced": True,
                   "source.rin_db_per_hz": -82.0, "source.rin_bandwidth": 1e8})
    sigma = cfg.source.rin_sigma
    assert 0.5 < sigma < 1.0
    w = np.random.default_rng(3).standard_normal((16, 8))
    pw = optical.program(w, cfg)
    t = pw.transmissions.astype(np.float64)
    g = t[0] - t[1]  # balanced: the rails subtract before the one ADC
    rin = sigma**2 * (1 / 3) * np.square(g).sum(axis=0)
    lo, hi = _rms_window(g, 3.0, 1 / 2, 1 / 12, rin)
    np.testing.assert_allclose(pw.adc_lo[0, 0], lo, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(pw.adc_hi[0, 0], hi, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("balanced", [True, False])
def test_rms_window_holds_the_dark_counts_of_every_detector_behind_its_adc(balanced):
    """Each detector has its own dark counts (variance D electrons). A
    balanced pair is subtracted before one ADC, so that ADC sees 2 D; a
    detector with its own ADC sees D. In full-scale MACs: / p**2."""
    p, dark = 1e10, 1e20  # dark noise of the order of the signal, shot noise 1e-9 of it
    cfg = ideal(**{"adc.full_scale": "rms", "adc.bits": 8, "adc.headroom": 2.0,
                   "core.inputs": 16, "core.outputs": 8, "encoding.inputs": "offset",
                   "encoding.weights": "split", "detector.balanced": balanced,
                   "source.photons_per_mac": p, "detector.dark_electrons": dark})
    w = np.random.default_rng(4).standard_normal((16, 8))
    pw = optical.program(w, cfg)
    t = pw.transmissions.astype(np.float64)
    # (ADC-side transmissions, the detectors behind that ADC)
    adcs = [(t[0] - t[1], [t[0], t[1]])] if balanced else [(t[0], [t[0]]), (t[1], [t[1]])]
    for r, (g, detectors) in enumerate(adcs):
        dark_var = len(detectors) * dark / p**2
        shot_var = sum((1 / 2) * d.sum(axis=0) for d in detectors) / p  # mean light / p
        noise = dark_var + shot_var
        lo, hi = _rms_window(g, 2.0, 1 / 2, 1 / 12, noise)
        np.testing.assert_allclose(pw.adc_lo[0, r], lo, rtol=1e-9)
        np.testing.assert_allclose(pw.adc_hi[0, r], hi, rtol=1e-9)


# --------------------------------------------------------------------------- #
# Static input range and static bypass together
# --------------------------------------------------------------------------- #


def test_static_input_range_applies_to_the_optical_part_of_a_static_bypass(rng):
    """Static outliers and a static input range: the optical part is the rest
    of the channels, scaled by the calibration percentile of those channels
    (the outliers are not on the mask) and clipped; ideal converters make the
    clipping the only error: y = x[:, D] @ w[D] + clip(x[:, O], -r, r) @ w[O]."""
    k = 40
    cal = rng.standard_normal((300, k))
    cal[:, [6, 21]] *= 80.0
    x = rng.standard_normal((25, k)) * 1.5
    x[:, [6, 21]] *= 80.0
    w = rng.standard_normal((k, 9))
    cfg = ideal(**{"outliers.policy": "static", "outliers.threshold": 6.0,
                   "dac.scaling": "static", "dac.percentile": 90.0,
                   "core.inputs": 16, "core.outputs": 8})
    pw = optical.program(w, cfg, calibration=cal)
    digital = np.array([6, 21])
    np.testing.assert_array_equal(pw.bypass.channels, digital)
    keep = np.setdiff1d(np.arange(k), digital)
    r = np.percentile(np.abs(cal[:, keep]), 90.0)
    assert pw.input_range == pytest.approx(r, rel=1e-12)
    expect = x[:, digital] @ w[digital] + np.clip(x[:, keep], -r, r) @ w[keep]
    np.testing.assert_allclose(optical.matmul(x, pw, cfg, seed=0), expect,
                               rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- #
# Choosing the outlier channels
# --------------------------------------------------------------------------- #


def test_select_channels_ties_go_to_the_lower_index_among_many():
    """Ties at the top among up to 64 channels: the top_k chosen are the
    lowest indices of the tie, for every top_k (numpy's default, unstable
    sort picks others on long arrays), with or without a threshold."""
    for n, tied in [(16, [0, 5, 10, 15]), (30, [2, 5, 7, 11, 13, 17, 19, 23, 27, 29]),
                    (40, list(range(0, 40, 3))), (64, [0, 21, 42, 63])]:
        magnitude = np.ones(n)
        magnitude[tied] = 9.0
        for top_k in range(1, len(tied) + 1):
            for threshold in (None, 2.0):  # under half tied: the median is 1, the tie exceeds 2
                rule = OutliersConfig(policy="static", threshold=threshold, top_k=top_k)
                np.testing.assert_array_equal(select_channels(magnitude, rule), tied[:top_k],
                                              err_msg=f"{n=} {top_k=} {threshold=}")


def test_a_call_with_no_tokens_under_a_dynamic_bypass_is_empty(rng):
    assert np.array_equal(channel_magnitude(np.zeros((0, 5))), np.zeros(5))
    cfg = ideal(**{"outliers.policy": "dynamic", "outliers.top_k": 2,
                   "core.inputs": 8, "core.outputs": 4})
    w = rng.standard_normal((12, 5))
    y, st = optical.matmul(np.zeros((0, 12)), optical.program(w, cfg), cfg, seed=0,
                           return_stats=True)
    assert y.shape == (0, 5)
    assert st.digital_channels == 0 and st.digital_macs == 0


# --------------------------------------------------------------------------- #
# program() and the caller's arrays
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_programmed_bypass_does_not_follow_later_changes_to_w(rng, policy):
    """Programming is a weight load: changing w afterwards changes neither
    the optical nor the digital side of the programmed matrix."""
    x = rng.standard_normal((10, 30))
    x[:, 4] *= 60.0
    w = rng.standard_normal((30, 6))
    cfg = ideal(**{"outliers.policy": policy, "outliers.top_k": 1,
                   "core.inputs": 16, "core.outputs": 4})
    pw = optical.program(w, cfg, calibration=x)
    before = optical.matmul(x, pw, cfg, seed=0)
    np.testing.assert_allclose(before, x @ w, rtol=1e-10, atol=1e-10)
    w *= -3.0
    np.testing.assert_array_equal(optical.matmul(x, pw, cfg, seed=0), before)


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_program_leaves_the_calibration_inputs_untouched(rng, policy):
    """Calibration under a dynamic bypass darkens the outlier channels of a
    copy: the caller's calibration array is not written."""
    cal = rng.standard_normal((50, 20))
    cal[:, [3, 9]] *= 40.0
    original = cal.copy()
    cfg = ideal(**{"outliers.policy": policy, "outliers.threshold": 6.0,
                   "adc.full_scale": "calibrated", "adc.bits": 6,
                   "core.inputs": 8, "core.outputs": 4})
    optical.program(rng.standard_normal((20, 3)), cfg, calibration=cal)
    np.testing.assert_array_equal(cal, original)


@pytest.mark.parametrize(("cal", "error", "match"), [
    (np.ones((10, 5)), ValueError, "calibration: has 5 features .* but w has 6 rows"),
    (np.array([[np.nan] + [1.0] * 5]), ValueError, "calibration: contains 1 NaN"),
    (np.ones((3, 6), dtype=np.int32), TypeError, "calibration: dtype int32"),
])
def test_calibration_inputs_are_checked_even_where_the_config_does_not_use_them(cal, error,
                                                                              match):
    """program()'s documented contract: calibration inputs a config does not
    need are "checked (width, values) but unused"."""
    cfg = ideal(**{"adc.full_scale": "rms", "adc.bits": 6})
    assert quant.calibration_needs(cfg) == []
    with pytest.raises(error, match=match):
        optical.program(np.ones((6, 3)), cfg, calibration=cal)


def test_per_row_expands_a_tile_field_to_the_rows_of_partial_tiles():
    """K = 7 in tiles of 3: rows {0, 1, 2}, {3, 4, 5}, {6}."""
    tiling = quant.Tiling(7, 2, 3, 2)
    field = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    np.testing.assert_array_equal(quant._per_row(field, tiling),
                                  [[1, 2]] * 3 + [[3, 4]] * 3 + [[5, 6]])
