import os
import signal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

# Timing deadlines make property tests flaky on a loaded 2-core machine; the
# examples themselves are what is tested. Derandomized: the same examples on
# every run and machine, so CI's verdict is the one a developer reproduces.
settings.register_profile("optical", deadline=None, derandomize=True)
settings.load_profile("optical")

#: The tests name the bundled models as the README does (``models/llama-3.2-1b``),
#: relative to the checkout: run from anywhere (an IDE, ``pytest /path/to/tests``),
#: they run from its root, as ``.ci/run`` does.
ROOT = Path(__file__).resolve().parents[1]

# The suite tests what Ctrl-C does: started with SIGINT ignored (a background
# job of a shell script, `make test &`), Python installs no handler, and
# neither would the processes the tests start; give it the one Python gives.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def _run_from_the_checkout_root():
    """Into the checkout's root for the tests, and back after (pytest has
    resolved its own relative paths, --basetemp, --junitxml, by then)."""
    previous = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(previous)


@pytest.fixture(autouse=True, scope="session")
def _dask_scratch_in_pytest_tmp(tmp_path_factory):
    """Dask's clusters keep their scratch space (and its lock files) in the
    session's temporary directory, not in $TMPDIR, where they were left."""
    os.environ.setdefault("DASK_TEMPORARY_DIRECTORY", str(tmp_path_factory.mktemp("dask")))
    yield

#: Relative Frobenius error allowed for "exact to float rounding" results. The
#: offset encodings subtract a large pedestal, which costs a few bits on the
#: Gaussian data these tolerances are used with (more with a large crest
#: factor: test_ideal_offset_floor_follows_the_crest_factor).
EXACT_RTOL = {np.float32: 2e-4, np.float64: 1e-11}


@pytest.fixture
def rng():
    return np.random.default_rng(20261202)
