import numpy as np
import pytest

#: Relative Frobenius error allowed for "exact to float rounding" results. The
#: offset encodings subtract a large pedestal, which costs a few bits.
EXACT_RTOL = {np.float32: 2e-4, np.float64: 1e-11}


@pytest.fixture
def rng():
    return np.random.default_rng(20261202)
