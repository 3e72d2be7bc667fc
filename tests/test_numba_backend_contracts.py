"""The numba backend's wrapper and kernels on contracts a mutation audit
(mut20) found untested: the GEMM engine "auto" takes, JAX's absence, noise
sources independent of each other, the low-rank shot noise of a partial last
K-tile, the randomised SVD of the light factors, and zero-width ADC windows."""

import math

import numpy as np
import pytest

import optical
from optical.kernels import _fastpath, numba_backend

from .configs import ideal, noisy


def _accumulate(x, pw, cfg, gemm):
    return numba_backend.accumulate(x, np.abs(x).max(axis=1), pw, cfg, 0, np.zeros(3),
                                    gemm=gemm)


def _spy_engines(monkeypatch):
    """The GEMM engines the numba backend calls from now on, in order."""
    used = []
    xla_gemm, rows_matmul = numba_backend._xla_gemm, numba_backend.rows_matmul

    def spy_xla(n):
        used.append("xla")
        return xla_gemm(n)

    def spy_blas(*args):
        used.append("blas")
        return rows_matmul(*args)

    monkeypatch.setattr(numba_backend, "_xla_gemm", spy_xla)
    monkeypatch.setattr(numba_backend, "rows_matmul", spy_blas)
    return used


@pytest.mark.parametrize(("k", "n", "engine"), [(64, 64, "blas"), (128, 127, "blas"),
                                                (128, 128, "xla"), (300, 200, "xla")])
def test_auto_gemm_takes_xla_from_tiles_of_128_by_128_weights(rng, monkeypatch, k, n, engine):
    """"auto" takes XLA for float32 when a tile holds at least 128 x 128
    weights (_XLA_MIN_TILE), counting the weights a tile actually holds (a
    small matrix on a large core is a small tile), else BLAS: it calls that
    engine alone, and gives bit for bit the explicitly chosen engine's output.
    (Which engine ran is watched, not inferred from the output's last bits:
    whether XLA's CPU GEMM and OpenBLAS round differently depends on the
    installed versions, and at these sizes they can agree.)"""
    pytest.importorskip("jax")
    cfg = ideal(**{"core.inputs": 256, "core.outputs": 256})
    x = rng.standard_normal((40, k)).astype(np.float32)
    pw = optical.program(rng.standard_normal((k, n)).astype(np.float32), cfg)
    used = _spy_engines(monkeypatch)
    runs = {}
    for gemm in ("blas", "xla", "auto"):
        used.clear()
        runs[gemm] = _accumulate(x, pw, cfg, gemm)
        expected = engine if gemm == "auto" else gemm
        assert used and set(used) == {expected}, (gemm, used)
    np.testing.assert_array_equal(runs["auto"], runs[engine])
    # engine_matmul (calibration's GEMM) draws the same line, on b's entries.
    a = rng.standard_normal((300, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    used.clear()
    got = numba_backend.engine_matmul(a, b, 64)
    assert used == [engine]
    xla = np.asarray(numba_backend._xla_gemm(1)(numba_backend._xla_padded(a), b))[0, :300]
    from optical._gemm import rows_matmul

    np.testing.assert_array_equal(got, xla if engine == "xla" else rows_matmul(a, b, 64))


def test_without_jax_xla_is_refused_and_auto_takes_blas(rng, monkeypatch):
    """gemm="xla" needs JAX: refused, naming the extra to install, where JAX
    is missing (simulated), and "auto" then runs BLAS whatever the tile."""
    monkeypatch.setattr(numba_backend, "xla_available", lambda: False)
    cfg = ideal(**{"core.inputs": 256, "core.outputs": 256})
    x = rng.standard_normal((20, 256)).astype(np.float32)
    pw = optical.program(rng.standard_normal((256, 256)).astype(np.float32), cfg)
    with pytest.raises(ValueError, match=r"gemm: 'xla' needs JAX with its CPU backend; "
                                         r"install optical\[jax\]"):
        _accumulate(x, pw, cfg, "xla")
    np.testing.assert_array_equal(_accumulate(x, pw, cfg, "auto"), _accumulate(x, pw, cfg, "blas"))


def test_fast_rin_and_readout_noise_are_independent(rng):
    """RIN and the combined readout noise are independent sources: their
    variances add. Fast path, identical tokens (x = 1: every source at full
    level), a diagonal w on an 8 x 8 tile (K = N = tile_k = 8, so the RIN
    draws of a pass's rows and the readout draws of its columns have the
    same counters: only their streams tell them apart). Each column's
    variance with both noises must be the sum of its variances with each
    alone (5 standard errors of the three sample variances, ~2%)."""
    tokens = 20000
    x = np.ones((tokens, 8))
    w = np.diag(rng.choice([-1.0, 1.0], 8) * rng.uniform(0.5, 1, 8))
    sigma, bandwidth = 0.05, 1e9
    rin_db = 10 * math.log10(sigma**2 / bandwidth)
    base = ideal(**{"core.inputs": 8, "core.outputs": 8, "detector.shot_noise": "gaussian",
                    "source.rin_bandwidth": bandwidth})
    configs = {"rin": {"source.rin_db_per_hz": rin_db},
               "shot": {"source.photons_per_mac": 300.0},
               "both": {"source.rin_db_per_hz": rin_db, "source.photons_per_mac": 300.0}}
    var = {name: optical.matmul(x, w, base.replace(c), seed=3, backend="numba").var(axis=0)
           for name, c in configs.items()}
    assert np.all(var["rin"] > 0.3 * var["shot"]) and np.all(var["shot"] > 0.3 * var["rin"])
    ratio = var["both"] / (var["rin"] + var["shot"])
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(2 * 3 / tokens)), ratio


@pytest.mark.parametrize("k", [24, 40])
def test_fast_low_rank_shot_noise_of_a_partial_last_k_tile(k):
    """Offset inputs, split weights, balanced rails: the fast path's low-rank
    shot noise (column mean of T+ + T-) is exact for constant light. x = 0
    (after one lit token that sets per-tensor units) lights every source at
    1/2, so per readout the count variance is sum_j |v_j| / 2 / p, decoded
    (2 z - sum v) to var(y) = s**2 * 2 sum_j |v_j| / p, v = w / s, summed
    over the K-tiles; the last K-tile (K = 24 or 40 on 16-row tiles) is
    partial, and its rows count as its own rows, not a full tile's."""
    p = 50.0
    rng = np.random.default_rng(1)
    x = np.zeros((20001, k))
    x[0, 0] = 1.0
    w = rng.uniform(-2, 2, (k, 4))
    s = np.abs(w).max(axis=0)
    cfg = ideal(**{"source.photons_per_mac": p, "detector.shot_noise": "gaussian",
                   "core.inputs": 16, "dac.scaling": "per_tensor"})
    theory = s**2 * 2 * np.abs(w / s).sum(axis=0) / p
    y = optical.matmul(x, w, cfg, seed=2, backend="numba")[1:]
    n = y.shape[0]
    assert np.all(np.abs(y.mean(axis=0)) < 5 * np.sqrt(theory / n))
    ratio = y.var(axis=0) / theory
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(2 / n)), ratio


def test_light_factors_beyond_the_mean_are_near_the_best_low_rank_fit():
    """rank > 1: the randomised SVD (two power iterations) of the centred
    matrix comes within 1% of the best Frobenius error of its rank
    (Eckart-Young: the tail of the singular values, numpy's SVD) on a
    non-negative matrix with a slowly decaying spectrum (1 / sqrt(i))."""
    rng = np.random.default_rng(0)
    k, n = 256, 300
    u = np.linalg.qr(rng.standard_normal((k, k)))[0]
    v = np.linalg.qr(rng.standard_normal((n, k)))[0]
    t = np.abs((u / np.sqrt(np.arange(1, k + 1))) @ v.T)
    singular = np.linalg.svd(t - t.mean(axis=0), compute_uv=False)
    for rank in (2, 4, 9):
        left, right = _fastpath.light_factors(t, rank)
        assert left.shape == (k, rank) and right.shape == (rank, n)
        best = math.sqrt(np.sum(singular[rank - 1:] ** 2))
        assert np.linalg.norm(t - left @ right) < 1.01 * best, rank


@pytest.mark.parametrize("balanced", [True, False])
def test_zero_width_windows_never_count_a_clipped_conversion(rng, balanced):
    """"max" windows of a pruned column (all weights 0, infinite contrast)
    have zero width: every conversion there reads the window's one value,
    and none is counted clipped, however far the noise (read noise of one
    full-scale MAC) takes the readout. numba's exact mode counts the
    reference's clipped conversions exactly (the other columns' windows
    clip some); the pruned column's output is 0 on every path."""
    x = rng.standard_normal((200, 32))
    w = rng.standard_normal((32, 8))
    w[:, 3] = 0.0
    cfg = ideal(**{"adc.bits": 6, "adc.full_scale": "max", "source.photons_per_mac": 50.0,
                   "detector.shot_noise": "gaussian", "detector.read_noise_electrons": 50.0,
                   "detector.balanced": balanced, "core.inputs": 32, "core.outputs": 8})
    pw = optical.program(w, cfg)
    assert np.all(pw.adc_lo[:, :, 3] == pw.adc_hi[:, :, 3])
    runs = {(backend, exact): optical.matmul(x, pw, cfg, seed=1, backend=backend, exact=exact,
                                             return_stats=True)
            for backend, exact in (("numpy", False), ("numba", False), ("numba", True))}
    ref = runs["numpy", False][1]
    assert runs["numba", True][1].clipped_fraction == ref.clipped_fraction
    # The clipped conversions of the 7 other columns alone: below 7/8 of all.
    for y, st in runs.values():
        assert np.all(y[:, 3] == 0)
        assert st.clipped_fraction < 7 / 8


@pytest.mark.parametrize("shot", ["gaussian", "poisson"])
@pytest.mark.parametrize(("dark", "read"), [(0.3, 0.0), (0.0, 0.4)])
def test_exact_mode_draws_sub_electron_dark_and_read_noise(rng, shot, dark, read):
    """Dark counts and read noise below one electron are noise all the same:
    exact mode draws them as the reference does, to float rounding (no ADC,
    a weak source, so a fraction of an electron moves every output far
    beyond rounding)."""
    x = rng.standard_normal((30, 40))
    w = rng.standard_normal((40, 12))
    cfg = ideal(**{"source.photons_per_mac": 2.0, "detector.shot_noise": shot,
                   "detector.dark_electrons": dark, "detector.read_noise_electrons": read,
                   "core.inputs": 32, "core.outputs": 8})
    noiseless = ideal(**{"source.photons_per_mac": 2.0, "detector.shot_noise": shot,
                         "core.inputs": 32, "core.outputs": 8})
    ref = optical.matmul(x, w, cfg, seed=7, backend="numpy")
    tol = 1e-12 * np.abs(ref).max()
    moved = np.abs(ref - optical.matmul(x, w, noiseless, seed=7, backend="numpy")) > 1e3 * tol
    assert moved.mean() > 0.5
    np.testing.assert_allclose(optical.matmul(x, w, cfg, seed=7, backend="numba", exact=True),
                               ref, rtol=0, atol=tol)


@pytest.mark.parametrize(("inputs", "weights", "balanced"), [
    ("offset", "split", True),    # fast path: one signal, one ADC rail
    ("offset", "offset", False),  # ... one rail
    ("split", "split", True),     # the general readout
    ("offset", "split", False)])  # ... an ADC per rail
def test_a_one_bit_adc_digitises_on_every_path(rng, inputs, weights, balanced):
    """adc.bits = 1 (top code 1, a valid config): two codes per window, on
    the fast paths too. No noise (p = inf), so every path must give the
    reference's outputs and clipped conversions (codes far from rounding
    ties: continuous levels)."""
    x = rng.standard_normal((30, 40))
    w = rng.standard_normal((40, 12))
    cfg = ideal(**{"encoding.inputs": inputs, "encoding.weights": weights,
                   "detector.balanced": balanced, "adc.bits": 1, "adc.headroom": 1.0,
                   "mask.contrast_ratio": 20.0, "core.inputs": 32, "core.outputs": 8})
    ref, ref_stats = optical.matmul(x, w, cfg, seed=0, backend="numpy", return_stats=True)
    unquantised = optical.matmul(x, w, cfg.replace({"adc.bits": None}), seed=0, backend="numpy")
    assert np.mean(np.abs(ref - unquantised) > 1e-3 * np.abs(ref).max()) > 0.5
    for exact in (False, True):
        y, st = optical.matmul(x, w, cfg, seed=0, backend="numba", exact=exact,
                               return_stats=True)
        np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
        assert st.clipped_fraction == ref_stats.clipped_fraction


@pytest.mark.parametrize("policy", ["static", "dynamic"])
def test_exact_mode_reproduces_the_reference_with_outlier_channels(rng, policy):
    """exact=True: draw for draw the numpy reference (numba_backend's
    docstring) -- also when outlier channels run digitally and the rest
    goes through the optical matmul, which must inherit ``exact``."""
    x = rng.standard_normal((30, 96))
    x[:, 7] *= 40.0
    w = rng.standard_normal((96, 40))
    cfg = noisy(**{"detector.shot_noise": "gaussian", "detector.dark_electrons": 20.0,
                   "outliers.policy": policy, "outliers.top_k": 1})
    pw = optical.program(w, cfg, calibration=x if policy == "static" else None)
    reference = optical.matmul(x, pw, cfg, seed=3, backend="numpy")
    y = optical.matmul(x, pw, cfg, seed=3, backend="numba", exact=True)
    np.testing.assert_allclose(y, reference, rtol=1e-9, atol=1e-9 * np.abs(reference).max())


def test_exact_mode_after_fast_mode_on_the_same_programmed_weights(rng):
    """The fast path caches its plan per programmed matrix; a fast call must
    not leave the plan an exact call then uses: exact=True reproduces the
    numpy reference whatever ran before on the same ProgrammedWeights."""
    x = rng.standard_normal((20, 64))
    cfg = noisy(**{"detector.shot_noise": "gaussian", "core.inputs": 32, "core.outputs": 16})
    pw = optical.program(rng.standard_normal((64, 24)), cfg)
    reference = optical.matmul(x, pw, cfg, seed=1, backend="numpy")
    optical.matmul(x, pw, cfg, seed=1, backend="numba")  # fast mode first
    y = optical.matmul(x, pw, cfg, seed=1, backend="numba", exact=True)
    np.testing.assert_allclose(y, reference, rtol=1e-9, atol=1e-9 * np.abs(reference).max())


def test_numba_beyond_one_token_block_matches_the_reference(rng):
    """More tokens than numba_backend.BLOCK_TOKENS: every noise is keyed by
    the absolute token, so exact mode is still the reference draw for draw,
    and the clipped conversions of every block are counted."""
    tokens = numba_backend.BLOCK_TOKENS + 40
    x = rng.standard_normal((tokens, 40))
    w = rng.standard_normal((40, 12))
    cfg = noisy(**{"detector.shot_noise": "gaussian", "core.inputs": 32, "core.outputs": 8,
                   "adc.headroom": 1.5})
    pw = optical.program(w, cfg)
    ref, ref_st = optical.matmul(x, pw, cfg, seed=2, backend="numpy", return_stats=True)
    y, st = optical.matmul(x, pw, cfg, seed=2, backend="numba", exact=True, return_stats=True)
    np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    assert st.clipped_fraction == ref_st.clipped_fraction > 0
    assert st.detected_photons == pytest.approx(ref_st.detected_photons, rel=1e-9)
    # Fast mode: a token repeated one block later gets fresh noise.
    x2 = np.concatenate([x[:8], x[8:numba_backend.BLOCK_TOKENS], x[:8]])
    y2 = optical.matmul(x2, pw, cfg, seed=2, backend="numba")
    assert not np.any(y2[:8] == y2[-8:])


def test_the_numba_backends_own_matmul_passes_exact_on():
    """optical.kernels.numba_backend.matmul is documented as
    ``optical.matmul(..., backend="numba")``: every argument, ``exact``
    included, must reach it (exact and fast mode draw different noise here)."""
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
    rng = np.random.default_rng(2)
    w = rng.standard_normal((64, 50)).astype(np.float32)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    for exact in (False, True):
        want = optical.matmul(x, w, cfg, seed=3, backend="numba", exact=exact)
        got = numba_backend.matmul(x, w, cfg, seed=3, exact=exact)
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(optical.matmul(x, w, cfg, seed=3, backend="numba", exact=True),
                              optical.matmul(x, w, cfg, seed=3, backend="numba"))


def test_accumulate_checks_what_its_compiled_loops_index():
    """`accumulate` is public: arguments its numba loops would index out of
    bounds (narrower tokens: NaN; a short scale: wrong finite values) or read
    in another dtype are refused by name (a style audit)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 32)).astype(np.float32)
    cfg = noisy()
    pw = optical.program(w, cfg)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    scale = np.abs(x).max(axis=1)
    good = numba_backend.accumulate(x, scale, pw, cfg, 0, np.zeros(3))
    assert good.shape == (5, 32) and np.isfinite(good).all()
    with pytest.raises(ValueError, match="x2 has 8 features but the programmed weights have 256"):
        numba_backend.accumulate(x[:, :8].copy(), scale, pw, cfg, 0, np.zeros(3))
    with pytest.raises(ValueError, match=r"scale has shape \(4,\); expected \(5,\)"):
        numba_backend.accumulate(x, scale[:4].copy(), pw, cfg, 0, np.zeros(3))
    with pytest.raises(TypeError, match="float32"):
        numba_backend.accumulate(x.astype(np.float64), scale.astype(np.float64), pw, cfg, 0,
                                 np.zeros(3))
    with pytest.raises(ValueError, match="totals"):
        numba_backend.accumulate(x, scale, pw, cfg, 0, np.zeros(2))
    with pytest.raises(TypeError, match="ProgrammedWeights"):
        numba_backend.accumulate(x, scale, w, cfg, 0, np.zeros(3))
    with pytest.raises(ValueError, match="re-program"):
        numba_backend.accumulate(x, scale, pw, cfg.replace({"adc.bits": 4}), 0, np.zeros(3))


@pytest.mark.parametrize("change", [{}, {"encoding.inputs": "split"},
                                    {"detector.balanced": False}])
def test_a_noise_deviation_past_float32_on_zero_width_windows_reads_the_window(change):
    """A warnings audit: 1e-30 photons per MAC with 1e9 read-noise electrons
    (both in range) calibrates every window to zero width, and the fast
    path's float32 deviation overflowed to inf; inf times the window's zero
    inverse step made every output NaN, where the reference reads each
    window's one value (in both fused readout loops: the diff review found
    the first version of this test reached one)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (16, 256)).astype(np.float32)
    w = rng.uniform(-1, 1, (256, 64)).astype(np.float32)
    cfg = optical.presets.get("iris-like").replace({
        "detector.shot_noise": "gaussian", "source.photons_per_mac": 1e-30,
        "detector.read_noise_electrons": 1e9, **change})  # one pass and rail; two of either:
    pw = optical.program(w, cfg, calibration=x)  # the two fused readout loops
    assert np.all(pw.adc_lo == pw.adc_hi)
    ref = optical.matmul(x, pw, cfg, seed=0, backend="numpy")
    assert np.isfinite(ref).all()
    np.testing.assert_array_equal(optical.matmul(x, pw, cfg, seed=0, backend="numba"), ref)
