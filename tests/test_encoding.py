import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from optical.physics import encoding

_VALUES = hnp.arrays(np.float64, st.integers(1, 64),
                     elements=st.floats(-1, 1, allow_nan=False, allow_subnormal=False))


@pytest.mark.parametrize("scheme", encoding.SCHEMES)
@given(v=_VALUES)
def test_encode_gives_levels_in_unit_interval_and_decodes_back(scheme, v):
    u = encoding.encode(v, scheme)
    assert u.shape == (encoding.n_rails(scheme), *v.shape)
    assert np.all((u >= 0) & (u <= 1))
    np.testing.assert_allclose(encoding.decode(u, scheme), v, rtol=0, atol=2e-16)


@given(v=_VALUES)
def test_split_rails_have_disjoint_support(v):
    plus, minus = encoding.encode(v, "split")
    assert not np.any((plus > 0) & (minus > 0))


@pytest.mark.parametrize("scheme", encoding.SCHEMES)
@given(a=_VALUES.map(np.abs), v=_VALUES)
def test_dot_products_decode_linearly_from_rail_dot_products(scheme, a, v):
    n = min(a.size, v.size)
    a, v = a[:n], v[:n]
    coeffs, const = encoding.rail_coefficients(scheme)
    rails = encoding.encode(v, scheme)
    decoded = sum(c * np.dot(a, r) for c, r in zip(coeffs, rails, strict=True)) + const * a.sum()
    assert decoded == pytest.approx(np.dot(a, v), abs=1e-12)


def test_offset_and_split_values_by_hand():
    v = np.array([-1.0, -0.5, 0.0, 0.25, 1.0])
    np.testing.assert_array_equal(encoding.encode(v, "offset")[0], [0, 0.25, 0.5, 0.625, 1])
    np.testing.assert_array_equal(encoding.encode(v, "split"),
                                  [[0, 0, 0, 0.25, 1], [1, 0.5, 0, 0, 0]])


def test_bad_scheme_and_out_of_range_values():
    with pytest.raises(ValueError, match="unknown encoding 'unary'"):
        encoding.encode(np.zeros(3), "unary")
    for scheme in encoding.SCHEMES:
        # Below -1 too (offset would give a negative level), and the first
        # float past either bound.
        for bad in (1.5, -1.5, np.nan, np.nextafter(1.0, 2.0), np.nextafter(-1.0, -2.0)):
            with pytest.raises(ValueError, match=r"\[-1, 1\]"):
                encoding.encode(np.array([0.0, bad]), scheme)
    for scheme, rails in (("split", 1), ("split", 3), ("offset", 2)):
        expected = encoding.n_rails(scheme)
        with pytest.raises(ValueError, match=f"expected {expected} rails on axis 0 for "
                                             f"'{scheme}'"):
            encoding.decode(np.zeros((rails, 3)), scheme)


def test_encoding_keeps_dtype():
    for dtype in (np.float32, np.float64):
        for scheme in encoding.SCHEMES:
            assert encoding.encode(np.zeros(3, dtype), scheme).dtype == dtype
