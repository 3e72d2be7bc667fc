import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from optical.physics import converters


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 8, 10])
def test_level_quantiser_has_exactly_2_pow_bits_levels(bits):
    u = np.linspace(-0.2, 1.2, 200_001)
    q = converters.quantize_levels(u, bits)
    assert np.unique(q).size == 2**bits
    inside = (u >= 0) & (u <= 1)
    step = 1 / (2**bits - 1)
    assert np.max(np.abs(q[inside] - u[inside])) <= step / 2 + 1e-12
    # Clipping: out-of-range drive saturates at the ends.
    assert np.all(q[u < 0] == 0) and np.all(q[u > 1] == 1)


def test_level_quantiser_none_is_identity_and_bad_bits_refused():
    u = np.linspace(0, 1, 11)
    assert converters.quantize_levels(u, None) is u
    for bits in (0, 25, 2.0, True):
        with pytest.raises(ValueError, match="bits"):
            converters.quantize_levels(u, bits)


@given(u=hnp.arrays(np.float64, st.integers(1, 50), elements=st.floats(0, 1)),
       bits=st.integers(1, 16))
def test_level_quantiser_is_idempotent_and_monotone(u, bits):
    q = converters.quantize_levels(u, bits)
    np.testing.assert_array_equal(converters.quantize_levels(q, bits), q)
    order = np.argsort(u, kind="stable")
    assert np.all(np.diff(q[order]) >= 0)


def test_top_code_is_the_largest_of_2_pow_bits_codes_and_0_for_an_ideal_converter():
    # The one spelling the kernels, windows and quantisers share.
    for bits in (1, 8, 16, 24):
        assert converters.top_code(bits) == converters.top_code(np.int64(bits)) == 2**bits - 1
    assert converters.top_code(None) == 0
    for bad in (0, 25, 8.0, True):
        with pytest.raises(ValueError, match="bits: .* is not valid"):
            converters.top_code(bad)
    # An ideal ADC has no code width: said so, not a bare TypeError from ``<<``.
    for bad in (None, 0):
        with pytest.raises(ValueError, match=rf"^bits: {bad} is not valid; valid: integer in "
                                             r"\[1, 24\] \(an ideal ADC, None, has no code"):
            converters.adc_step(0.0, 1.0, bad)


def test_transmission_spans_min_to_one():
    t = converters.transmission(np.array([0.0, 0.5, 1.0]), 0.02)
    np.testing.assert_allclose(t, [0.02, 0.51, 1.0])
    for closed in (1.0, -0.1):  # no contrast, or negative light
        with pytest.raises(ValueError, match="min_transmission"):
            converters.transmission(np.zeros(2), closed)


@pytest.mark.parametrize("bits", [1, 3, 6, 8])
def test_adc_levels_error_and_clipping(bits):
    lo, hi = -2.0, 3.0
    r = np.linspace(-4, 5, 300_001)
    q, clipped = converters.adc_quantize(r, lo, hi, bits)
    assert np.unique(q).size == 2**bits
    step = (hi - lo) / (2**bits - 1)
    inside = (r >= lo) & (r <= hi)
    assert np.max(np.abs(q[inside] - r[inside])) <= step / 2 + 1e-12
    assert np.all(q[r < lo] == lo) and np.all(q[r > hi] == pytest.approx(hi))
    expect_clipped = (r < lo - step / 2) | (r > hi + step / 2)
    # Only exact half-step ties may disagree.
    assert np.count_nonzero(clipped != expect_clipped) <= 2
    assert not clipped[inside].any()


@given(r=hnp.arrays(np.float64, st.integers(1, 60), elements=st.floats(-3, 3)),
       lo=st.floats(-1, 1), width=st.floats(1e-3, 2), bits=st.integers(1, 16))
def test_adc_quantiser_properties_on_any_window(r, lo, width, bits):
    """An acceptance audit: the ADC had only fixed-grid tests. On any window
    and readouts: every value is a code of the window (``lo + code * step``,
    ``code`` an integer in 0..2**bits-1), within half a step of a readout
    inside the window, idempotent and monotone, and a readout is flagged as
    clipped exactly when it lies more than half a step outside the window
    (ties aside)."""
    hi = lo + width
    q, clipped = converters.adc_quantize(r, lo, hi, bits)
    top = 2**bits - 1
    step = (hi - lo) / top
    code = (q - lo) / step
    np.testing.assert_allclose(code, np.rint(code), atol=1e-6)
    assert np.all((np.rint(code) >= 0) & (np.rint(code) <= top))
    inside = (r >= lo) & (r <= hi)
    assert np.all(np.abs(q[inside] - r[inside]) <= step / 2 * (1 + 1e-9) + 1e-12)
    np.testing.assert_array_equal(converters.adc_quantize(q, lo, hi, bits)[0], q)
    order = np.argsort(r, kind="stable")
    assert np.all(np.diff(q[order]) >= 0)
    margin = np.maximum(lo - r, r - hi) - step / 2  # > 0: beyond the half-step guard
    decided = np.abs(margin) > 1e-9 * (1 + abs(lo) + width)
    np.testing.assert_array_equal(clipped[decided], (margin > 0)[decided])


def test_adc_zero_width_window_returns_its_level():
    q, clipped = converters.adc_quantize(np.array([0.0, 1.0]), 0.5, 0.5, 8)
    np.testing.assert_array_equal(q, [0.5, 0.5])
    assert not clipped.any()


def test_adc_inverted_window_is_refused():
    # It returned lo everywhere with nothing flagged as clipped.
    with pytest.raises(ValueError, match=r"lo, hi: .* lo = 1.0 > hi = 0.0"):
        converters.adc_quantize(np.array([0.0, 0.5, 1.0]), 1.0, 0.0, 4)
    with pytest.raises(ValueError, match=r"lo, hi: .* lo = 1.0 > hi"):  # by one ulp
        converters.adc_quantize(np.zeros(3), 1.0, np.nextafter(1.0, 0.0), 4)
    lo, hi = np.array([0.0, 2.0, 0.0]), np.array([1.0, 1.0, 0.0])
    with pytest.raises(ValueError, match=r"lo = 2.0 > hi = 1.0 \(in 1 window"):
        converters.adc_quantize(np.zeros((5, 3)), lo, hi, 4)


def test_adc_ideal_is_identity():
    r = np.array([-1e9, 0.3, 1e9])
    q, clipped = converters.adc_quantize(r, 0.0, 1.0, None)
    np.testing.assert_array_equal(q, r)
    assert not clipped.any()


@pytest.mark.parametrize(("bits", "enob"), [(8, 6.5), (8, 4.0), (6, 5.0), (10, 7.3)])
def test_enob_noise_gives_the_error_variance_of_an_ideal_enob_converter(bits, enob):
    """A full-range uniform input through ADC + ENOB noise has total error
    variance step_enob**2 / 12 with step_enob = step * 2**(bits - enob)."""
    lo, hi = 0.0, 1.0
    rng = np.random.default_rng(7)
    r = rng.uniform(0.25, 0.75, 400_000)  # well inside: no clipping
    sigma = converters.enob_noise_std(lo, hi, bits, enob)
    q, clipped = converters.adc_quantize(r + sigma * rng.standard_normal(r.size), lo, hi, bits)
    assert not clipped.any()
    step = (hi - lo) / (2**bits - 1)
    expected = (step * 2.0 ** (bits - enob)) ** 2 / 12
    assert np.var(q - r) == pytest.approx(expected, rel=0.02)


def test_enob_equal_to_or_above_the_bits_adds_no_noise():
    # No converter beats its own quantisation: an ENOB at or above the bits
    # is an ideal converter (no added noise, and no NaN).
    for enob in (8.0, 8.25, 12.0, None):
        assert converters.enob_noise_std(0.0, 1.0, 8, enob) == 0.0


def test_quantisers_keep_dtype():
    for dtype in (np.float32, np.float64):
        u = np.linspace(0, 1, 7, dtype=dtype)
        assert converters.quantize_levels(u, 4).dtype == dtype
        assert converters.transmission(u, 0.1).dtype == dtype
        assert converters.adc_quantize(u, 0.0, 1.0, 4)[0].dtype == dtype
        assert converters.adc_step(u[:1], u[1:2], 6).dtype == dtype
        # ENOB noise is float64 with and without an ENOB loss (a style audit
        # found float32 windows gave float64 with one, float32 without)
        for enob in (None, 5.5, 6.0):
            assert converters.enob_noise_std(u[:1], u[1:2], 6, enob).dtype == np.float64, enob
    # float16 cannot hold 2**16 - 1 (inf: every level NaN at 16 bits), nor
    # resolve a step at 11: refused, not rounded wrongly.
    with pytest.raises(TypeError, match="u: dtype float16 is not supported"):
        converters.quantize_levels(np.zeros(3, np.float16), 16)


def test_zero_width_window_flags_nothing_however_far_the_readout():
    r = np.array([-3.0, 0.0, 0.49, 0.51, 2.0, 100.0])
    q, clipped = converters.adc_quantize(r, 0.5, 0.5, 8)
    np.testing.assert_array_equal(q, np.full(r.shape, 0.5))
    assert not clipped.any()
