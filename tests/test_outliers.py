"""Outlier channels that bypass the optics: the rule by hand, the decomposition
against an explicit split of the product, and the counts."""

import numpy as np
import pytest

import optical
from optical import metrics, quant
from optical.config import OutliersConfig
from optical.outliers import channel_magnitude, select_channels

from .configs import ideal
from .conftest import EXACT_RTOL


def _noisy(**changes):
    return optical.presets.get("iris-like").replace({
        "core.inputs": 64, "core.outputs": 32, "source.photons_per_mac": 40.0,
        "source.rin_db_per_hz": -120.0, "adc.bits": 6, "dac.bits": 6, **changes})


def _activations(rng, tokens, k, channels=(3, 50, 77), scales=(20.0, 60.0, 100.0)):
    x = rng.standard_normal((tokens, k))
    x[:, list(channels)] *= scales
    return x


@pytest.mark.parametrize(("threshold", "top_k", "expect"), [
    (6.0, None, [3, 5]),    # median of nonzero magnitudes is 1: 10 and 50 exceed 6
    (6.0, 1, [5]),          # capped: the largest only
    (20.0, None, [5]),
    (None, 2, [3, 5]),      # rank only
    (None, 0, []),
    (100.0, None, []),
])
def test_select_channels_by_hand(threshold, top_k, expect):
    magnitude = np.array([1.0, 1.0, 0.0, 10.0, 1.0, 50.0, 1.0])
    rule = OutliersConfig(policy="static", threshold=threshold, top_k=top_k)
    np.testing.assert_array_equal(select_channels(magnitude, rule), expect)


def test_select_channels_ties_go_to_the_lower_index():
    rule = OutliersConfig(policy="static", threshold=None, top_k=2)
    np.testing.assert_array_equal(select_channels(np.array([5.0, 1.0, 5.0, 5.0]), rule), [0, 2])
    zero = OutliersConfig(policy="static", threshold=2.0)
    assert select_channels(np.zeros(4), zero).size == 0


def test_outlier_rule_needs_a_threshold_or_top_k():
    with pytest.raises(ValueError, match="outliers.policy: 'static' needs outliers.threshold"):
        ideal().replace({"outliers.policy": "static", "outliers.threshold": None})
    with pytest.raises(ValueError, match="outliers.threshold: 0.5 is out of range"):
        ideal().replace({"outliers.threshold": 0.5})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_bypass_is_exact_in_the_ideal_limit_and_counted(rng, dtype, policy):
    k, n = 100, 70
    x = _activations(rng, 30, k).astype(dtype)
    w = rng.standard_normal((k, n)).astype(dtype)
    cfg = ideal(**{"outliers.policy": policy, "core.inputs": 30, "core.outputs": 32})
    pw = optical.program(w, cfg, calibration=_activations(rng, 200, k).astype(dtype))
    assert pw.shape == (k, n)
    exact = x.astype(np.float64) @ w  # before the call: truth that cannot share its faults
    y, st = optical.matmul(x.reshape(3, 10, k), pw, cfg, seed=0, return_stats=True)
    assert y.dtype == dtype and y.shape == (3, 10, n)
    assert metrics.relative_error(exact, y.reshape(30, n)) < EXACT_RTOL[dtype]
    assert st.digital_channels == 3
    assert st.digital_macs == 30 * 3 * n
    assert st.digital_mac_fraction == pytest.approx(3 / k)
    # Static: the bypassed rows are not on the mask; dynamic: the mask holds all.
    rows = k - 3 if policy == "static" else k
    assert pw.tiling.k == rows
    counted = optical.core.schedule(30, rows, n, cfg).to_dict()
    assert {key: st.to_dict()[key] for key in counted} == counted


def test_static_bypass_is_the_explicit_decomposition_under_noise(rng):
    """y = x[:, D] @ w[D] + optical(x[:, O], w[O]) with the same seed."""
    k = 120
    cal = _activations(rng, 300, k)
    x = _activations(rng, 40, k)
    w = rng.standard_normal((k, 50))
    cfg = _noisy(**{"outliers.policy": "static", "outliers.threshold": 8.0})
    y = optical.matmul(x, optical.program(w, cfg, calibration=cal), cfg, seed=5)
    digital = [3, 50, 77]
    keep = np.setdiff1d(np.arange(k), digital)
    plain = cfg.replace({"outliers.policy": "none"})
    rest = optical.program(w[keep], plain, calibration=cal[:, keep])
    expect = x[:, digital] @ w[digital] + optical.matmul(x[:, keep], rest, plain, seed=5)
    np.testing.assert_allclose(y, expect, rtol=1e-12, atol=1e-12)


def test_dynamic_bypass_is_the_explicit_decomposition_whatever_the_chunking(rng):
    k = 120
    x = _activations(rng, 40, k)
    w = rng.standard_normal((k, 50))
    cfg = _noisy(**{"outliers.policy": "dynamic", "outliers.top_k": 3})
    y = optical.matmul(x, w, cfg, seed=5)
    digital = [3, 50, 77]
    dark = x.copy()
    dark[:, digital] = 0
    expect = x[:, digital] @ w[digital] + optical.matmul(
        dark, w, cfg.replace({"outliers.policy": "none"}), seed=5)
    np.testing.assert_allclose(y, expect, rtol=1e-12, atol=1e-12)
    for chunk in (1, 7, 40):
        np.testing.assert_array_equal(optical.matmul(x, w, cfg, seed=5, chunk_tokens=chunk), y)


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_bypass_that_takes_every_channel_is_refused(rng, policy):
    """The dynamic policy's rank alone (``top_k >= k``, no threshold) sent
    every channel of every call to the digital side, an exact matmul scored
    as an optical one (an audit: error 4e-16, digital_mac_fraction 1.0, the
    conversions still counted); the static one was refused already."""
    cfg = ideal(**{"outliers.policy": policy, "outliers.threshold": None, "outliers.top_k": 8})
    with pytest.raises(ValueError, match="send all 8 input channels to the digital side"):
        optical.program(np.ones((8, 2)), cfg, calibration=rng.standard_normal((4, 8)))
    with pytest.raises(ValueError, match="send all 8 input channels to the digital side"):
        quant.check_programmable(8, 2, cfg)
    for backend in ("numpy", "numba"):
        with pytest.raises(ValueError, match="send all 8 input channels to the digital side"):
            optical.matmul(rng.standard_normal((3, 8)), np.ones((8, 2)), cfg, seed=0,
                           backend=backend)
    seven = cfg.replace({"outliers.top_k": 7})  # one channel left on the mask: runs
    quant.check_programmable(8, 2, seven)
    assert optical.matmul(rng.standard_normal((3, 8)), np.ones((8, 2)), seven, seed=0).shape \
        == (3, 2)


def test_static_channels_come_from_calibration_not_from_the_call(rng):
    """A channel that is large only in the call stays optical (static policy)."""
    k = 64
    cal = rng.standard_normal((100, k))
    cal[:, 5] *= 50
    x = rng.standard_normal((10, k))
    x[:, 9] *= 50
    w = rng.standard_normal((k, 4))
    cfg = ideal(**{"outliers.policy": "static"})
    pw = optical.program(w, cfg, calibration=cal)
    np.testing.assert_array_equal(pw.bypass.channels, [5])
    _, st = optical.matmul(x, pw, cfg, seed=0, return_stats=True)
    assert st.digital_channels == 1
    _, dyn = optical.matmul(x, w, cfg.replace({"outliers.policy": "dynamic"}), seed=0,
                            return_stats=True)
    assert dyn.digital_channels == 1


def test_pooled_stats_keep_the_digital_share_of_all_macs(rng):
    """Per-head products are pooled by the transformer engine: the digital
    share must be total digital MACs over total logical MACs, not a sum."""
    from optical.transformer._engines import sum_stats

    cfg = ideal(**{"outliers.policy": "dynamic", "outliers.threshold": None,
                   "outliers.top_k": 2})
    parts = []
    for k, tokens in ((40, 3), (60, 5)):
        x = rng.standard_normal((tokens, k))
        parts.append(optical.matmul(x, rng.standard_normal((k, 7)), cfg, seed=0,
                                    return_stats=True)[1])
    pooled = sum_stats(parts)
    assert pooled.digital_macs == 3 * 2 * 7 + 5 * 2 * 7
    assert pooled.digital_mac_fraction == pytest.approx(pooled.digital_macs
                                                        / (3 * 40 * 7 + 5 * 60 * 7))


def test_threshold_is_relative_to_the_median_of_the_nonzero_magnitudes():
    magnitude = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 3.0])
    rule = OutliersConfig(policy="static", threshold=2.0, top_k=None)
    np.testing.assert_array_equal(select_channels(magnitude, rule), [7])


def test_a_channel_at_exactly_the_threshold_is_not_an_outlier():
    rule = OutliersConfig(policy="static", threshold=6.0, top_k=None)
    assert select_channels(np.array([1.0, 1.0, 1.0, 6.0]), rule).size == 0


def test_a_negative_outlier_channel_is_found(rng):
    x = rng.uniform(-1, 1, (16, 12))
    x[:, 4] = -rng.uniform(40, 60, 16)  # large, always negative
    np.testing.assert_array_equal(channel_magnitude(x), np.abs(x).max(axis=0))
    cfg = ideal(**{"outliers.policy": "static", "outliers.threshold": 6.0,
                   "outliers.top_k": None})
    pw = optical.program(rng.standard_normal((12, 5)), cfg, calibration=x)
    np.testing.assert_array_equal(pw.bypass.channels, [4])


@pytest.mark.parametrize("inputs", ["offset", "split"])
def test_dynamic_bypass_zeroes_the_channels_inputs_which_offset_encoding_sends_half_lit(inputs):
    """Dynamic outlier channels stay on the mask with their inputs zeroed:
    a zero is the offset encoding's level 0.5 (that light is detected), and
    dark on both rails of the split encoding. Photons counted by hand from
    the levels and the programmed transmissions."""
    cfg = ideal().replace({"encoding.inputs": inputs, "encoding.weights": "split",
                           "source.photons_per_mac": 1e4, "detector.shot_noise": "gaussian",
                           "outliers.policy": "dynamic", "outliers.top_k": 1,
                           "outliers.threshold": None, "core.inputs": 8, "core.outputs": 8})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8))
    x[:, 3] *= 100.0
    pw = optical.program(rng.standard_normal((8, 8)), cfg)
    _, st = optical.matmul(x, pw, cfg, seed=0, return_stats=True, backend="numpy")
    assert st.digital_channels == 1
    u = x.copy()
    u[:, 3] = 0.0
    u /= np.abs(u).max(axis=1, keepdims=True)
    # Source levels per input rail: offset (1 + u) / 2 on one rail; split max(+-u, 0).
    levels = [(1 + u) / 2] if inputs == "offset" else [np.maximum(u, 0), np.maximum(-u, 0)]
    assert all(level[:, 3].max() == (0.5 if inputs == "offset" else 0.0) for level in levels)
    light_per_channel = pw.transmissions.sum(axis=(0, 2))  # every weight rail and column
    expected = 1e4 * sum(float((level * light_per_channel).sum()) for level in levels)
    assert st.detected_photons == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_static_input_range_excludes_the_bypassed_channels(policy):
    """dac.percentile is taken over the calibration inputs of the channels
    the optics carry: the bypassed ones are excluded, not counted as zeros
    (with half the channels bypassed and the 50th percentile, zeros would
    put the range near 0)."""
    rng = np.random.default_rng(0)
    cal = rng.standard_normal((50, 8))
    cal[:, :4] *= 100.0
    cfg = ideal().replace({"dac.scaling": "static", "dac.percentile": 50.0,
                           "outliers.policy": policy, "outliers.threshold": None,
                           "outliers.top_k": 4, "core.inputs": 8, "core.outputs": 4})
    pw = optical.program(rng.standard_normal((8, 4)), cfg, calibration=cal)
    assert pw.input_range == pytest.approx(np.percentile(np.abs(cal[:, 4:]), 50), rel=1e-12)


def test_dynamic_bypass_with_offset_inputs_reads_each_zeroed_channel_half_a_dac_step_high():
    """An 8-bit DAC has no level at 0.5: the zeroed channel d is sent as
    128 / 255 and adds w[d] / 255 of the token's range to every output (the
    outliers module's docstring); by hand, every other channel quantised too."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 16))
    x[:, 3] *= 100.0
    w = rng.standard_normal((16, 5))
    cfg = ideal(**{"dac.bits": 8, "outliers.policy": "dynamic", "outliers.top_k": 1,
                   "outliers.threshold": None, "core.inputs": 16, "core.outputs": 5})
    y = optical.matmul(x, optical.program(w, cfg), cfg, seed=0)
    rest = x.copy()
    rest[:, 3] = 0.0
    r = np.abs(rest).max(axis=1, keepdims=True)  # per-token range of the optical channels
    sent = (2 * np.rint((rest / r + 1) / 2 * 255) / 255 - 1) * r  # what the DAC shows
    np.testing.assert_allclose(sent[:, 3], r[:, 0] / 255, rtol=1e-12)
    np.testing.assert_allclose(y, x[:, [3]] @ w[[3]] + sent @ w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("policy", ["none", "static", "dynamic"])
def test_the_caller_s_arrays_are_never_written(rng, backend, policy):
    """program() and matmul() read x, w and the calibration input and write
    none of them (a bypass that zeroed the outlier columns in place once
    emptied them in the caller's x too): read-only inputs work and keep their
    bits, raw weights and programmed alike."""
    k, n = 100, 40
    x = _activations(rng, 12, k)
    w = rng.standard_normal((k, n))
    cal = _activations(rng, 50, k)
    copies = [a.copy() for a in (x, w, cal)]
    for a in (x, w, cal):
        a.flags.writeable = False
    cfg = _noisy(**{"outliers.policy": policy, "outliers.threshold": 6.0})
    pw = optical.program(w, cfg, calibration=cal)
    y = optical.matmul(x, pw, cfg, seed=1, backend=backend)
    y_raw = optical.matmul(x, w, cfg, seed=1, backend=backend)
    for a, before in zip((x, w, cal), copies, strict=True):
        np.testing.assert_array_equal(a, before)
    assert np.isfinite(y).all() and np.isfinite(y_raw).all()
    # A writable x stays untouched too (no defensive read-only copy hides a write).
    x_w = copies[0].copy()
    optical.matmul(x_w, pw, cfg, seed=1, backend=backend)
    np.testing.assert_array_equal(x_w, copies[0])


def test_dynamic_bypass_calibrates_the_windows_on_the_light_the_mask_will_see(rng):
    """Under the dynamic policy a call zeroes its outlier channels on the
    mask, so the calibrated ADC windows must come from calibration readouts
    with those channels dark: the same windows as the plain machine's,
    calibrated on inputs whose two x100 channels are zeroed by hand (and not
    those of the inputs as they are, whose outliers widen every window)."""
    k, n = 64, 32
    w = rng.standard_normal((k, n))
    cal = rng.standard_normal((200, k))
    cal[:, [5, 40]] *= 100.0
    base = optical.presets.get("iris-like").replace({
        "core.inputs": 32, "core.outputs": 32, "adc.full_scale": "calibrated",
        "outliers.threshold": 6.0})
    dynamic = optical.program(w, base.replace({"outliers.policy": "dynamic"}), calibration=cal)
    dark = cal.copy()
    dark[:, [5, 40]] = 0.0
    plain = base.replace({"outliers.policy": "none"})
    by_hand = optical.program(w, plain, calibration=dark)
    np.testing.assert_array_equal(dynamic.adc_lo, by_hand.adc_lo)
    np.testing.assert_array_equal(dynamic.adc_hi, by_hand.adc_hi)
    lit = optical.program(w, plain, calibration=cal)
    assert np.abs(lit.adc_hi - by_hand.adc_hi).max() > 0.1 * np.abs(by_hand.adc_hi).max()


def _rare_outlier_batch():
    """40 tokens; channel 3 is an outlier (x100) in token 20 alone -- a token
    neither in the first 8 nor in the 8 evenly spaced ones (0, 6, 11, 17,
    22, 28, 33, 39) that calibration.max_tokens = 8 pushes through the readouts."""
    rng = np.random.default_rng(7)
    cal = rng.standard_normal((40, 16))
    cal[20, 3] = 100.0
    return rng, cal


def test_static_outlier_channels_come_from_every_calibration_token():
    """CalibrationConfig.max_tokens: "input ranges and outlier channels use
    every token" -- only the readouts are capped."""
    rng, cal = _rare_outlier_batch()
    cfg = ideal(**{"outliers.policy": "static", "outliers.threshold": 6.0,
                   "calibration.max_tokens": 8, "adc.bits": 6, "adc.full_scale": "calibrated",
                   "core.inputs": 16, "core.outputs": 4})
    pw = optical.program(rng.standard_normal((16, 4)), cfg, calibration=cal)
    np.testing.assert_array_equal(pw.bypass.channels, [3])


def test_dynamic_outlier_channels_are_dark_in_every_calibration_token():
    """Dynamic policy: the channels chosen over the whole calibration batch
    are zeroed before the capped readouts, as a call zeroes them: the windows
    are those of the plain machine calibrated on the batch with channel 3
    zeroed by hand."""
    rng, cal = _rare_outlier_batch()
    w = rng.standard_normal((16, 4))
    base = ideal(**{"outliers.threshold": 6.0, "calibration.max_tokens": 8, "adc.bits": 6,
                    "adc.full_scale": "calibrated", "core.inputs": 16, "core.outputs": 4})
    dynamic = optical.program(w, base.replace({"outliers.policy": "dynamic"}), calibration=cal)
    dark = cal.copy()
    dark[:, 3] = 0.0
    by_hand = optical.program(w, base.replace({"outliers.policy": "none"}), calibration=dark)
    np.testing.assert_array_equal(dynamic.adc_lo, by_hand.adc_lo)
    np.testing.assert_array_equal(dynamic.adc_hi, by_hand.adc_hi)
