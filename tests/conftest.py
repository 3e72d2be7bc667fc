import numpy as np
import pytest
from hypothesis import settings

# Timing deadlines make property tests flaky on a loaded 2-core machine; the
# examples themselves are what is tested.
settings.register_profile("optical", deadline=None)
settings.load_profile("optical")

#: Relative Frobenius error allowed for "exact to float rounding" results. The
#: offset encodings subtract a large pedestal, which costs a few bits on the
#: Gaussian data these tolerances are used with (more with a large crest
#: factor: test_ideal_offset_floor_follows_the_crest_factor).
EXACT_RTOL = {np.float32: 2e-4, np.float64: 1e-11}


@pytest.fixture
def rng():
    return np.random.default_rng(20261202)
