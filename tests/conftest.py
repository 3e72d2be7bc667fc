import os
import shutil
import signal
import tempfile
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


#: The JAX compilation cache directory this run made (the controller's).
_JAX_CACHE = pytest.StashKey[str]()

#: The LLVM optimisation level XLA compiles the suite's programs at: 1, not
#: XLA's default (3). Compiling is most of the JAX tests' time (~600 of the
#: suite's ~1,500 s of test time went to XLA's backend compile): at level 1
#: test_kernels_jax.py runs in 145 s against 224 s at the default (the
#: whole suite in ~600 s against ~720 s), with the same bits wherever
#: checked (every preset, Poisson and exact passes, both dtypes): level 0
#: would save a little more but changes the last bit of 40-90% of the
#: outputs (it contracts no multiply-adds), so the suite would test
#: programs no user runs.
#: test_the_suites_xla_level_computes_the_bits_of_xla_s_default checks the
#: bits against a process at the default level. A level the user's own
#: XLA_FLAGS names is used as set.
XLA_TEST_LEVEL = "--xla_backend_optimization_level=1"

#: The XLA_FLAGS the run started with (None: unset), put back at its end.
_XLA_FLAGS = pytest.StashKey[str | None]()


def _with_test_level(flags: str) -> str:
    if "xla_backend_optimization_level" in flags:
        return flags
    return f"{flags} {XLA_TEST_LEVEL}".strip()


def pytest_configure(config):
    """The controller's environment, which its xdist workers and the processes
    the tests start inherit: XLA's optimisation level (:data:`XLA_TEST_LEVEL`)
    and the run's JAX compilation cache (:func:`_jax_cache`)."""
    if hasattr(config, "workerinput"):
        return
    config.stash[_XLA_FLAGS] = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = _with_test_level(os.environ.get("XLA_FLAGS", ""))
    _jax_cache(config)


def _jax_cache(config):
    """One JAX compilation cache on disk for the whole run, its xdist workers
    and the processes the tests start: JAX compiles each new pass (2-5 s on
    the CPU) once per process, and the suite's processes, and its tests'
    fresh ``jax.jit`` wrappers, compile many of the same programs (with the
    cache, the four JAX-heavy test files ran in 303 s against 373 s on two
    workers). The executables are the ones compiled, so the bits are. Made
    by the controller before it starts the workers, which inherit it;
    removed at its end. A JAX_COMPILATION_CACHE_DIR of the user's own is
    used as set."""
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    path = tempfile.mkdtemp(prefix="optical-tests-jax-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # every program
    config.stash[_JAX_CACHE] = path


def pytest_unconfigure(config):
    if _XLA_FLAGS in config.stash:
        previous = config.stash[_XLA_FLAGS]
        if previous is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = previous
    path = config.stash.get(_JAX_CACHE, None)
    if path is not None:
        os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
        os.environ.pop("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", None)
        shutil.rmtree(path, ignore_errors=True)


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
