"""The numba backend against the numpy reference: the same random numbers, the
same deterministic physics, the same noise laws, and results that depend on
nothing but (x, w, config, seed)."""

import importlib.util
import math
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import numba
import numpy as np
import pytest
from scipy import stats

import optical
from optical import _rng, kernels, metrics
from optical.kernels import _fastpath, numba_backend
from optical.kernels import _rng_numba as rng_nb
from optical.quant import Tiling

from .configs import ENCODINGS, ideal, noisy
from .reference_loops import reference_matmul

# --------------------------------------------------------------------------- #
# The random numbers
# --------------------------------------------------------------------------- #


def test_numba_draws_the_reference_numbers():
    idx = (np.arange(100_000, dtype=np.uint64) * np.uint64(7919)) ^ np.uint64(2**40 + 3)
    key = _rng.stream_key(5, _rng.STREAMS["read"])
    out = np.empty(idx.size)
    rng_nb.uniform_array(key, idx, out)
    np.testing.assert_array_equal(out, _rng.uniform(key, idx))
    rng_nb.normal_array(key, idx, out)
    np.testing.assert_allclose(out, _rng.normal(key, idx), rtol=0, atol=1e-13)
    lam = np.random.default_rng(1).uniform(0, 40, idx.size)
    lam[:200] = [0.0, 9.99, 10.0, 1e6] * 50
    rng_nb.poisson_array(np.uint64(5), np.uint64(1), idx, lam, out)
    np.testing.assert_array_equal(out, _rng.poisson(5, 1, idx, lam))


@pytest.mark.parametrize("lam", [3e18, 1e19, 1e25])
def test_numba_poisson_keeps_huge_means(lam):
    # Past 2**63 an integer floor wraps negative; a draw stays near its mean.
    idx = np.arange(1000, dtype=np.uint64)
    out = np.empty(idx.size)
    rng_nb.poisson_array(np.uint64(5), np.uint64(1), idx, np.full(idx.size, lam), out)
    assert np.all(np.abs(out - lam) < 10 * math.sqrt(lam))
    assert abs(out.mean() - lam) < 0.5 * math.sqrt(lam)


def test_numba_draws_the_reference_counts_past_the_normal_law_threshold():
    # Past POISSON_NORMAL_ABOVE a count is lam + sqrt(lam) z rounded to a
    # whole number, a dark deviation sqrt(lam) z rounded to one whatever
    # lam: both show z's last bits, so the reference draws z with these
    # kernels' own polynomials. Means from 4e9 to 1e30, and the edges.
    idx = (np.arange(100_000, dtype=np.uint64) * np.uint64(7919)) ^ np.uint64(2**40 + 3)
    lam = 10 ** np.random.default_rng(2).uniform(9.6, 30, idx.size)
    lam[:8] = [2.0**32, np.nextafter(2.0**32, np.inf), 2.0**52 - 0.5, 2.0**52, 2.0**53,
               1e14, 1e16, 1e30]
    out = np.empty(idx.size)
    for deviation in (False, True):
        rng_nb.poisson_array(np.uint64(5), np.uint64(2), idx, lam, out, deviation)
        np.testing.assert_array_equal(out, _rng.poisson(5, 2, idx, lam, deviation=deviation))


@pytest.mark.parametrize("dark", [1e14, 1e16, 1e30])
def test_poisson_dark_noise_keeps_its_variance_at_huge_means(dark):
    """Dark counts of huge means (DetectorConfig allows 1e30) keep the
    Poisson variance, and exact mode draws them bit for bit as the
    reference: a balanced pair of rails read out twice (split inputs) adds
    4 D / p**2 to each output (1.42 times it at 1e16 when PTRS's float64
    acceptance test cancelled)."""
    tokens = 20_000
    x = np.ones((tokens, 16))
    w = np.full((16, 2), 0.5)
    w[0] = 1.0
    cfg = ideal(**{"source.photons_per_mac": 1.0, "encoding.inputs": "split",
                   "detector.dark_electrons": dark, "core.inputs": 16})
    y = optical.matmul(x, w, cfg, seed=3, backend="numpy")
    theory = 4 * dark  # shot noise, x @ w / p = 10, is far below
    assert np.all(np.abs(y.mean(axis=0) - x[0] @ w) < 5 * np.sqrt(theory / tokens))
    np.testing.assert_allclose(y.var(axis=0) / theory, 1.0, rtol=0, atol=5 * np.sqrt(2 / tokens))
    np.testing.assert_array_equal(optical.matmul(x, w, cfg, seed=3, backend="numba", exact=True),
                                  y)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_poisson_shot_noise_at_huge_photon_counts_through_matmul(rng, backend):
    # Relative shot noise 1/sqrt(mean): at 1e20 photons per MAC the ideal
    # machine is exact to float64 rounding on every backend, through the
    # kernels that inline the generator, not only the generator itself.
    cfg = ideal().replace({"detector.shot_noise": "poisson", "source.photons_per_mac": 1e20})
    x = rng.standard_normal((8, 40))
    w = rng.standard_normal((40, 24))
    y = optical.matmul(x, w, cfg, seed=0, backend=backend)
    assert metrics.sqnr_db(x @ w, y) > 100


def _jitted_modules() -> dict[str, Path]:
    """The package's modules that define numba functions, by import name."""
    root = Path(optical.__file__).parent
    return {".".join(("optical", *path.relative_to(root).with_suffix("").parts)): path
            for path in sorted(root.rglob("*.py")) if "nb.njit" in path.read_text()}


def test_cached_kernels_record_the_modules_they_compile_in():
    """numba checks a cached kernel against its own file only: a module whose
    kernels call numba functions of another module records that module's
    digest (``DEPENDENCY_SHA256``), so that editing it changes this file too
    and the stale kernels are rebuilt."""
    import ast
    import hashlib
    import importlib

    modules = _jitted_modules()
    assert "optical.kernels._numba" in modules and "optical.kernels._rng_numba" in modules
    for name, path in modules.items():
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {f"{node.module}.{alias.name}" for alias in node.names}
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        needed = {modules[dep].name: hashlib.sha256(
                      modules[dep].read_bytes().replace(b"\r\n", b"\n")).hexdigest()[:16]
                  for dep in imported & set(modules) if dep != name}
        recorded = getattr(importlib.import_module(name), "DEPENDENCY_SHA256", {})
        assert recorded == needed, (
            f"{path.name}: set DEPENDENCY_SHA256 = {needed!r} (the digests of the jitted "
            "modules it imports; numba would otherwise keep stale cached kernels)")


def test_fast_normal_pairs_are_standard_normal_and_independent():
    n = 400_000
    out = np.empty(n, dtype=np.float32)
    key = _rng.stream_key(9, 6)
    rng_nb.normal_pairs_range(key, np.uint64(1000), out)
    for z in (out[0::2], out[1::2]):
        assert stats.kstest(z, "norm").pvalue > 1e-4
        assert abs(z.mean()) < 5 / math.sqrt(z.size)
        assert z.var() == pytest.approx(1.0, abs=5 * math.sqrt(2 / z.size))
    assert abs(np.corrcoef(out[0::2], out[1::2])[0, 1]) < 5 / math.sqrt(n / 2)
    # The pair is Box-Muller's cosine and sine of the reference's uniforms.
    bits = _rng._bits(key, np.arange(1000, 1000 + n // 2, dtype=np.uint64))
    u1 = ((bits >> np.uint64(32)).astype(np.float64) + 1) * 2.0**-32
    u2 = (bits & _rng._U32).astype(np.float64) * 2.0**-32
    radius = np.sqrt(-2 * np.log(u1))
    np.testing.assert_allclose(out[0::2], radius * np.cos(2 * np.pi * u2), rtol=0, atol=5e-6)
    np.testing.assert_allclose(out[1::2], radius * np.sin(2 * np.pi * u2), rtol=0, atol=5e-6)


# --------------------------------------------------------------------------- #
# Deterministic physics: agree with the reference to float rounding
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("inputs", "weights"), ENCODINGS)
def test_ideal_machine_is_exact(rng, dtype, inputs, weights):
    x = rng.standard_normal((2, 9, 150)).astype(dtype)
    w = rng.standard_normal((150, 70)).astype(dtype)
    cfg = ideal(**{"encoding.inputs": inputs, "encoding.weights": weights,
                   "core.inputs": 64, "core.outputs": 32})
    for exact in (False, True):
        y = optical.matmul(x, w, cfg, seed=0, backend="numba", exact=exact)
        assert y.dtype == dtype and y.shape == (2, 9, 70)
        truth = x.astype(np.float64) @ w.astype(np.float64)
        assert metrics.relative_error(truth, y) < {np.float32: 2e-4, np.float64: 1e-11}[dtype]


@pytest.mark.parametrize(("inputs", "weights"), ENCODINGS)
@pytest.mark.parametrize("balanced", [True, False])
def test_quantised_machine_matches_reference_and_loops(rng, inputs, weights, balanced):
    x = rng.standard_normal((6, 70))
    x[2] = 0.0  # an all-zero token: exactly 0 out (offset rails would decode their ADC error)
    w = rng.standard_normal((70, 23))
    cfg = ideal(**{"encoding.inputs": inputs, "encoding.weights": weights,
                   "detector.balanced": balanced, "dac.bits": 5, "mask.bits": 4,
                   "adc.bits": 6, "mask.contrast_ratio": 20.0, "adc.headroom": 2.0,
                   "core.inputs": 32, "core.outputs": 10})
    truth = reference_matmul(x, w, cfg)
    reference = optical.matmul(x, w, cfg, seed=0, backend="numpy")
    for exact in (False, True):
        y = optical.matmul(x, w, cfg, seed=0, backend="numba", exact=exact)
        for other in (truth, reference):
            # Balanced rails subtracted before (fast) or after (exact) the GEMM
            # round differently, so an ADC code could move where a readout sits
            # within rounding of a code boundary; none of these readouts does.
            close = np.isclose(y, other, rtol=1e-9, atol=1e-9 * np.abs(other).max())
            assert close.all(), f"{(~close).sum()} of {close.size} differ"
        assert metrics.sqnr_db(truth, y) > 40
    # Exact mode runs the reference's GEMMs and codes; only the decoding's
    # float operations differ in order (offset weights: a few ulps).
    np.testing.assert_allclose(optical.matmul(x, w, cfg, seed=0, backend="numba", exact=True),
                               reference, rtol=0, atol=1e-13 * np.abs(reference).max())


# --------------------------------------------------------------------------- #
# Under noise: exact mode draw for draw, fast mode in distribution
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("shot", ["gaussian", "poisson"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exact_mode_reproduces_the_reference_under_noise(rng, shot, dtype):
    """Draw for draw, and the same GEMMs: every output bit for bit (a readout
    within rounding of a code boundary could move a code; none here does),
    and the same conversions clipped (a tight window: some 2% clip)."""
    x = rng.standard_normal((40, 150)).astype(dtype)
    w = rng.standard_normal((150, 50)).astype(dtype)
    cfg = noisy(**{"detector.shot_noise": shot, "detector.dark_electrons": 20.0,
                   "adc.headroom": 2.0})
    reference, ref_stats = optical.matmul(x, w, cfg, seed=4, backend="numpy",
                                          return_stats=True)
    y, st = optical.matmul(x, w, cfg, seed=4, backend="numba", exact=True, return_stats=True)
    np.testing.assert_array_equal(y, reference)
    assert st.detected_photons == pytest.approx(ref_stats.detected_photons, rel=1e-6)
    assert st.clipped_fraction == ref_stats.clipped_fraction > 0.005


def test_iris_like_as_deployed_runs_on_numba(rng):
    """Calibrated ADC windows, static outlier bypass, lens crosstalk and
    pre-distortion: everything lives in the programmed weights, which the
    numba backend reads as the reference does."""
    x = rng.standard_normal((64, 256)).astype(np.float32)
    x[:, 7] *= 40  # an outlier channel for the bypass
    w = rng.standard_normal((256, 96)).astype(np.float32)
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 128, "core.outputs": 64})
    pw = optical.program(w, cfg, calibration=x[:32])
    assert pw.bypass is not None
    ref, ref_stats = optical.matmul(x, pw, cfg, seed=2, backend="numpy", return_stats=True)
    y, st = optical.matmul(x, pw, cfg, seed=2, backend="numba", exact=True, return_stats=True)
    np.testing.assert_array_equal(y, ref)
    assert st.clipped_fraction == ref_stats.clipped_fraction
    assert st.digital_channels == ref_stats.digital_channels > 0
    fast = optical.matmul(x, pw, cfg, seed=2, backend="numba")
    truth = x.astype(np.float64) @ w
    assert abs(metrics.sqnr_db(truth, fast) - metrics.sqnr_db(truth, ref)) < 1.0


def _samples(x, w, cfg, backend, seeds=30, copies=300, **kw):
    xs = np.broadcast_to(x, (copies, *x.shape)).copy()
    return np.concatenate([optical.matmul(xs, w, cfg, seed=s, backend=backend, **kw)
                           for s in range(seeds)])


@pytest.mark.parametrize("inputs", ["offset", "split"])
def test_fast_mode_has_the_reference_noise_distribution(rng, inputs):
    """Mean, variance and shape (two-sample KS) of every output's noise agree."""
    x = rng.standard_normal((2, 96))
    w = rng.standard_normal((96, 6))
    cfg = noisy(**{"encoding.inputs": inputs, "adc.bits": 10, "core.inputs": 32})
    fast = _samples(x, w, cfg, "numba")  # 9000 samples per output
    ref = _samples(x, w, cfg, "numpy", seeds=30, copies=300)
    n = fast.shape[0]
    sd = ref.std(axis=0)
    assert np.all(np.abs(fast.mean(axis=0) - ref.mean(axis=0)) < 5 * sd * math.sqrt(2 / n))
    ratio = fast.var(axis=0) / ref.var(axis=0)
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(4 / n)), ratio
    for i in range(x.shape[0]):
        for j in range(w.shape[1]):
            assert stats.ks_2samp(fast[:, i, j], ref[:, i, j]).pvalue > 1e-3


def test_fast_shot_noise_follows_the_poisson_law(rng):
    """var = mean / p on split rails (as tests/test_matmul.py for the reference)."""
    p = 20.0
    x = rng.uniform(0, 1, (3, 64))
    x[:, 0] = 1.0
    w = rng.uniform(0, 1, (64, 8))
    w[0] = 1.0
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": "gaussian",
                   "encoding.inputs": "offset", "encoding.weights": "split", "core.inputs": 16,
                   "mask.contrast_ratio": 1e6})
    ys = _samples(x, w, cfg, "numba", seeds=40, copies=500)
    theory = 2 * (x + 1) @ np.abs(w) / p  # offset inputs: the offset light's shot noise
    np.testing.assert_allclose(ys.mean(axis=0), x @ w, atol=5 * np.sqrt(theory.max() / 20000))
    np.testing.assert_allclose(ys.var(axis=0), theory, rtol=0.05)


def test_low_rank_light_error(rng):
    """The one approximation: shot-noise std from low-rank factors of T+ + T-,
    against the exact product, for offset-encoded inputs (where it is used)."""
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 512, "core.outputs": 512,
                                                    "adc.full_scale": "rms",
                                                    "outliers.policy": "none"})
    w = rng.standard_normal((512, 512)).astype(np.float32)
    pw = optical.program(w, cfg)
    tsum = pw.transmissions[0].astype(np.float64) + pw.transmissions[1]
    x = rng.standard_normal((256, 512))
    x[128:, [3, 100]] *= 300  # massive activations in half the tokens
    a = (x / np.abs(x).max(axis=1, keepdims=True) + 1) / 2

    def error(rank):
        left, right = _fastpath.light_factors(tsum, rank)
        return np.abs(np.sqrt(a @ left @ right / (a @ tsum)) - 1)

    err = error(_fastpath.LIGHT_RANK)
    # Measured 0.10% median, 2.3% worst (docs/ARCHITECTURE.md quotes these bounds).
    assert np.median(err) < 0.002 and err.max() < 0.025, (np.median(err), err.max())
    # Two more singular directions of the centred rest buy nothing measurable:
    # what is left is the rest's unstructured part (why the default is rank 1).
    richer = error(3)
    assert abs(np.median(richer) / np.median(err) - 1) < 0.05, (np.median(richer), np.median(err))
    assert richer.max() > 0.9 * err.max()
    # Exact for constant light, and at full rank.
    left, right = _fastpath.light_factors(tsum)
    np.testing.assert_allclose(np.ones(512) @ left @ right, np.ones(512) @ tsum, rtol=1e-12)
    small = tsum[:20, :30]
    lf, rf = _fastpath.light_factors(small, rank=21)
    np.testing.assert_allclose(lf @ rf, small, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_engine_matmul_is_the_product_on_the_fast_paths_engine(rng, dtype):
    """What calibration's readouts use: XLA for big float32 operands when JAX
    is installed, BLAS in row blocks otherwise; the product either way."""
    a = rng.standard_normal((300, 200)).astype(dtype)
    b = rng.standard_normal((200, 150)).astype(dtype)
    y = numba_backend.engine_matmul(a, b, 64)
    assert y.dtype == dtype and y.shape == (300, 150)
    np.testing.assert_allclose(y, a.astype(np.float64) @ b,
                               rtol={np.float32: 1e-4, np.float64: 1e-12}[dtype], atol=1e-4)
    np.testing.assert_array_equal(numba_backend.engine_matmul(a, b, 64), y)
    if dtype == np.float64 or not numba_backend.xla_available():
        from optical._gemm import rows_matmul

        np.testing.assert_array_equal(y, rows_matmul(a, b, 64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1000, 700, 256, 300), (50, 2000, 64, 1024)])
def test_one_pass_plan_of_balanced_rails(rng, dtype, shape):
    """The per-load plan's one-pass kernel against numpy: ``T+ - T-`` per
    N-tile (contiguous blocks), row sums, and the column mean of ``T+ + T-``
    that is the default light factor, the latter two bit for bit."""
    k, n, tile_k, tile_n = shape
    t = rng.random((2, k, n)).astype(dtype)
    tiling = Tiling(k, n, tile_k, tile_n)
    for kt in range(tiling.k_tiles):
        ks = tiling.k_slice(kt)
        rows = ks.stop - ks.start
        blocks, row_sums, colsum = numba_backend._balanced_rails(t, ks, tiling)
        left, right = _fastpath.light_factors(t[0, ks] + t[1, ks])
        mean_left, mean_right = _fastpath.mean_factors(colsum / rows, rows)
        np.testing.assert_array_equal(mean_left, left)
        np.testing.assert_array_equal(mean_right, right)
        for nt in range(tiling.n_tiles):
            ns = tiling.n_slice(nt)
            assert blocks[nt].flags.c_contiguous
            np.testing.assert_array_equal(blocks[nt], t[0, ks, ns] - t[1, ks, ns])
            np.testing.assert_allclose(row_sums[nt],
                                       t[:, ks, ns].sum(axis=(0, 2), dtype=np.float64),
                                       rtol=1e-12)


# --------------------------------------------------------------------------- #
# Reproducibility, stats, errors
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("exact", [False, True])
def test_bit_identical_whatever_threads_and_chunks(rng, exact):
    x = rng.standard_normal((numba_backend.BLOCK_TOKENS + 77, 100)).astype(np.float32)
    w = rng.standard_normal((100, 45)).astype(np.float32)
    cfg = noisy()
    first = optical.matmul(x, w, cfg, seed=11, backend="numba", exact=exact)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = optical.matmul(x, w, cfg, seed=11, backend="numba", exact=exact)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(one, first)
    for chunk in (1, 50, 10_000):
        np.testing.assert_array_equal(
            optical.matmul(x, w, cfg, seed=11, backend="numba", exact=exact,
                           chunk_tokens=chunk), first)
    # numba takes no chunk_tokens (its blocks are BLOCK_TOKENS tokens): the
    # loop above cannot fail there (an acceptance audit). Its own block size
    # is the chunking that could move a bit; other sizes give the same output.
    for block in (64, 333):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(numba_backend, "BLOCK_TOKENS", block)
            np.testing.assert_array_equal(
                optical.matmul(x, w, cfg, seed=11, backend="numba", exact=exact), first)
    # A token's output depends on that token alone (and its absolute index):
    # here through the ADC's codes; without an ADC the BLAS engine's last bits
    # may follow the call's row_block(T) (docs/ARCHITECTURE.md, Reproducibility).
    head = optical.matmul(x[:30], w, cfg, seed=11, backend="numba", exact=exact)
    np.testing.assert_array_equal(head, first[:30])
    assert np.mean(optical.matmul(x, w, cfg, seed=12, backend="numba", exact=exact) != first) > 0.5


@pytest.mark.parametrize("shot", ["gaussian", "poisson"])
def test_exact_mode_reproduces_the_reference_beyond_one_token_block(rng, shot):
    """numba works in blocks of BLOCK_TOKENS tokens; every draw of the second
    block must be keyed by its absolute token, as the reference's are."""
    x = rng.standard_normal((numba_backend.BLOCK_TOKENS + 77, 100)).astype(np.float32)
    w = rng.standard_normal((100, 45)).astype(np.float32)
    cfg = noisy(**{"detector.shot_noise": shot})
    pw = optical.program(w, cfg)
    reference = optical.matmul(x, pw, cfg, seed=11, backend="numpy")
    np.testing.assert_array_equal(
        optical.matmul(x, pw, cfg, seed=11, backend="numba", exact=True), reference)


@pytest.mark.parametrize("noise", ["readout", "rin"])
def test_fast_noise_does_not_repeat_from_one_token_block_to_the_next(rng, noise):
    """Identical rows, so every row's error is that row's noise: the noise of
    row t and of row t + BLOCK_TOKENS must be uncorrelated (fast mode). The
    readout noise is independent over columns too: the pooled correlation of
    N = BLOCK_TOKENS * 45 pairs has standard error 1 / sqrt(N). RIN is shared
    by the columns of a pass, so its bound is that of one column's
    BLOCK_TOKENS pairs, which bounds their mean over the columns as well."""
    block = numba_backend.BLOCK_TOKENS
    x = np.tile(rng.standard_normal((1, 100)), (2 * block, 1)).astype(np.float32)
    w = rng.standard_normal((100, 45)).astype(np.float32)
    if noise == "readout":
        cfg = noisy(**{"source.rin_db_per_hz": -math.inf})
    else:
        cfg = noisy(**{"source.photons_per_mac": math.inf, "adc.bits": None})
    y = optical.matmul(x, w, cfg, seed=11, backend="numba").astype(np.float64)
    e = y - y.mean(axis=0)
    first, second = e[:block], e[block:]
    assert np.all(first.std(axis=0) > 0)
    if noise == "readout":
        r = np.sum(first * second) / np.sqrt(np.sum(first**2) * np.sum(second**2))
        assert abs(r) < 5 / math.sqrt(first.size), r
    else:
        r = np.mean([np.corrcoef(first[:, j], second[:, j])[0, 1] for j in range(45)])
        assert abs(r) < 5 / math.sqrt(block), r


def test_fast_readout_noise_is_independent_across_columns_and_tiles(rng):
    """Identical rows and no RIN: every row's error is its readout noise, one
    normal per ADC conversion, independent across columns. The fast path
    draws them in Box-Muller pairs of columns; an N-tile starting on an odd
    column (tiles of 5) and an odd N with two K-tiles (a pass ending on half
    a pair) must not hand one normal to two conversions: every pair of
    columns is uncorrelated, within 5 standard errors of 1 / sqrt(tokens)."""
    tokens = 4000
    x = np.tile(rng.standard_normal((1, 128)), (tokens, 1)).astype(np.float32)  # 2 K-tiles
    w = rng.standard_normal((128, 9)).astype(np.float32)
    cfg = noisy(**{"core.outputs": 5, "source.rin_db_per_hz": -math.inf})
    y = optical.matmul(x, w, cfg, seed=3, backend="numba").astype(np.float64)
    assert np.all(y.std(axis=0) > 0)
    r = np.corrcoef(y.T)[~np.eye(9, dtype=bool)]
    assert np.abs(r).max() < 5 / math.sqrt(tokens), r


def test_fast_and_exact_runs_of_one_programmed_matrix_keep_their_own_plans(rng):
    """The per-load plan is cached per programmed matrix, and differs by mode
    (fast: the balanced rails' difference and low-rank light; exact: every
    rail). A fast run after an exact one on the same ProgrammedWeights is
    what a fast run on a freshly programmed copy gives, and an exact run
    after a fast one is still the reference, draw for draw."""
    x = rng.standard_normal((40, 150)).astype(np.float32)
    w = rng.standard_normal((150, 50)).astype(np.float32)
    cfg = noisy()
    fresh = optical.matmul(x, optical.program(w, cfg), cfg, seed=4, backend="numba")
    pw = optical.program(w, cfg)
    optical.matmul(x, pw, cfg, seed=4, backend="numba", exact=True)
    np.testing.assert_array_equal(optical.matmul(x, pw, cfg, seed=4, backend="numba"), fresh)
    pw = optical.program(w, cfg)
    optical.matmul(x, pw, cfg, seed=4, backend="numba")
    np.testing.assert_array_equal(optical.matmul(x, pw, cfg, seed=4, backend="numba", exact=True),
                                  optical.matmul(x, pw, cfg, seed=4, backend="numpy"))


def test_kernels_are_cached_where_numba_can_write_and_said_where_it_cannot(tmp_path,
                                                                           monkeypatch):
    """``can_cache``: True for a source file in a writable directory (numba
    keeps the kernels in its __pycache__); False, with one warning saying how
    to keep them, where numba finds no cache locator (here a source that is
    no file), and the kernels then compile in memory."""
    from optical import _numba_cache

    probe = _numba_cache.can_cache.__wrapped__  # not the per-process cache of answers
    source = tmp_path / "kernels.py"
    source.write_text("")
    assert probe(str(source)) is True
    monkeypatch.setattr(_numba_cache, "_no_cache", [])  # as in a fresh process
    with pytest.warns(RuntimeWarning, match=r"numba finds no writable directory to cache the "
                                            r"kernels of <no file> \(or of optical's other "
                                            r"kernel modules\) in.*Set NUMBA_CACHE_DIR") as got:
        assert probe("<no file>") is False
        # once per process (a warnings audit counted four, one per kernel module,
        # times each worker of a sweep), at the caller's line, not optical's
        assert probe("<another>") is False
    assert len(got) == 1 and got[0].filename == __file__


def test_two_live_programmed_matrices_of_one_shape_keep_their_own_plans(rng):
    """Two matrices of one shape and config, both programmed and alive: each
    runs with its own cached plan. The run of one, before and after the
    other's, is what a fresh copy of it gives, and each is near its own exact
    product (a plan shared between them gave the second the first's weights,
    a relative error of 3)."""
    x = rng.standard_normal((64, 256)).astype(np.float32)
    w1, w2 = (rng.standard_normal((256, 128)).astype(np.float32) for _ in range(2))
    cfg = noisy(**{"source.photons_per_mac": 1e5, "core.inputs": 128})  # 2 x 4 tiles
    fresh = [optical.matmul(x, optical.program(w, cfg), cfg, seed=0, backend="numba")
             for w in (w1, w2)]
    p1, p2 = optical.program(w1, cfg), optical.program(w2, cfg)
    first = optical.matmul(x, p2, cfg, seed=0, backend="numba")
    y1 = optical.matmul(x, p1, cfg, seed=0, backend="numba")
    y2 = optical.matmul(x, p2, cfg, seed=0, backend="numba")
    for y, expected in ((first, fresh[1]), (y1, fresh[0]), (y2, fresh[1])):
        np.testing.assert_array_equal(y, expected)
    for y, w in ((y1, w1), (y2, w2)):
        exact = x.astype(np.float64) @ w.astype(np.float64)
        assert np.linalg.norm(y - exact) / np.linalg.norm(exact) < 0.2


def test_stats_match_the_reference(rng):
    x = rng.standard_normal((2, 5, 100))
    w = rng.standard_normal((100, 70))
    cfg = ideal(**{"core.inputs": 30, "core.outputs": 32, "encoding.inputs": "split",
                   "detector.balanced": False, "source.photons_per_mac": 1000.0,
                   "adc.bits": 6, "adc.headroom": 1.0})
    _, ref = optical.matmul(x, w, cfg, seed=0, backend="numpy", return_stats=True)
    _, got = optical.matmul(x, w, cfg, seed=0, backend="numba", return_stats=True)
    assert got.detected_photons == pytest.approx(ref.detected_photons, rel=1e-9)
    # Poisson shot noise (the ideal preset's) is drawn as the reference draws
    # it, so the very same conversions clip.
    assert got.clipped_fraction == ref.clipped_fraction > 0
    counted = {k: v for k, v in got.to_dict().items() if k in optical.schedule(10, 100, 70, cfg)
               .to_dict()}
    assert counted == optical.schedule(10, 100, 70, cfg).to_dict()


def test_auto_backend_and_bad_arguments(rng):
    x, w = np.ones((2, 4)), np.ones((4, 3))
    np.testing.assert_array_equal(optical.matmul(x, w, ideal(), seed=0),
                                  optical.matmul(x, w, ideal(), seed=0, backend="numba"))
    assert kernels.resolve("auto", x, ideal()) == "numba"
    assert kernels.resolve("auto", x, ideal(**{"core.inputs": 7, "core.outputs": 5})) == "numpy"
    assert kernels.resolve("numba", x, ideal(**{"core.inputs": 7})) == "numba"
    with pytest.raises(ValueError, match="backend: 'cuda' is not valid"):
        optical.matmul(x, w, ideal(), seed=0, backend="cuda")
    with pytest.raises(TypeError, match="exact: expected a bool"):
        optical.matmul(x, w, ideal(), seed=0, backend="numba", exact=1)
    with pytest.raises(TypeError, match="dtype mismatch"):
        optical.matmul(x.astype(np.float32), w, ideal(), seed=0, backend="numba")
    with pytest.raises(ValueError, match="x: contains 1 NaN"):
        optical.matmul(np.array([[np.nan, 1, 1, 1]]), w, ideal(), seed=0, backend="numba")
    pw = optical.program(w, ideal())
    with pytest.raises(ValueError, match="gemm: 'gpu' is not valid"):
        numba_backend.accumulate(x, np.ones(2), pw, ideal(), 0, np.zeros(3), gemm="gpu")
    pytest.importorskip("jax")  # gemm="xla" needs it (else a message saying so)
    with pytest.raises(ValueError, match="gemm: 'xla' runs float32 only"):
        numba_backend.accumulate(x, np.ones(2), pw, ideal(), 0, np.zeros(3), gemm="xla")


def test_a_call_while_another_thread_imports_jax_runs(monkeypatch):
    """Threads may call matmul at once (docs/ARCHITECTURE.md). While one of
    them imports JAX (the JAX backend and numba's XLA GEMMs import it on first
    use), sys.modules holds the module without its attributes yet: every call
    made meanwhile, numpy's too, raised AttributeError (seen in 5 of 5
    fresh processes with one thread importing JAX)."""
    spec = importlib.util.find_spec("jax")
    if spec is None:
        pytest.skip("JAX is not installed")
    half = types.ModuleType("jax")  # what `import jax` has put in sys.modules so far
    half.__spec__ = spec
    monkeypatch.setitem(sys.modules, "jax", half)
    cfg = ideal(**{"core.inputs": 8, "core.outputs": 8})
    x = np.arange(16, dtype=np.float64).reshape(2, 8)
    w = np.arange(64, dtype=np.float64).reshape(8, 8) / 64
    assert kernels.resolve("auto", x, cfg) == "numpy"
    np.testing.assert_allclose(optical.matmul(x, w, cfg, seed=0), x @ w, rtol=1e-12, atol=1e-12)


def test_blas_and_xla_gemms_agree(rng):
    pytest.importorskip("jax")
    x = rng.standard_normal((20, 300)).astype(np.float32)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    cfg = noisy(**{"core.inputs": 128, "core.outputs": 128})
    pw = optical.program(w, cfg)
    scale = np.abs(x).max(axis=1)
    ys = [numba_backend.accumulate(x, scale, pw, cfg, 3, np.zeros(3), gemm=g)
          for g in ("blas", "xla")]
    close = np.isclose(ys[0], ys[1], rtol=1e-4, atol=1e-4 * np.abs(ys[0]).max())
    assert close.mean() > 0.98


def test_xla_rows_do_not_depend_on_the_row_count_and_compile_few_shapes(rng):
    """XLA's CPU GEMM gives other last bits for a few rows (up to 50 here):
    a token's readouts would then depend on how many tokens came with it.
    Padded to one of a few row counts, every row is the same bits for any
    count, and 200 counts compile a handful of GEMMs, not 200."""
    pytest.importorskip("jax")
    a = rng.random((1100, 256)).astype(np.float32)
    b = rng.random((256, 256)).astype(np.float32)
    full = numba_backend.engine_matmul(a, b, 64)
    for m in (1, 2, 17, 30, 50, 51, 64, 65, 300, 1023):
        np.testing.assert_array_equal(numba_backend.engine_matmul(a[:m], b, 64), full[:m])
    sizes = {numba_backend.xla_rows(m) for m in range(1, 2049)}
    assert min(sizes) == numba_backend.XLA_MIN_ROWS and len(sizes) <= 12
    assert all(numba_backend.xla_rows(m) >= m for m in range(1, 5000))
    numba_backend._xla_gemm(1)._clear_cache()
    for m in range(1, 201):
        numba_backend.engine_matmul(a[:m], b[:, :128], 64)
    assert numba_backend._xla_gemm(1)._cache_size() <= 4  # 64, 128, 256 rows


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("changes", [{}, {"detector.shot_noise": "poisson"},
                                     {"encoding.inputs": "split"}])
def test_a_programmed_matrix_dies_with_its_last_reference(dtype, changes):
    """The fast path's plan is cached until the transmissions die: it must
    hold no view of them (nor a device array aliasing them), on BLAS
    (float64) and XLA (float32) alike, or no programmed matrix is ever freed."""
    import gc
    import weakref

    from optical.kernels import _fastpath

    rng = np.random.default_rng(0)
    cfg = noisy(**{"core.inputs": 256, "core.outputs": 256, **changes})
    x = rng.standard_normal((4, 256)).astype(dtype)
    before = len(_fastpath._CACHE)
    alive = []
    for exact in (False, True):
        pw = optical.program(rng.standard_normal((256, 256)).astype(dtype), cfg)
        optical.matmul(x, pw, cfg, seed=0, backend="numba", exact=exact)
        alive.append(weakref.ref(pw.transmissions))
        del pw
    gc.collect()
    assert [ref() is None for ref in alive] == [True, True]
    assert len(_fastpath._CACHE) == before


# --------------------------------------------------------------------------- #
# numba's OpenMP workers wait passively, whichever parallel kernel runs first
# --------------------------------------------------------------------------- #

_PARALLEL_FLAG = re.compile(r"parallel[\"']?\s*[:=]\s*True")


def test_every_module_with_parallel_kernels_sets_passive_waits_and_guards_them():
    """Spinning workers take the cores from the GEMMs between kernels (a
    programmed matmul ran 1.5x slower after programming's parallel kernels
    started the pool): each module with parallel kernels imports
    optical._numba_threads, whichever of them runs first. Every parallel
    kernel is launched through its guard (workqueue aborts on concurrent
    launches)."""
    root = Path(optical.__file__).parent
    parallel = [p for p in root.rglob("*.py") if _PARALLEL_FLAG.search(p.read_text())]
    assert len(parallel) >= 5
    missing = [str(p.relative_to(root)) for p in parallel
               if "from optical._numba_threads import guarded" not in p.read_text()]
    assert not missing
    for path in parallel:
        text = path.read_text()
        kernels = re.findall(r"@nb\.njit\((?:\*\*_PARALLEL|parallel=True[^)]*)\)\n", text)
        guarded = re.findall(r"@guarded\n@nb\.njit\((?:\*\*_PARALLEL|parallel=True[^)]*)\)\n",
                             text)
        assert kernels and len(guarded) == len(kernels), path.name


def test_concurrent_calls_on_the_workqueue_layer_take_turns(tmp_path):
    """numba's workqueue layer (every install has it; used when OpenMP and TBB
    do not load) aborts the process when two threads launch kernels at once.
    Four threads programming and multiplying at once on it: no abort, and the
    bits of the same calls made one after another."""
    code = textwrap.dedent("""\
        import concurrent.futures, numpy as np, numba, optical
        cfg = optical.presets.get("iris-like").replace({"core.inputs": 64, "core.outputs": 32})
        rng = np.random.default_rng(0)
        w = rng.standard_normal((200, 96)).astype(np.float32)
        cal = rng.standard_normal((64, 200)).astype(np.float32)
        x = rng.standard_normal((48, 200)).astype(np.float32)
        def job(seed):
            return optical.matmul(x, optical.program(w, cfg, calibration=cal), cfg, seed=seed)
        serial = [job(s) for s in range(8)]
        for _ in range(5):
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                together = list(pool.map(job, range(8)))
            assert all(np.array_equal(a, b) for a, b in zip(serial, together))
        print(numba.threading_layer())
        """)
    env = {**os.environ, "NUMBA_THREADING_LAYER": "workqueue"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "workqueue"


@pytest.mark.parametrize(("env", "expected"), [(None, "passive"), ("ACTIVE", "ACTIVE")])
def test_passive_waits_unless_the_user_chose(env, expected):
    """Lower case: libgomp folds the value by the locale, and in a Turkish one
    "PASSIVE" was no known value (numba's threads spun, 5-8x slower)."""
    code = ("import os, numpy as np\n"
            "from optical.transformer import numerics\n"
            "numerics.round_to(np.ones(1 << 15, np.float32), 'float16')\n"
            "print(os.environ['OMP_WAIT_POLICY'])")
    environ = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env is not None:
        environ["OMP_WAIT_POLICY"] = env
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == expected


@pytest.mark.slow  # compiles the kernels of a noisy matmul afresh (~12 s)
def test_kernels_compile_without_a_writable_cache(tmp_path):
    """Where numba finds no directory to cache in (a read-only install
    without a writable user cache: numba's cache locators all decline),
    importing the kernels must not fail: they compile in memory, with one
    warning (per process) naming NUMBA_CACHE_DIR, and compute the same bits
    (the matmul's kernels and the transformer's rounding kernels alike).
    numba refuses a cached function without a locator when it is decorated,
    so every kernel module is imported; wang-2022's matmul compiles a
    quarter of what iris-like's does (10 s against 38 s here). Compiled
    afresh, each per-token function has one signature per dtype: its
    ``prange`` driver hands it an int64 index (a bare ``prange`` index is
    int64 where numba types the loop and uint64 in the parallel function
    built from it, which compiled each such function twice: a fifth of the
    kernels' cold compile)."""
    import subprocess
    import sys

    script = tmp_path / "no_cache.py"
    script.write_text(
        "import warnings\n"
        "import numba.core.caching as caching\n"
        "impl = getattr(caching, 'CacheImpl', None) or caching._CacheImpl  # (numba < 0.61)\n"
        "impl._locator_classes = []  # nowhere to cache, as on a read-only disk\n"
        "import numpy as np\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import optical\n"
        "    import optical.kernels._windows, optical.kernels._program  # (lazy ones)\n"
        "    rng = np.random.default_rng(0)\n"
        "    x, w = rng.standard_normal((8, 64)), rng.standard_normal((64, 16))\n"
        "    cfg = optical.presets.get('wang-2022').replace({'core.inputs': 32, "
        "'core.outputs': 16})\n"
        "    y = optical.matmul(x, w, cfg, seed=1, backend='numba')\n"
        "    from optical.transformer.numerics import round_to  # the rounding kernels too\n"
        "    v = np.linspace(-6e4, 6e4, 1 << 15, dtype=np.float32)\n"
        "    fp16 = v.astype(np.float16).astype(np.float32)\n"
        "    same = np.array_equal(round_to(v, 'float16'), fp16)\n"
        "from optical.kernels import _numba, _windows\n"
        "tokenwise = (_numba._levels_token, _numba._light_token, _numba._readout_fast_token,\n"
        "             _numba._readout_exact_token, _windows._group)\n"
        "print('index', sorted({str(s[0]) for f in tokenwise for s in f.signatures}))\n"
        "print('rounding', int(same))\n"
        "np.save(r'%s', y)\n"
        "print(sum('NUMBA_CACHE_DIR' in str(c.message) for c in caught))\n" % (tmp_path / "y.npy"))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "rounding 1" in run.stdout  # the transformer's fp16 rounding ran, numpy's bits
    assert "index ['int64']" in run.stdout, run.stdout  # one compile per function and dtype
    assert int(run.stdout.split()[-1]) == 1  # once per process, not once per kernel module
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 64)), rng.standard_normal((64, 16))
    cfg = optical.presets.get("wang-2022").replace({"core.inputs": 32, "core.outputs": 16})
    expected = optical.matmul(x, w, cfg, seed=1, backend="numba")
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), expected)


def test_xla_pads_rows_exactly_to_the_next_power_of_two_then_to_multiples_of_the_step():
    """XLA_MIN_ROWS rows at least; above them the next power of two up to the
    step (256), then the next multiple of it: a row count that is already one
    of those sizes is run as it is (no doubled work)."""
    step = 256
    for m in range(1, 3000):
        if m <= numba_backend.XLA_MIN_ROWS:
            expect = numba_backend.XLA_MIN_ROWS
        elif m <= step:
            expect = 1
            while expect < m:
                expect *= 2
        else:
            expect = step * math.ceil(m / step)
        assert numba_backend.xla_rows(m) == expect, m
    for m in (64, 128, 256, 512, 768, 2048):
        assert numba_backend.xla_rows(m) == m


@pytest.mark.parametrize("split_inputs", [False, True])
def test_a_tokens_xla_readout_does_not_depend_on_the_tokens_with_it(split_inputs):
    """The fast path's XLA GEMMs take the light of every token of a block at
    once; noise is keyed by token, so a token's output must be the same bits
    whether it comes alone, with a few others or with many (XLA's CPU GEMM
    gives other last bits for a few rows, as on these 256 x 256 tiles: its
    operands are padded)."""
    pytest.importorskip("jax")
    rng = np.random.default_rng(3)
    # no ADC: the readouts' last bits reach the output
    cfg = noisy(**{"core.inputs": 256, "core.outputs": 256,  # XLA's few-row path differs here
                   "adc.bits": None, "encoding.inputs": "split" if split_inputs else "offset"})
    w = rng.standard_normal((256, 256)).astype(np.float32)
    x = rng.standard_normal((300, 256)).astype(np.float32)
    pw = optical.program(w, cfg)
    scale = np.abs(x).max(axis=1)

    def run(m):
        return numba_backend.accumulate(x[:m], scale[:m], pw, cfg, 5, np.zeros(3), gemm="xla")

    full = run(300)
    for m in (1, 3, 17, 40):
        np.testing.assert_array_equal(run(m), full[:m], err_msg=f"{m} tokens")


def test_every_cached_kernel_reads_and_writes_its_cache_under_the_lock():
    """optical._numba_cache.serialise wraps each cached kernel's cache; a
    module that defines kernels and forgets to call it would race again."""
    import importlib

    dispatchers = locked = 0
    for name in _jitted_modules():
        module = importlib.import_module(name)
        for value in vars(module).values():
            # A parallel kernel is called through _numba_threads.guarded's launcher.
            value = getattr(value, "kernel", value)
            if isinstance(value, numba.core.registry.CPUDispatcher):
                dispatchers += 1
                if isinstance(getattr(value._cache, "cache_path", None), str):
                    assert getattr(value._cache, "_optical_locked", False), (name, value)
                    locked += 1
    assert dispatchers > 60  # every module's kernels were looked at
    # ... and found cached (the checkout is writable): a numba that renamed its
    # private Cache.cache_path would leave serialise locking nothing, and the
    # check above checking nothing (a dependency audit simulated it)
    assert locked > 40, f"{locked} of {dispatchers} kernels have a cache_path numba names"


def test_the_cache_lock_keeps_another_process_out(tmp_path):
    """While a cache read or write holds the lock, another process cannot
    take it (flock, checked from outside with LOCK_NB); after it, it can."""
    from optical._numba_cache import _LOCK_NAME, _cache_lock

    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError:\n    sys.exit(3)\n")
    path = str(tmp_path / _LOCK_NAME)
    with _cache_lock(str(tmp_path)):
        with _cache_lock(str(tmp_path)):  # re-entrant within a thread
            pass
        assert subprocess.run([sys.executable, "-c", probe, path]).returncode == 3
    assert subprocess.run([sys.executable, "-c", probe, path]).returncode == 0



def test_a_full_cache_disk_warns_and_the_kernel_runs(tmp_path):
    """numba lets an OSError of its cache write through (a full disk, a home
    over quota: here a file-size limit, EFBIG), failing the call whose kernel
    had just compiled, and every later process's too. The kernel runs from
    memory instead, with one warning naming the cache directory; an unreadable
    cache is a miss, likewise."""
    (tmp_path / "kern.py").write_text(
        "import numba\n"
        "from optical._numba_cache import serialise\n"
        "@numba.njit(cache=True)\n"
        "def twice(x):\n"
        "    return 2 * x\n"
        "serialise(globals())\n")
    script = ("import resource, sys, warnings\n"
              "sys.path.insert(0, sys.argv[1])\n"
              "resource.setrlimit(resource.RLIMIT_FSIZE, (64, resource.RLIM_INFINITY))\n"
              "warnings.simplefilter('always')\n"
              "import kern\n"
              "print(kern.twice(21), kern.twice(4))\n")
    cache = tmp_path / "cache"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["42", "8"]
    assert run.stderr.count("numba could not write its kernel cache in") == 1, run.stderr
    assert str(cache) in run.stderr and "File too large" in run.stderr
    # at the script's line that ran the kernel, not numba's dispatcher.py
    assert "<string>:6: RuntimeWarning: numba could not write" in run.stderr, run.stderr

_CACHE_RACER = r'''
import itertools, os, sys, time
import numba.core.caching as caching
import numpy as np
dtype, role, bar = sys.argv[1], sys.argv[2], sys.argv[3]

def mark(name):
    open(os.path.join(bar, name), "w").close()

def wait(name):  # a barrier, given up after 3 s (the lock serialises the writers)
    end = time.monotonic() + 3
    while not os.path.exists(os.path.join(bar, name)) and time.monotonic() < end:
        time.sleep(0.01)

original = caching.IndexDataCacheFile.save

def save(self, key, data):  # numba's IndexDataCacheFile.save, its steps interleaved
    if ".normal_range-" not in self._index_name:  # the kernels it calls: as numba does
        return original(self, key, data)
    if role == "B": wait("A_loaded")
    overloads = self._load_index()
    mark(role + "_loaded")
    wait("B_loaded" if role == "A" else "A_indexed")
    if key not in overloads:
        taken = set(overloads.values())
        overloads[key] = next(n for n in map(self._data_name, itertools.count(1))
                              if n not in taken)
        self._save_index(overloads)
    mark(role + "_indexed")
    if role == "A": wait("B_saved")
    self._save_data(overloads[key], data)
    mark(role + "_saved")

if role != "-":
    caching.IndexDataCacheFile.save = save
from optical import _rng
from optical.kernels import _rng_numba
key, index = _rng.stream_key(3, 1), np.arange(64, dtype=np.uint64)
out = np.empty(64, dtype)
_rng_numba.normal_range(key, np.uint64(0), out)  # a parallel kernel, behind guarded
np.testing.assert_allclose(out, _rng.normal(key, index).astype(dtype), rtol=1e-6)
'''


@pytest.mark.slow
def test_a_kernel_cache_filled_by_two_processes_at_once_serves_each_dtype(tmp_path):
    """Two processes (a --jobs 2 sweep of workload.dtype=float32,float64, a job
    array) compile a cached kernel for float32 and float64 into a cold cache at
    once, numba's index and data writes interleaved as a race can interleave
    them (barrier files force the order). A later float64 process must get
    the numpy reference's normals, not "can't unbox array" from the float32
    code numba's index then named (numba issues #4807, #10128)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    run = [sys.executable, "-c", _CACHE_RACER]
    a = subprocess.Popen([*run, "float32", "A", str(tmp_path)], env=env)
    subprocess.run([*run, "float64", "B", str(tmp_path)], env=env, check=True, timeout=120)
    assert a.wait(timeout=120) == 0
    later = subprocess.run([*run, "float64", "-", str(tmp_path)], env=env, timeout=120,
                           capture_output=True, text=True)
    assert later.returncode == 0, later.stderr[-500:]


def test_xla_gemms_stay_on_the_host_cpu_at_full_precision():
    """The numba backend's float32 GEMMs run in XLA: on the host's CPU device
    whatever JAX's default device, at full float32 precision. They took the
    default device (on a GPU host every block went there and back, at TF32 by
    default). Checked in a child with two host devices, the default the
    second, implicit transfers to a device refused (every operand must be
    placed explicitly), the GEMM's precision read from its program; and in
    a child whose JAX_PLATFORMS leaves the CPU out, where BLAS takes over."""
    pytest.importorskip("jax")
    code = """
import jax, numpy as np, optical
from optical.kernels import numba_backend as nb
cpu0, cpu1 = jax.devices("cpu")[:2]
x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
w = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
cfg = optical.presets.get("iris-like").replace({"core.inputs": 256, "core.outputs": 256})
pw = optical.program(w, cfg, calibration=x)
with jax.default_device(cpu1), jax.transfer_guard_host_to_device("disallow"):
    on_host = nb._put_xla(np.ones((2, 2), np.float32)).devices() == {cpu0}
    nb.engine_matmul(x, w, 64)
    optical.matmul(x, pw, cfg, seed=0, backend="numba")
    program = str(jax.make_jaxpr(nb._xla_gemm(1))(x, w))
print(on_host, "precision=(Precision.HIGHEST, Precision.HIGHEST)" in program)
"""
    env = {**os.environ, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
           + " --xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.split() == ["True", "True"]
    code = """
import numpy as np, optical
from optical.kernels import numba_backend as nb
x = np.ones((64, 256), np.float32)
y = optical.matmul(x, np.eye(256, dtype=np.float32), optical.presets.get("ideal"), seed=0,
                   backend="numba")
print(nb.xla_available(), bool(np.allclose(y, x, atol=1e-5)))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cuda"}, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-800:]
    assert done.stdout.split() == ["False", "True"]


def test_numba_disable_jit_is_named(tmp_path):
    """numba's debugging switch made every entry point fail with
    "'function' object has no attribute 'py_func'" (a traceback from the CLI)."""
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1"}
    code = ("import numpy as np, optical\n"
            "optical.matmul(np.ones((2, 4)), np.ones((4, 3)), optical.presets.get('ideal'), "
            "seed=0)\n")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "ImportError: NUMBA_DISABLE_JIT is set: optical's kernels need numba's compiler (their bit "
        "casts are llvmlite intrinsics, which run compiled only); unset NUMBA_DISABLE_JIT "
        "to use optical")


def test_an_edited_dependency_turns_the_disk_cache_off_until_its_digest_is_recorded(tmp_path):
    """A cold-start audit edited ``_rng_numba.py`` (the Box-Muller radius)
    after a warm run: the fast path went on running the old generator from
    numba's cache (25.70 dB, where the edited code gives 19.87), silently
    until someone ran the test above. The kernel module now compares the
    recorded digests at import and compiles without the disk cache, with a
    warning naming the file, where one differs."""
    import shutil
    import subprocess
    import sys

    root = Path(optical.__file__).parent
    copy = tmp_path / "optical"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
    probe = ("import warnings\nwarnings.simplefilter('always')\n"
             "import optical.kernels._numba as m\nprint(m._CACHE)")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "nb")}

    def cached():
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[-1], done.stderr

    assert cached() == ("True", "")
    edited = copy / "kernels" / "_rng_numba.py"
    edited.write_text(edited.read_text() + "\n# an edit\n")
    flag, warning = cached()
    assert flag == "False"
    assert "_rng_numba.py changed since _numba.py recorded its digest" in warning
    assert "RuntimeWarning" in warning and "compile without the disk cache" in warning


def test_the_dependency_check_reads_crlf_checkouts_and_zip_imports(tmp_path):
    """The review of the day's diff: the new import-time check opened the
    dependency by path, so optical imported from a zip failed at its first
    numba matmul (NotADirectoryError), and hashed raw bytes, so a Windows
    checkout's CRLF turned the disk cache off with a warning at every start.
    It reads through the module's loader, hashes LF line endings, and
    leaves a source it cannot read unchecked; an edit is still caught."""
    import zipfile
    import zipimport

    from optical import _numba_cache
    from optical.kernels import _numba

    recorded = _numba.DEPENDENCY_SHA256
    source = Path(_numba.__file__).with_name("_rng_numba.py").read_bytes()
    crlf = tmp_path / "crlf"
    crlf.mkdir()
    (crlf / "_rng_numba.py").write_bytes(source.replace(b"\n", b"\r\n"))
    assert _numba_cache.dependencies_current(str(crlf / "_numba.py"), recorded)  # no warning
    archive = tmp_path / "optical.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("kernels/_rng_numba.py", source)
    loader = zipimport.zipimporter(f"{archive}/kernels/")
    assert _numba_cache.dependencies_current(f"{archive}/kernels/_numba.py", recorded, loader)
    assert _numba_cache.dependencies_current(str(tmp_path / "gone" / "_numba.py"), recorded)
    (crlf / "_rng_numba.py").write_bytes(source + b"# an edit\n")
    with pytest.warns(RuntimeWarning, match="_rng_numba.py changed since _numba.py recorded"):
        assert not _numba_cache.dependencies_current(str(crlf / "_numba.py"), recorded)
