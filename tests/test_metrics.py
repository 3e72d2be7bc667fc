"""Pair metrics, KL divergence of softmaxed outputs and per-column errors, against hand
calculations."""

import dataclasses
import math

import numpy as np
import pytest

from optical import metrics


def test_pair_metrics_by_hand():
    ref = np.array([[3.0, 0.0], [0.0, 4.0]], dtype=np.float32)  # |ref| = 5
    test = np.array([[3.0, 1.0], [0.0, 4.0]])  # error (0, 1, 0, 0): |err| = 1
    assert metrics.sqnr_db(ref, test) == pytest.approx(10 * math.log10(25))
    assert metrics.relative_error(ref, test) == pytest.approx(0.2)
    assert metrics.cosine(ref, test) == pytest.approx(25 / (5 * math.sqrt(26)))
    assert metrics.compare(ref, test) == (metrics.sqnr_db(ref, test), metrics.cosine(ref, test),
                                          metrics.relative_error(ref, test))
    # Limits: equal arrays, a zero reference, zeros on both sides.
    assert metrics.compare(ref, ref) == (math.inf, pytest.approx(1.0), 0.0)
    zero = np.zeros_like(ref)
    assert metrics.compare(zero, test) == (-math.inf, 0.0, math.inf)
    assert metrics.compare(zero, zero) == (math.inf, 1.0, 0.0)
    with pytest.raises(ValueError, match="shape mismatch"):
        metrics.compare(ref, test[:1])
    # Same size, other shape: a transposed result, or one with a batch axis.
    for other in (np.arange(6.0).reshape(3, 2), ref[None]):
        base = np.arange(6.0).reshape(2, 3) if other.size == 6 else ref
        with pytest.raises(ValueError, match="shape mismatch"):
            metrics.sqnr_db(base, other)
    # Empty arrays have no error to measure (not a perfect score).
    for metric in (metrics.sqnr_db, metrics.cosine, metrics.relative_error, metrics.compare,
                   metrics.max_abs_error):
        with pytest.raises(ValueError, match="empty"):
            metric(np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(ValueError, match="test contains NaN"):
        metrics.compare(ref, np.full_like(test, np.nan))


def test_cosine_stays_within_minus_one_and_one(rng):
    """Cauchy-Schwarz: |cos| <= 1, and a or -a against a is exactly +-1. The
    roundings of the three sums gave 1.0000000000000002 for np.ones(3) against
    itself (and for 14 of these 49 lengths), whose arccos is NaN."""
    for n in range(1, 50):
        for a in (np.ones(n), rng.standard_normal(n)):
            for b, sign in ((a, 1.0), (-a, -1.0)):
                for c in (metrics.cosine(a, b), metrics.compare(a, b)[1]):
                    assert -1.0 <= c <= 1.0
                    assert c == pytest.approx(sign, abs=1e-15)


def test_pair_metrics_hold_at_extreme_magnitudes(rng):
    # Scale-free metrics: the sums' squares must neither underflow (a claimed
    # exact match) nor overflow (NaN) at float64's extremes. A power-of-two
    # scale leaves every bit; 1e+-200 rounds the inputs, so agreement to 1e-12.
    ref = rng.standard_normal((40, 30))
    test = ref + 0.01 * rng.standard_normal((40, 30))
    expected = metrics.compare(ref, test)
    columns = metrics.column_errors(ref, test)
    for factor in (2.0**-700, 2.0**700):
        assert metrics.compare(ref * factor, test * factor) == expected
        np.testing.assert_array_equal(metrics.column_errors(ref * factor, test * factor).sqnr_db,
                                      columns.sqnr_db)
    # Subnormal arrays (2**-1060: the largest value too) round the inputs, but
    # scaling them back up is exact: the same metrics as those exact images
    # (the scale factor 2**1060 overflowed to inf, and every metric was NaN).
    for factor in (2.0**-1040, 2.0**-1060):
        tiny_ref, tiny_test = ref * factor, test * factor
        assert metrics.compare(tiny_ref, tiny_test) == metrics.compare(tiny_ref / factor,
                                                                       tiny_test / factor)
        np.testing.assert_array_equal(metrics.column_errors(tiny_ref, tiny_test).sqnr_db,
                                      metrics.column_errors(tiny_ref / factor,
                                                            tiny_test / factor).sqnr_db)
        assert metrics.compare(tiny_ref, tiny_test) == pytest.approx(expected, rel=1e-3)
    for factor in (1e-200, 1e200):
        assert metrics.compare(ref * factor, test * factor) == pytest.approx(expected, rel=1e-12)
        np.testing.assert_allclose(metrics.column_errors(ref * factor, test * factor).sqnr_db,
                                   columns.sqnr_db, rtol=1e-12)


def test_the_largest_magnitude_sets_the_scale_whatever_its_sign():
    """A huge negative value beside small positive ones: the scale comes from
    the largest magnitude, not the largest value (whose 1e-3 left -1e200 to
    overflow when squared, and the SQNR NaN). The error is 10 % of the
    signal: 20 dB, cosine 1 (to float64)."""
    ref = np.array([1e-3, -1e200])
    test = np.array([1e-3, -0.9e200])
    assert metrics.sqnr_db(ref, test) == pytest.approx(20.0, rel=1e-12)
    assert metrics.sqnr_db(-ref, -test) == pytest.approx(20.0, rel=1e-12)
    assert metrics.cosine(ref, test) == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(metrics.column_errors(ref[:, None], test[:, None]).sqnr_db,
                               [20.0], rtol=1e-12)


def test_the_scale_comes_from_both_arrays():
    """A test 1e160 times its reference: the scale is the larger array's,
    so the reference's squares go subnormal but not to zero. By hand: SQNR
    10 log10(5 / (5 (1e160 - 1)^2)) = -3200 dB, cosine 1, relative error
    ~1e160, per column too (not inf: the reference is not zero)."""
    ref, test = np.array([1.0, 2.0]), np.array([1e160, 2e160])
    sqnr, cosine, rel = metrics.compare(ref, test)
    assert sqnr == pytest.approx(-3200.0, rel=1e-6)
    assert cosine == pytest.approx(1.0, rel=1e-12) and rel == pytest.approx(1e160, rel=1e-6)
    columns = metrics.column_errors(ref[:, None], test[:, None])
    np.testing.assert_allclose(columns.relative_error, [1e160], rtol=1e-6)
    np.testing.assert_allclose(columns.sqnr_db, [-3200.0], rtol=1e-6)


def test_each_column_is_scaled_by_its_own_magnitude(rng):
    """A backlog audit: column_errors scaled every column by the whole
    array's largest magnitude, so a column 1e170 below another, 1 % wrong,
    read inf dB and relative error 0 (its squares underflowed to zero). By
    hand: 40 dB and 0.01, as the same column alone gives."""
    big = rng.standard_normal(50)
    small = 1e-170 * rng.standard_normal(50)
    ref = np.stack([big, small], axis=1)
    test = ref * np.array([1.001, 1.01])
    columns = metrics.column_errors(ref, test)
    np.testing.assert_allclose(columns.sqnr_db, [60.0, 40.0], rtol=1e-9)
    np.testing.assert_allclose(columns.relative_error, [0.001, 0.01], rtol=1e-9)
    alone = metrics.column_errors(small[:, None], test[:, 1:])
    assert alone.sqnr_db[0] == columns.sqnr_db[1]


def test_column_metrics_and_kl_do_not_depend_on_the_layout(rng):
    """Column sums and softmax sums along a strided axis add in another order:
    C and Fortran order (and a strided view) gave other last bits."""
    ref = rng.standard_normal((300, 257))
    test = ref + 0.01 * rng.standard_normal(ref.shape)
    columns = metrics.column_errors(ref, test)
    kl = metrics.kl_divergence(ref, test)
    for layout in (np.asfortranarray, lambda a: np.repeat(a, 2, axis=1)[:, ::2]):
        again = metrics.column_errors(layout(ref), layout(test))
        np.testing.assert_array_equal(again.sqnr_db, columns.sqnr_db)
        np.testing.assert_array_equal(again.relative_error, columns.relative_error)
        assert metrics.kl_divergence(layout(ref), layout(test)) == kl


@pytest.mark.parametrize("metric", [metrics.sqnr_db, metrics.cosine, metrics.relative_error,
                                    metrics.max_abs_error, metrics.column_errors,
                                    metrics.kl_divergence])
def test_a_masked_array_is_refused_not_read_without_its_mask(metric):
    """numpy.asarray drops a mask: the masked entries counted (an SQNR of
    0.002 dB where the unmasked entries agree exactly)."""
    ref = np.ma.masked_array([[1.0, 2.0, 100.0]], mask=[[False, False, True]])
    with pytest.raises(TypeError, match=r"reference(_logits)?: numpy.ma.MaskedArray, a "
                       r"numpy.ndarray subclass, is not supported.*\.filled"):
        metric(ref, np.array([[1.0, 2.0, 0.0]]))


def test_max_abs_error_by_hand():
    ref = [[1.0, 2.0], [3.0, 4.0]]
    test = [[1.0, 2.5], [3.0, 1.0]]  # errors ref - test: 0, -0.5, 0, 3
    assert metrics.max_abs_error(ref, test) == 3.0
    # Swapped, the largest error is -3: its size counts, not its sign.
    assert metrics.max_abs_error(test, ref) == 3.0
    assert metrics.max_abs_error(ref, ref) == 0.0
    # float32 operands are compared in float64: 2**24 - (-1) = 16777217 exactly,
    # which float32 arithmetic would round to 16777216.
    ref32 = np.array([[2.0**24, 0.5]], dtype=np.float32)
    test32 = np.array([[-1.0, 0.25]], dtype=np.float32)
    assert np.float32(ref32[0, 0]) - np.float32(test32[0, 0]) == np.float32(2.0**24)
    got = metrics.max_abs_error(ref32, test32)
    assert type(got) is float and got == 16777217.0
    # A difference beyond float64's largest is inf, without numpy's overflow
    # warning on the way (an error under -W error; a figures audit found it).
    assert metrics.max_abs_error([1e308, 0.0], [-1e308, 0.0]) == math.inf
    assert metrics.max_abs_error([1e308], [-7e307]) == 1.7e308  # (not an overflow)


def test_kl_divergence_of_a_two_class_softmax_by_hand():
    # softmax([0, ln 2]) = (1/3, 2/3); softmax([0, 0]) = (1/2, 1/2).
    ref = np.array([[0.0, math.log(2.0)]])
    test = np.array([[0.0, 0.0]])
    hand = (1 / 3) * math.log((1 / 3) / (1 / 2)) + (2 / 3) * math.log((2 / 3) / (1 / 2))
    assert metrics.kl_divergence(ref, test) == pytest.approx(hand, rel=1e-12)
    # Not symmetric: the reverse direction has its own value.
    reverse = 0.5 * math.log(0.5 / (1 / 3)) + 0.5 * math.log(0.5 / (2 / 3))
    assert metrics.kl_divergence(test, ref) == pytest.approx(reverse, rel=1e-12)


def test_kl_divergence_is_mean_over_rows_shift_invariant_and_stable():
    ref = np.array([[0.0, math.log(2.0)], [1.0, 1.0]])
    test = np.array([[0.0, 0.0], [1.0, 1.0]])  # second row identical: KL 0
    one = metrics.kl_divergence(ref[:1], test[:1])
    assert metrics.kl_divergence(ref, test) == pytest.approx(one / 2, rel=1e-12)
    # Softmax ignores a constant per row; huge logits must not overflow.
    big = metrics.kl_divergence(ref + 1e4, test - 3e4)
    assert big == pytest.approx(one / 2, rel=1e-9)
    assert metrics.kl_divergence(ref, ref) == 0.0
    # Logits spread past float64's largest: p = q = (1, 0, 0) to float64, so 0
    # by hand (it was NaN, -inf - -inf where p is 0).
    wide = np.array([[1e308, -1e308, 0.0]])
    assert metrics.kl_divergence(wide, wide) == 0.0
    assert metrics.kl_divergence(wide, np.array([[1e308, 0.0, -1e308]])) == 0.0
    # The softmax axis is selectable: transposed logits with axis=0.
    assert metrics.kl_divergence(ref.T, test.T, axis=0) == pytest.approx(one / 2, rel=1e-12)
    for bad in (None, 1.0, True):
        with pytest.raises(TypeError, match="axis: expected an integer axis"):
            metrics.kl_divergence(ref, test, axis=bad)


def test_kl_divergence_matches_a_direct_float64_sum(rng):
    ref = rng.standard_normal((7, 50)) * 3
    test = ref + 0.1 * rng.standard_normal((7, 50))
    p = np.exp(ref) / np.exp(ref).sum(axis=1, keepdims=True)
    q = np.exp(test) / np.exp(test).sum(axis=1, keepdims=True)
    direct = np.mean(np.sum(p * np.log(p / q), axis=1))
    assert metrics.kl_divergence(ref, test) == pytest.approx(direct, rel=1e-10)


def test_kl_divergence_bad_input():
    with pytest.raises(ValueError, match="shape mismatch"):
        metrics.kl_divergence(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="axis: 2 is out of range"):
        metrics.kl_divergence(np.zeros((2, 3)), np.zeros((2, 3)), axis=2)
    with pytest.raises(ValueError, match="NaN"):
        metrics.kl_divergence(np.array([[np.nan, 0.0]]), np.zeros((1, 2)))


def test_column_errors_by_hand():
    ref = np.array([[1.0, 2.0, 1.0], [3.0, 4.0, 0.0]])
    test = np.array([[1.0, 2.5, 2.0], [3.0, 4.0, 0.0]])
    ce = metrics.column_errors(ref, test)
    # col 0 exact; col 1: 20 / 0.25; col 2: 1 / 1.
    np.testing.assert_allclose(ce.sqnr_db, [math.inf, 10 * math.log10(80.0), 0.0])
    np.testing.assert_allclose(ce.relative_error, [0.0, math.sqrt(0.25 / 20), 1.0])
    assert ce.worst_sqnr_db == 0.0 and ce.worst_column == 2
    assert ce.median_sqnr_db == pytest.approx(10 * math.log10(80.0))
    # Leading axes are samples: a (2, 1, 3) array gives the same columns.
    again = metrics.column_errors(ref[:, None, :], test[:, None, :])
    np.testing.assert_array_equal(again.sqnr_db, ce.sqnr_db)
    # The total SQNR weighs columns by their energy; per-column values do not.
    assert metrics.sqnr_db(ref, test) == pytest.approx(10 * math.log10(31 / 1.25))


def test_column_errors_zero_reference_column():
    ce = metrics.column_errors(np.array([[0.0, 1.0]]), np.array([[0.5, 1.0]]))
    assert ce.sqnr_db[0] == -math.inf and ce.relative_error[0] == math.inf
    with pytest.raises(ValueError, match="column axis"):
        metrics.column_errors(np.float64(1.0), np.float64(1.0))


def test_pair_metrics_of_large_arrays_match_exact_sums(rng):
    """Past SUM_CHUNK elements the float64 sums run a chunk at a time (no
    float64 copy of the arrays): against exactly rounded sums (math.fsum) of
    the same float32 data, in C and Fortran order, and with a NaN anywhere."""
    ref = rng.standard_normal((300, 1000)).astype(np.float32)  # 4.6 chunks
    test = (ref + 0.01 * rng.standard_normal(ref.shape)).astype(np.float32)
    assert ref.size > 4 * metrics.SUM_CHUNK
    r, t = ref.ravel().astype(np.float64), test.ravel().astype(np.float64)
    signal, error = math.fsum(r * r), math.fsum((r - t) ** 2)
    cos = math.fsum(r * t) / math.sqrt(signal * math.fsum(t * t))
    for a, b in ((ref, test), (np.asfortranarray(ref), np.asfortranarray(test))):
        sqnr, cosine, rel = metrics.compare(a, b)
        assert sqnr == pytest.approx(10 * math.log10(signal / error), rel=1e-12)
        assert cosine == pytest.approx(cos, rel=1e-12)
        assert rel == pytest.approx(math.sqrt(error / signal), rel=1e-12)
        assert metrics.sqnr_db(a, b) == sqnr
    bad = test.copy()
    bad[-1, -1] = np.nan
    with pytest.raises(ValueError, match="test contains NaN"):
        metrics.sqnr_db(ref, bad)


NARROW_FLOATS = ["bfloat16", "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e3m4",
                 "float8_e4m3", "float8_e4m3b11fnuz", "float8_e4m3fn", "float8_e4m3fnuz",
                 "float8_e5m2", "float8_e5m2fnuz", "float8_e5m3fnu", "float8_e8m0fnu"]


@pytest.mark.parametrize("narrow", NARROW_FLOATS)
def test_every_narrow_float_format_is_its_values(narrow):
    """Each of ml_dtypes' narrow float formats holds 0.5, 1, 2 and 4 exactly
    (even e8m0, powers of two alone): against [1, 1, 2, 4] the error is 0.5 in
    one entry, so SQNR = 10 log10(22 / 0.25) and the largest error is 0.5."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(ml_dtypes, narrow):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {narrow}")
    ref = np.array([1.0, 1.0, 2.0, 4.0], dtype=np.float32)
    test = np.array([0.5, 1.0, 2.0, 4.0], dtype=np.float32).astype(getattr(ml_dtypes, narrow))
    assert metrics.sqnr_db(ref, test) == pytest.approx(10 * math.log10(22 / 0.25), rel=1e-12)
    assert metrics.max_abs_error(ref, test) == 0.5
    assert metrics.sqnr_db(test, ref) == pytest.approx(10 * math.log10(21.25 / 0.25), rel=1e-12)


@pytest.mark.parametrize("scale", [2.0**20, 2.0**-30])
def test_bfloat16_beyond_float16s_range_keeps_its_values(scale):
    """bfloat16 has float32's exponent range: 2**20 (past float16's 65504) and
    2**-30 (below float16's smallest subnormal) are exact, as are 1.5 times
    them. Reference [1, 1.5] x scale, test [1, 1] x scale: SQNR = 10 log10(
    (1 + 2.25) / 0.25) = 10 log10(13) at either scale."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ref = np.array([1.0, 1.5], dtype=np.float32) * np.float32(scale)
    test = (np.array([1.0, 1.0], dtype=np.float32) * np.float32(scale)).astype(ml_dtypes.bfloat16)
    assert metrics.sqnr_db(ref, test) == pytest.approx(10 * math.log10(13), rel=1e-12)
    assert metrics.max_abs_error(ref, test) == pytest.approx(0.5 * scale, rel=1e-12)


def test_a_structured_array_is_refused_not_read_as_floats():
    """A structured (void) array with one float32 field is not a narrow float:
    refused with the argument's name, not silently cast to its field's values."""
    test = np.zeros(3, dtype=[("a", np.float32)])
    with pytest.raises(TypeError, match=r"^test: dtype .* is not supported; expected real"):
        metrics.sqnr_db(np.ones(3), test)
    with pytest.raises(TypeError, match=r"^reference: dtype .* is not supported"):
        metrics.max_abs_error(test, np.ones(3))


@pytest.mark.parametrize("metric", [metrics.sqnr_db, metrics.cosine, metrics.relative_error,
                                    metrics.max_abs_error, metrics.column_errors,
                                    metrics.kl_divergence])
@pytest.mark.parametrize("narrow", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_narrow_floats_are_their_exact_values(metric, narrow, rng):
    """bfloat16 and float8 arrays (as JAX hands them to numpy) give the metric
    of their exact values, which float32 holds."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ref = rng.standard_normal((6, 5)).astype(np.float32)
    test = (ref + 0.1 * rng.standard_normal(ref.shape)).astype(getattr(ml_dtypes, narrow))
    got, expected = metric(ref, test), metric(ref, test.astype(np.float32))
    if isinstance(expected, metrics.ColumnErrors):
        got, expected = dataclasses.astuple(got), dataclasses.astuple(expected)
    np.testing.assert_array_equal(got, expected)
    assert np.all(np.isfinite(expected)) and not np.all(np.asarray(expected) == 0)


@pytest.mark.parametrize("metric", [metrics.sqnr_db, metrics.cosine, metrics.relative_error,
                                    metrics.max_abs_error, metrics.column_errors,
                                    metrics.kl_divergence])
def test_non_real_inputs_are_refused_not_cast(metric):
    real = np.ones((2, 3))
    with pytest.raises(TypeError, match="test: dtype complex128 is not supported"
                       if metric is not metrics.kl_divergence else "test_logits: dtype complex"):
        metric(real, real + 1j)
    with pytest.raises(TypeError, match=r"reference(_logits)?: dtype <U1 is not supported"):
        metric(np.array([["1", "2", "3"]] * 2), real)
    # Lists of numbers are real numbers: the same result as their float array.
    if metric not in (metrics.column_errors,):
        listed = [[1, 2, 3], [4, 5, 6]]
        assert metric(listed, real) == metric(np.array(listed, dtype=float), real)


def test_pair_metrics_do_not_depend_on_the_blas_thread_count(rng):
    """np.dot splits long sums across OpenBLAS threads (the last bits then
    follow the thread count: a sweep's workers run one thread); the sums here
    are numpy's pairwise ones."""
    from threadpoolctl import threadpool_limits

    ref = rng.standard_normal(300_000)
    out = ref + 0.01 * rng.standard_normal(ref.size)
    funcs = (metrics.sqnr_db, metrics.cosine, metrics.relative_error)
    with threadpool_limits(limits=1, user_api="blas"):
        one = [f(ref, out) for f in funcs]
    with threadpool_limits(limits=2, user_api="blas"):
        two = [f(ref, out) for f in funcs]
    assert one == two
