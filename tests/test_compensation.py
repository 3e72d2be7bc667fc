"""Pre-distortion for the illumination envelope and crosstalk: the coupling
map against an explicit dense matrix product, the solver against a known
solution, the gain by hand, and the machine end to end.

Most tests put a synthetic ``SeparableCoupling`` (or a nonlinear stand-in) in
place of ``optical.quant._optics_map``, the point where program() asks for the
optics; the last ones compensate the real lens physics
(``optical.physics.crosstalk``).
"""

import math

import numpy as np
import pytest

import optical
from optical import compensation, metrics, quant
from optical.compensation import SeparableCoupling


def _tiling(k, n, tile_k, tile_n):
    return quant.Tiling(k, n, tile_k, tile_n)


def _dense_reference(t, coupling, tiling):
    """T_eff = C_in^T (E * T) C_out per tile, with C_in[j, i] = row_kernel[h + j - i]
    (share of source i's light on row j) and C_out[n, m] = col_kernel[h + m - n]
    (share of column n's light on detector m)."""
    out = np.zeros_like(t)
    hr, hc = coupling.row_kernel.size // 2, coupling.col_kernel.size // 2
    env = np.broadcast_to(coupling.envelope, (tiling.tile_k, tiling.tile_n))
    for kt in range(tiling.k_tiles):
        ks = tiling.k_slice(kt)
        for nt in range(tiling.n_tiles):
            ns = tiling.n_slice(nt)
            rk, cn = ks.stop - ks.start, ns.stop - ns.start
            c_in = np.zeros((rk, rk))
            for j in range(rk):
                for i in range(rk):
                    if abs(j - i) <= hr:
                        c_in[j, i] = coupling.row_kernel[hr + j - i]
            c_out = np.zeros((cn, cn))
            for n in range(cn):
                for m in range(cn):
                    if abs(m - n) <= hc:
                        c_out[n, m] = coupling.col_kernel[hc + m - n]
            out[..., ks, ns] = c_in.T @ (env[:rk, :cn] * t[..., ks, ns]) @ c_out
    return out


def _coupling(tile_k, tile_n, edge=0.8, leak=0.03):
    j = np.linspace(-1, 1, tile_k)[:, None]
    n = np.linspace(-1, 1, tile_n)[None, :]
    envelope = edge ** (j**2 + n**2)  # fall-off to `edge` at the sides, edge**2 in corners
    kernel = np.array([leak, 1 - 2 * leak, leak])
    return SeparableCoupling(envelope, kernel, kernel)


def test_coupling_map_matches_the_dense_matrix_product(rng):
    tiling = _tiling(23, 17, 10, 6)  # partial tiles on both axes
    coupling = SeparableCoupling(rng.uniform(0.5, 1.0, (10, 6)),
                                 np.array([0.01, 0.05, 0.8, 0.1, 0.02]),  # asymmetric
                                 np.array([0.07, 0.9, 0.0]))
    t = rng.uniform(0, 1, (2, 23, 17))
    np.testing.assert_allclose(coupling.apply(t, tiling), _dense_reference(t, coupling, tiling),
                               rtol=1e-12, atol=1e-14)
    assert coupling.apply(t.astype(np.float32), tiling).dtype == np.float32


@pytest.mark.parametrize("scheme", ["split", "offset"])
def test_pre_distortion_recovers_a_reachable_mask(rng, scheme):
    """Targets made by the optics from known levels are solved back to them."""
    tiling = _tiling(40, 30, 16, 16)
    coupling = _coupling(16, 16)
    t_min = 0.05
    v = rng.uniform(-1, 1, (40, 30))
    rails = 2 if scheme == "split" else 1
    gain = compensation.gain(coupling, tiling, t_min, scheme, rails)  # (k_tiles, N)
    rows = np.repeat(gain, [16, 16, 8], axis=0)
    levels = compensation.pre_distort(v, rows, coupling, tiling, t_min, scheme)
    effective = coupling.apply(t_min + (1 - t_min) * levels, tiling)
    if scheme == "split":
        shown = (effective[0] - effective[1]) / (1 - t_min)
    else:
        shown = 2 * (effective[0] - t_min) / (1 - t_min) - 1
    np.testing.assert_allclose(shown, rows * v, atol=1e-5)
    assert levels.min() >= 0 and levels.max() <= 1


def test_gain_of_an_envelope_by_hand():
    envelope = np.array([[1.0, 0.9], [0.7, 0.8]])
    coupling = SeparableCoupling(envelope, np.array([1.0]), np.array([1.0]))
    tiling = _tiling(3, 2, 2, 2)  # K-tiles: rows {0, 1} and {2} (envelope row 0)
    np.testing.assert_allclose(compensation.gain(coupling, tiling, 0.0, "split", 2),
                               [[0.7, 0.8], [1.0, 0.9]])
    # Offset weights must also reach the mid-range pedestal: 2 (e - t_min) / (1 - t_min) - 1.
    t_min = 0.1
    expect = 2 * (np.array([[0.7, 0.8], [1.0, 0.9]]) - t_min) / (1 - t_min) - 1
    np.testing.assert_allclose(compensation.gain(coupling, tiling, t_min, "offset", 1), expect)
    dark = SeparableCoupling(np.array([[1.0, 0.05]]), np.array([1.0]), np.array([1.0]))
    with pytest.raises(ValueError, match="mask.compensate: the optics"):
        compensation.gain(dark, tiling, 0.1, "offset", 1)


@pytest.mark.parametrize(("row_kernel", "match"), [
    (np.array([0.5, 0.5]), "row_kernel: expected a 1-D finite non-negative kernel of odd length"),
    (np.array([-0.1, 1.0, 0.1]), "row_kernel"),
])
def test_bad_kernels_are_refused(row_kernel, match):
    with pytest.raises(ValueError, match=match):
        SeparableCoupling(np.ones((2, 2)), row_kernel, np.array([1.0]))


def _run(monkeypatch, coupling, cfg, w, cal, x):
    monkeypatch.setattr(quant, "_optics_map", lambda config: coupling)
    y = optical.matmul(x, optical.program(w, cfg, calibration=cal), cfg, seed=0)
    return metrics.sqnr_db(x.astype(np.float64) @ w, y)


def test_compensation_is_exact_with_exact_converters(monkeypatch, rng):
    w = rng.standard_normal((300, 90))
    x = rng.standard_normal((20, 300))
    cfg = optical.presets.get("ideal").replace({"core.inputs": 128, "core.outputs": 64,
                                                 "mask.compensate": True})
    coupling = _coupling(128, 64)
    assert _run(monkeypatch, coupling, cfg, w, None, x) > 100
    assert _run(monkeypatch, coupling, cfg.replace({"mask.compensate": False}), w, None, x) < 20


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compensation_brings_6_bit_sqnr_within_1_db_of_ideal_optics(monkeypatch, rng, dtype):
    """6-bit DAC and ADC, 8-bit mask, calibrated windows; illumination falling
    to 0.8 at the tile sides (0.64 in the corners) and 3% crosstalk to each
    neighbouring row and column."""
    w = rng.standard_normal((512, 128)).astype(dtype)
    cal = rng.standard_normal((256, 512)).astype(dtype)
    x = rng.standard_normal((64, 512)).astype(dtype)
    cfg = optical.presets.get("ideal").replace({
        "core.inputs": 256, "core.outputs": 64, "dac.bits": 6, "adc.bits": 6, "mask.bits": 8,
        "adc.full_scale": "calibrated"})
    coupling = _coupling(256, 64)
    clean = _run(monkeypatch, None, cfg, w, cal, x)
    distorted = _run(monkeypatch, coupling, cfg, w, cal, x)
    compensated = _run(monkeypatch, coupling, cfg.replace({"mask.compensate": True}), w, cal, x)
    print(f"clean {clean:.2f} dB, distorted {distorted:.2f} dB, compensated {compensated:.2f} dB")
    assert compensated > clean - 1.0, (clean, compensated)
    assert distorted < clean - 15.0, (clean, distorted)


def test_compensation_is_a_no_op_with_ideal_optics(rng):
    w = rng.standard_normal((50, 20))
    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 32, "optics.model": "ideal", "mask.compensate": False,
        "adc.full_scale": "rms", "outliers.policy": "none"})
    a = optical.program(w, cfg)
    b = optical.program(w, cfg.replace({"mask.compensate": True}))
    np.testing.assert_array_equal(a.transmissions, b.transmissions)
    np.testing.assert_array_equal(a.scale, b.scale)


class _CoherentInterleaved:
    """A nonlinear stand-in for the lens physics: the two rails of each output
    on adjacent physical columns (2n, 2n + 1), an illumination envelope per
    physical column, fields ``v = e sqrt(t)`` that interfere on each detector
    through a mutual-intensity matrix ``M`` (radius 1), and incoherent input
    coupling along the rows; nothing crosses a tile's edges."""

    def __init__(self, tile_n, rails, c_in=(0.03, 0.94, 0.03), m=(0.04, 0.9, 0.03)):
        self.rails = rails
        side, centre, mutual = m
        self.m = np.array([[side, mutual, 0.0], [mutual, centre, mutual], [0.0, mutual, side]])
        self.c_in = np.array(c_in)
        columns = np.linspace(-1, 1, rails * tile_n)
        self.field = np.sqrt(0.75 ** (columns**2))  # intensity falls to 0.75 at the sides

    def diagonal(self, tiling):
        e2 = self.field**2
        d = np.zeros((self.rails, tiling.k, tiling.n))
        for nt in range(tiling.n_tiles):
            ns = tiling.n_slice(nt)
            for r in range(self.rails):
                d[r, :, ns] = self.c_in[1] * self.m[1, 1] * e2[r:self.rails * (ns.stop - ns.start):self.rails]
        return d

    def apply(self, t, tiling):
        out = np.empty_like(t)
        for kt in range(tiling.k_tiles):
            ks = tiling.k_slice(kt)
            for nt in range(tiling.n_tiles):
                ns = tiling.n_slice(nt)
                tile = t[:, ks, ns]
                rows, cols = tile.shape[1], self.rails * tile.shape[2]
                phys = np.zeros((rows, cols))
                for r in range(self.rails):
                    phys[:, r::self.rails] = tile[r]
                v = self.field[:cols] * np.sqrt(phys)
                vp = np.pad(v, ((0, 0), (1, 1)))
                q = np.zeros_like(v)
                for a in range(3):
                    for b in range(3):
                        q += self.m[a, b] * vp[:, a:a + cols] * vp[:, b:b + cols]
                qp = np.pad(q, ((1, 1), (0, 0)))
                eff = sum(self.c_in[d] * qp[d:d + rows] for d in range(3))
                for r in range(self.rails):
                    out[r, ks, ns] = eff[:, r::self.rails]
        return out


@pytest.mark.parametrize(("weights", "balanced"), [("split", True), ("split", False),
                                                   ("offset", False)])
@pytest.mark.parametrize(("contrast", "floor_db"), [(50.0, 80.0), (float("inf"), 50.0)])
def test_compensation_of_nonlinear_interleaved_optics(monkeypatch, rng, weights, balanced,
                                                      contrast, floor_db):
    """The solver only needs a forward map and the self-coupling: it inverts
    coherent (nonlinear) crosstalk between interleaved rails as well. With a
    fully dark pixel (infinite contrast) the field ``sqrt(t)`` is steep at 0
    and the iteration settles less tightly (measured ~67 dB), still far
    beyond any converter's resolution."""
    w = rng.standard_normal((96, 40))
    x = rng.standard_normal((30, 96))
    rails = 2 if weights == "split" else 1
    optics = _CoherentInterleaved(20, rails)
    cfg = optical.presets.get("ideal").replace({
        "core.inputs": 48, "core.outputs": 20, "encoding.weights": weights,
        "detector.balanced": balanced, "mask.contrast_ratio": contrast, "mask.compensate": True})
    compensated = _run(monkeypatch, optics, cfg, w, None, x)
    distorted = _run(monkeypatch, optics, cfg.replace({"mask.compensate": False}), w, None, x)
    assert compensated > floor_db, compensated
    assert distorted < 25, distorted


@pytest.mark.parametrize("inputs", ["offset", "split"])
def test_compensation_of_the_lens_physics_within_1_db_of_ideal_optics(rng, inputs):
    """The real lens model (optical.physics.crosstalk): a 10 mm fan-in pupil
    (1.5% of a column's light on each neighbouring detector, interfering), 6 um
    Gaussian sources (4% on each neighbouring row) whose fan-out beam falls to
    0.85 at the mask edges; 6-bit DAC and ADC, 8-bit mask, calibrated windows.

    Converter-limited (no shot or read noise), compensation restores the SQNR
    of ideal optics to within 1 dB. With iris-like's photon and TIA noise it
    cannot return the light the fall-off and the cancelled crosstalk cost (the
    gain the digital side divides out), so there it stays within 2.5 dB."""
    w = rng.standard_normal((256, 128))
    cal = rng.standard_normal((256, 256))
    x = rng.standard_normal((64, 256))
    noisy = optical.presets.get("iris-like").replace({
        "core.inputs": 128, "core.outputs": 64, "dac.bits": 6, "adc.bits": 6,
        "adc.enob_loss": 0.0, "outliers.policy": "none", "encoding.inputs": inputs,
        "optics.fan_in_aperture": 10e-3, "optics.beam_profile": "gaussian",
        "optics.beam_waist": 6e-6})

    def sqnr(config):
        y = optical.matmul(x, optical.program(w, config, calibration=cal), config, seed=0)
        return metrics.sqnr_db(x @ w, y)

    for cfg, allowed in ((noisy.replace({"source.photons_per_mac": math.inf}), 1.0),
                         (noisy, 2.5)):
        clean = sqnr(cfg.replace({"optics.model": "ideal"}))
        distorted = sqnr(cfg.replace({"mask.compensate": False}))
        compensated = sqnr(cfg)
        print(f"clean {clean:.2f} dB, distorted {distorted:.2f} dB, "
              f"compensated {compensated:.2f} dB")
        assert compensated > clean - allowed, (clean, distorted, compensated)
        assert distorted < clean - 10.0, (clean, distorted, compensated)


def test_pre_distortion_stops_within_a_fraction_of_a_mask_level(rng):
    """An 8-bit mask stops iterating once no value moves by 1/32 of a level:
    the strong contraction of the lens physics leaves the solution well
    within that of the fixed point, the loaded mask differs from the fully
    converged one in a few levels at most (by one), and it takes fewer
    steps than converging to ``TOLERANCE``."""
    from optical.kernels import _program

    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 128, "core.outputs": 64, "optics.fan_in_aperture": 10e-3,
        "optics.beam_profile": "gaussian", "optics.beam_waist": 6e-6})
    t_min, bits = cfg.mask.min_transmission, cfg.mask.bits
    tol = compensation.tolerance(bits, t_min)
    level = (1 - t_min) / (2**bits - 1)
    assert tol == pytest.approx(compensation.LEVEL_FRACTION * level)
    assert compensation.tolerance(None, t_min) == compensation.TOLERANCE
    tiling = _tiling(256, 192, 128, 64)
    v = rng.uniform(-1, 1, (256, 192))
    optics = quant._optics_map(cfg)
    gain = compensation.gain(optics, tiling, t_min, "split", 2)
    rows = quant._per_row(gain, tiling)
    converged = compensation.pre_distort(v, rows, optics, tiling, t_min, "split", tol=1e-13)
    stopped = compensation.pre_distort(v, rows, optics, tiling, t_min, "split", tol=tol)
    # levels are in units of 1 - t_min: one mask level is 1 / (2**bits - 1)
    assert np.max(np.abs(stopped - converged)) < 0.1 * compensation.LEVEL_FRACTION / (2**bits - 1)
    top = 2**bits - 1
    flips = np.abs(np.rint(stopped * top) - np.rint(converged * top))
    assert flips.max() <= 1 and np.count_nonzero(flips) <= 1e-3 * flips.size
    steps = {}
    for name, t in (("level", tol), ("fine", compensation.TOLERANCE)):
        steps[name] = _program.lens_mask(v.copy(), gain, optics.diagonal(tiling), tiling,
                                         optics.kernels, t_min, "split", bits, tol=t,
                                         max_iter=compensation.MAX_ITERATIONS)[2]
    assert steps["level"].max() < steps["fine"].min(), steps


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("scheme", ["split", "offset"])
def test_iris_like_lens_reaches_every_full_scale_pattern(backend, scheme):
    """The iris-like fan-in relay has negative interference terms between
    neighbouring columns (M[0, +-1] < 0): an open mask then leaks *less* into
    a pixel than a pattern lit only where the terms are positive (a split
    rail between two bright ones, a dark pixel among bright ones). The gain
    must hold for those too: with exact converters and no noise, full-scale
    all-positive weights and a checkerboard come out exact. (With the open
    mask's leak as the bound, all-ones weights came out 0.33% short.)"""
    iris = optical.presets.get("iris-like")
    cfg = optical.presets.get("ideal").replace({
        **{p: v for p, v in iris.items() if p.startswith("optics.")},
        "mask.contrast_ratio": 50.0, "mask.compensate": True, "core.inputs": 16,
        "core.outputs": 16, "encoding.weights": scheme, "detector.shot_noise": "gaussian"})
    kern = optical.physics.crosstalk.kernels(cfg)
    centre = kern.radius
    assert np.real(kern.output_mutual[centre, centre + 1]) < 0  # the case this is about
    checker = np.indices((16, 16)).sum(axis=0) % 2 * 2.0 - 1.0
    for w in (np.ones((16, 16)), checker, np.abs(checker) * (checker > 0)):
        w = w + 0.0
        for x in (np.ones((3, 16)), np.eye(16)):
            y = optical.matmul(x, w, cfg, seed=0, backend=backend)
            np.testing.assert_allclose(y, x @ w, rtol=0, atol=1e-7 * (np.abs(x) @ np.abs(w)).max())


@pytest.mark.parametrize("contrast", [5.0, 10.0])
def test_split_gain_holds_at_a_tiles_edge_columns_at_low_contrast(contrast):
    """The two rails of a tile's first output leak unequally (the positive
    rail, on the tile's first physical column, has a neighbour on one side
    only), and at low contrast the closed rail's own pedestal counts: the
    gain must couple the rails. Full-scale +-1 weights, exact converters, no
    noise: every column exact. (With each rail's reach taken alone, the first
    column missed by 1.0e-2 at 5:1 and 2.9e-3 at 10:1 for +1, the last for -1.)"""
    iris = optical.presets.get("iris-like")
    cfg = optical.presets.get("ideal").replace({
        **{p: v for p, v in iris.items() if p.startswith("optics.")},
        "optics.beam_waist": 1.5e-6, "optics.beam_profile": "gaussian",
        "optics.defocus_waves": 0.3, "optics.kernel_radius": 2,
        "mask.contrast_ratio": contrast, "mask.compensate": True, "core.inputs": 12,
        "core.outputs": 12, "encoding.weights": "split"})
    for sign in (1.0, -1.0):
        w = np.full((12, 12), sign)
        y = optical.matmul(np.eye(12), w, cfg, seed=0)  # the matrix the light applies
        np.testing.assert_allclose(y, w, rtol=0, atol=1e-6)


def test_offset_gain_of_a_positive_coupling_by_hand():
    """Offset weights, a linear coupling with every term positive (0.1 to each
    neighbouring row and column): a pixel's neighbours put between t_min L
    and L on it (L = 1 - 0.64 inside the tile, less at its edges), so its top
    target is bounded by D + t_min L (neighbours closed) and its bottom one by
    D t_min + L (open). The bound is reached: every +-1 pattern comes out
    exact at that gain. (Counting the closed neighbours' leak as -t_min L
    refused these optics.)"""
    kernel = np.array([0.1, 0.8, 0.1])
    coupling = SeparableCoupling(np.ones((8, 8)), kernel, kernel)
    tiling = _tiling(8, 8, 8, 8)
    t_min, d = 0.2, 0.64
    # The worst row is an edge row, whose missing neighbour row takes 0.1 of L:
    # top 2 (D + t_min L - t_min) / (1 - t_min) - 1 with L = 0.26 (edge column: 0.17);
    # the bottom bound (interior, L = 0.36) is 1 - 2 (D t_min + L - t_min) / (1 - t_min) = 0.28.
    top = [2 * (d + t_min * leak - t_min) / (1 - t_min) - 1 for leak in (0.17, 0.26)]
    expect = np.array([top[0]] + [top[1]] * 6 + [top[0]])
    g = compensation.gain(coupling, tiling, t_min, "offset", 1)
    np.testing.assert_allclose(g, expect[None], rtol=1e-12)
    _assert_offset_patterns_reached(coupling, tiling, t_min, g, seed=0)


def test_lens_leak_parts_are_the_terms_of_lit_pixels_and_pairs():
    """leak_parts against the lens map itself: the effective transmission of a
    pixel is a quadratic form of the mask's amplitudes (coherent output
    coupling), so on an open mask its terms are what one lit pixel gives
    (the pixel's own: the diagonal) and what a lit pair adds over its two
    pixels alone (interference). The positive ones sum to ``positive``,
    the magnitudes of the negative ones to ``negative``; partial tiles on
    both axes, rails interleaved."""
    import itertools

    iris = optical.presets.get("iris-like")
    cfg = optical.presets.get("ideal").replace({
        **{p: v for p, v in iris.items() if p.startswith("optics.")},
        "optics.beam_waist": 1.5e-6, "optics.beam_profile": "gaussian",
        "optics.defocus_waves": 0.3, "optics.kernel_radius": 2,
        "mask.contrast_ratio": 10.0, "core.inputs": 2, "core.outputs": 4,
        "encoding.weights": "split"})
    optics = quant._optics_map(cfg)
    tiling = _tiling(3, 6, 2, 4)
    shape = (2, 3, 6)
    n = math.prod(shape)

    def lit(*pixels):
        t = np.zeros(n)
        t[list(pixels)] = 1.0
        return optical.physics.crosstalk.effective_transmissions(
            t.reshape(shape), tiling, cfg).ravel()

    single = np.array([lit(j) for j in range(n)])  # single[j]: pixel j alone
    terms = [single[j] * (np.arange(n) != j) for j in range(n)]
    terms += [lit(a, b) - single[a] - single[b] for a, b in itertools.combinations(range(n), 2)]
    terms = np.array(terms)
    positive = np.maximum(terms, 0).sum(axis=0).reshape(shape)
    negative = np.maximum(-terms, 0).sum(axis=0).reshape(shape)
    assert negative.max() > 1e-3 and positive.max() > 1e-3  # both kinds of term present
    got_positive, got_negative = optics.leak_parts(tiling)
    np.testing.assert_allclose(got_positive, positive, rtol=0, atol=1e-12)
    np.testing.assert_allclose(got_negative, negative, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.broadcast_to(optics.diagonal(tiling), shape),
                               single[np.arange(n), np.arange(n)].reshape(shape),
                               rtol=0, atol=1e-15)


class _PartsOptics:
    """Optics that state their self-coupling and leak parts outright
    (``gain`` needs no more of optics that define ``leak_parts``)."""

    def __init__(self, diagonal, positive, negative):
        self._d, self._p, self._n = diagonal, positive, negative

    def diagonal(self, tiling):
        return self._d

    def leak_parts(self, tiling):
        return self._p, self._n


def test_gain_of_signed_leak_parts_and_unequal_rails_by_hand():
    """Each pixel's leak lies in [t_min P - N, P - t_min N] (P, N its positive
    and negative parts). Split: +1 (t+ = 1, t- = t_min) is reachable when
    D+ + least+ - (t_min D- + most-) >= g (1 - t_min), -1 with the rails
    swapped. Offset: the top target t_min + (1 - t_min)(1 + g) / 2 <= D + least,
    the bottom one t_min + (1 - t_min)(1 - g) / 2 >= t_min D + most. Values
    chosen so that each bound binds somewhere: the rails' diagonals differ,
    and the offset pixel with D + P - N > 1 is bound by its bottom target."""
    t_min = 0.1
    tiling = _tiling(2, 3, 2, 3)
    # split: rails (2), rows (2), columns (3)
    d = np.array([[[0.95, 0.90, 0.85]], [[0.80, 0.92, 0.97]]])  # (rails, 1, N)
    p = np.array([[[0.02, 0.05, 0.01], [0.03, 0.00, 0.04]],
                  [[0.06, 0.01, 0.02], [0.01, 0.03, 0.00]]])
    n = np.array([[[0.01, 0.00, 0.03], [0.02, 0.04, 0.01]],
                  [[0.00, 0.02, 0.01], [0.05, 0.01, 0.02]]])
    expect = np.full(3, np.inf)
    for k in range(2):
        for c in range(3):
            least = [t_min * p[r, k, c] - n[r, k, c] for r in range(2)]
            most = [p[r, k, c] - t_min * n[r, k, c] for r in range(2)]
            plus = d[0, 0, c] + least[0] - (t_min * d[1, 0, c] + most[1])
            minus = d[1, 0, c] + least[1] - (t_min * d[0, 0, c] + most[0])
            expect[c] = min(expect[c], plus / (1 - t_min), minus / (1 - t_min))
    got = compensation.gain(_PartsOptics(d, p, n), tiling, t_min, "split", 2)
    np.testing.assert_allclose(got, expect[None], rtol=1e-12)
    # offset: one rail; column 0 has D + P - N = 1.1 (bottom binds), column 2 a bright
    # pixel with little leak (top binds)
    d1 = np.array([[[0.9, 0.8, 0.95]]])
    p1 = np.array([[[0.3, 0.1, 0.02], [0.05, 0.05, 0.01]]])
    n1 = np.array([[[0.1, 0.02, 0.0], [0.0, 0.05, 0.03]]])
    expect = np.full(3, np.inf)
    for k in range(2):
        for c in range(3):
            least = t_min * p1[0, k, c] - n1[0, k, c]
            most = p1[0, k, c] - t_min * n1[0, k, c]
            top = 2 * (d1[0, 0, c] + least - t_min) / (1 - t_min) - 1
            bottom = 1 - 2 * (t_min * d1[0, 0, c] + most - t_min) / (1 - t_min)
            expect[c] = min(expect[c], top, bottom)
    assert expect[0] == pytest.approx(1 - 2 * (0.09 + 0.3 - 0.01 - 0.1) / 0.9)  # bottom
    got = compensation.gain(_PartsOptics(d1, p1, n1), tiling, t_min, "offset", 1)
    np.testing.assert_allclose(got, expect[None], rtol=1e-12)


def test_offset_gain_bound_by_the_bottom_target_by_hand():
    """A coupling that brightens (envelope 1.1, kernel [0.1, 0.8, 0.1]): D = 0.704
    and an inner pixel's open neighbours put L = 0.396 on it, so D + L > 1 and
    a closed pixel among open ones bounds the gain: 1 - 2 (D t_min + L - t_min)
    / (1 - t_min). Every +-1 pattern is reached exactly at that gain."""
    kernel = np.array([0.1, 0.8, 0.1])
    coupling = SeparableCoupling(np.full((8, 8), 1.1), kernel, kernel)
    tiling = _tiling(8, 8, 8, 8)
    t_min = 0.2
    d = 0.64 * 1.1

    def top(leak):
        return 2 * (d + t_min * leak - t_min) / (1 - t_min) - 1

    def bottom(leak):
        return 1 - 2 * (d * t_min + leak - t_min) / (1 - t_min)

    # edge columns: corner pixels (L = 0.17 * 1.1) bound the top, edge-row pixels
    # (L = 0.26 * 1.1) the bottom; inner columns: inner pixels (L = 0.36 * 1.1)
    edge = min(top(0.17 * 1.1), bottom(0.26 * 1.1))
    inner = min(top(0.26 * 1.1), bottom(0.36 * 1.1))
    assert inner == bottom(0.36 * 1.1)
    expect = np.array([edge] + [inner] * 6 + [edge])
    g = compensation.gain(coupling, tiling, t_min, "offset", 1)
    np.testing.assert_allclose(g, expect[None], rtol=1e-12)
    _assert_offset_patterns_reached(coupling, tiling, t_min, g, seed=1)


def test_a_gain_of_exactly_zero_is_refused():
    """Offset weights under an envelope of 0.5 with t_min = 0: the top target
    at gain g is (1 + g) / 2 and an open pixel gives 0.5, so g = 0 exactly --
    no positive gain works, and gain() says so (its result is in (0, 1])."""
    coupling = SeparableCoupling(np.full((2, 2), 0.5), np.array([1.0]), np.array([1.0]))
    tiling = _tiling(2, 2, 2, 2)
    assert 2 * (0.5 - 0.0) / (1 - 0.0) - 1 == 0.0
    with pytest.raises(ValueError, match="mask.compensate: the optics"):
        compensation.gain(coupling, tiling, 0.0, "offset", 1)


def _assert_offset_patterns_reached(coupling, tiling, t_min, g, *, seed):
    """Offset weights of full scale (all +1, all -1, a checkerboard, its
    negative, a random sign pattern) come out exact at gain ``g`` (8 x 8)."""
    checker = np.indices((8, 8)).sum(axis=0) % 2 * 2.0 - 1
    rows = np.broadcast_to(g, (8, 8))
    patterns = (np.ones((8, 8)), -np.ones((8, 8)), checker, -checker,
                np.random.default_rng(seed).choice([-1.0, 1.0], (8, 8)))
    for v in patterns:
        levels = compensation.pre_distort(v, rows, coupling, tiling, t_min, "offset",
                                          tol=1e-13, max_iter=5000)
        shown = 2 * (coupling.apply(t_min + (1 - t_min) * levels, tiling)[0] - t_min) \
            / (1 - t_min) - 1
        np.testing.assert_allclose(shown, rows * v, rtol=0, atol=1e-10)


#: Strong row coupling (as test_program_fast.py's STRONG) on an otherwise ideal machine.
_STRONG = {"optics.fan_in_aperture": 10e-3, "optics.beam_profile": "gaussian",
           "optics.beam_waist": 6e-6}


@pytest.mark.parametrize("weights", ["split", "offset"])
@pytest.mark.parametrize("k", [97, 50])  # last K-tile of 1 row, of 2 rows (48-input core)
def test_compensation_of_a_short_last_k_tile_reaches_the_exact_product(weights, k):
    """A K-tile of one or two rows has less row leak, so its compensation gain
    differs from a full tile's (by ~4-8% here); the fused lens kernel must
    pre-distort each K-tile towards its own gain. On a noise-free machine with
    a continuous mask, compensated lens optics then give x @ w (float64) up to
    the Jacobi tolerance (1e-6): truth is the exact product."""
    changes = {"core.inputs": 48, "core.outputs": 40, "optics.model": "diffraction",
               "mask.compensate": True, "mask.contrast_ratio": 50.0, **_STRONG}
    if weights == "offset":
        changes |= {"encoding.weights": "offset", "detector.balanced": False}
    cfg = optical.presets.get("ideal").replace(changes)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, 60))
    x = rng.standard_normal((8, k))
    ref = x @ w
    y = optical.matmul(x, w, cfg, seed=0, backend="numba")
    assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()


def test_compensation_of_a_single_weight_runs_until_no_pixel_moves():
    """A 1 x 1 matrix (one pixel, two split rails coupled by the lens): the
    projected Jacobi must iterate until *no* value moves by the tolerance
    (compensation.pre_distort: ``max |moved - x| < tol``), not stop while one
    still does. Truth: the exact product, to well inside the tolerance."""
    cfg = optical.presets.get("ideal").replace({
        "core.inputs": 48, "core.outputs": 40, "optics.model": "diffraction",
        "mask.compensate": True, "mask.contrast_ratio": 50.0, **_STRONG})
    rng = np.random.default_rng(1)
    w = rng.standard_normal((1, 1))
    x = rng.standard_normal((4, 1))
    ref = x @ w
    y = optical.matmul(x, w, cfg, seed=0, backend="numba")
    assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()


def test_the_reach_kept_per_lens_is_bounded_over_a_contrast_sweep(rng):
    """Each tile shape's reach is kept with the lens kernels, keyed by the
    mask contrast too: a soak test found one entry added for good per
    contrast value (2-8 KB each, ~100-400 MB over a 10k-point sweep on one
    lens). Kept within a bound; a reach computed again is the same."""
    from optical.physics import crosstalk

    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 16, "core.outputs": 8, "adc.full_scale": "rms",
        "outliers.policy": "none"})
    w = rng.standard_normal((16, 8)).astype(np.float32)
    first = optical.program(w, cfg)
    for contrast in np.linspace(60.0, 90.0, 200):
        optical.program(w, cfg.replace({"mask.contrast_ratio": float(contrast)}))
    assert 0 < len(compensation._REACH[crosstalk.kernels(cfg)]) <= 150
    np.testing.assert_array_equal(optical.program(w, cfg).transmissions, first.transmissions)


def test_a_reach_another_thread_evicts_after_the_check_is_still_read(monkeypatch):
    """A caches audit held a thread between the reach cache's membership
    check and its read while another programmed 128 other contrasts on the
    same lens: the first raised KeyError (a threaded Dask worker's contrast
    sweep). The cache is read once; here a dict that answers "present" and
    then drops the key, as the other thread did, stands in for the race."""
    from optical import quant
    from optical.physics import crosstalk

    class EvictedAfterTheCheck(dict):
        def __contains__(self, key):
            present = dict.__contains__(self, key)
            self.pop(key, None)
            return present

    cfg = optical.presets.get("iris-like").replace({"core.inputs": 16, "core.outputs": 16})
    optics = quant._optics_map(cfg)
    tiling = quant.Tiling(16, 16, 16, 16)
    expected = quant._gain(optics, tiling, cfg)  # cached, then taken away as it is read
    racing = EvictedAfterTheCheck(compensation._REACH[crosstalk.kernels(cfg)])
    monkeypatch.setitem(compensation._REACH, crosstalk.kernels(cfg), racing)
    np.testing.assert_array_equal(quant._gain(optics, tiling, cfg), expected)
