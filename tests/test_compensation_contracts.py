"""Contracts of optical.compensation left open by a mutation audit (mut18):
what SeparableCoupling refuses, its map on tiles no wider than its kernels
(against the documented sum, written out here), gain's upper bound of 1 and
its cache of the lens optics' reach keyed by t_min, tolerance's floor, the
solver's stopping rule and its clipping of unreachable targets to the mask's
range, and the analytic inverse of a two-pixel coupling."""

import numpy as np
import pytest

import optical
from optical import compensation, quant
from optical.compensation import SeparableCoupling


def _tiling(k, n, tile_k, tile_n):
    return quant.Tiling(k, n, tile_k, tile_n)


@pytest.mark.parametrize(("envelope", "match"), [
    (np.array([[1.0, -0.1], [0.5, 0.5]]), "envelope: expected finite non-negative"),
    (np.array([[1.0, np.nan], [0.5, 0.5]]), "envelope"),
    (np.array([[1.0, np.inf], [0.5, 0.5]]), "envelope"),
    (np.ones((1, 2, 2)), "envelope"),
])
def test_bad_envelopes_are_refused(envelope, match):
    with pytest.raises(ValueError, match=match):
        SeparableCoupling(envelope, np.array([1.0]), np.array([1.0]))


def test_a_kernel_of_two_dimensions_is_refused():
    with pytest.raises(ValueError, match="col_kernel: expected a 1-D"):
        SeparableCoupling(np.ones((2, 2)), np.array([1.0]), np.array([[1.0]]))



@pytest.mark.parametrize("kernel", [np.array([np.nan, 1.0, np.nan]),
                                    np.array([np.inf, 1.0, 0.0])])
def test_a_kernel_that_is_not_finite_is_refused(kernel):
    """NaN passed the ``kernel < 0`` check (and inf passed it outright)."""
    with pytest.raises(ValueError, match="row_kernel: expected a 1-D finite non-negative"):
        SeparableCoupling(np.ones((2, 2)), kernel, np.array([1.0]))


def test_the_public_solvers_refuse_what_they_cannot_mean():
    """An audit: a misspelt scheme was taken for offset weights (one rail,
    the offset bound: gain 0.27 where split gives 0.28-0.38); NaN weights
    came back as NaN "levels in [0, 1]"; a min_transmission of 1.5 gave
    levels in [-1, 0], one of 1.0 all-NaN gains with a RuntimeWarning (the
    "no positive gain" check let NaN through) and a tolerance of 1e-6."""
    coupling = SeparableCoupling(np.ones((4, 4)), np.array([0.1, 0.8, 0.1]),
                                 np.array([0.1, 0.8, 0.1]))
    tiling = _tiling(4, 4, 4, 4)
    v = np.random.default_rng(0).uniform(-1, 1, (4, 4))
    rows = np.full((4, 4), 0.27)
    with pytest.raises(ValueError, match=r"^scheme: 'splt' is not valid; valid: 'split', "):
        compensation.gain(coupling, tiling, 0.02, "splt", 2)
    with pytest.raises(ValueError, match=r"^scheme: 'splt' is not valid"):
        compensation.pre_distort(v, rows, coupling, tiling, 0.02, "splt")
    for t_min in (1.0, 1.5, -0.1, float("nan"), True):
        for call in (lambda t=t_min: compensation.gain(coupling, tiling, t, "split", 2),
                     lambda t=t_min: compensation.pre_distort(v, rows, coupling, tiling, t,
                                                              "split"),
                     lambda t=t_min: compensation.tolerance(8, t)):
            with pytest.raises(ValueError, match=r"^min_transmission: .* must be a number in "
                                                 r"\[0, 1\)"):
                call()
    bad = v.copy()
    bad[1, 2] = np.nan
    with pytest.raises(ValueError, match=r"^v: expected a finite array of the tiling's shape "
                                         r"\(4, 4\), got shape \(4, 4\) with NaN"):
        compensation.pre_distort(bad, rows, coupling, tiling, 0.02, "split")
    with pytest.raises(ValueError, match=r"^gain_rows: .*got shape \(4, 3\)$"):
        compensation.pre_distort(v, rows[:, :3], coupling, tiling, 0.02, "split")
    # The valid calls still solve (both schemes' ranges).
    levels = compensation.pre_distort(v, rows, coupling, tiling, 0.02, "split")
    assert levels.shape == (2, 4, 4) and np.all((levels >= 0) & (levels <= 1))
    gains = compensation.gain(coupling, tiling, 0.02, "split", 2)
    assert np.all((gains > 0) & (gains <= 1))

def _documented_map(t, coupling, tiling):
    """``T_eff[i, m] = sum_{d, e} row[h + d] col[h + e] E[i + d, m - e] T[i + d, m - e]``
    within each tile (zero outside it), summed term by term."""
    row, col = coupling.row_kernel, coupling.col_kernel
    hr, hc = row.size // 2, col.size // 2
    env = np.broadcast_to(coupling.envelope, (tiling.tile_k, tiling.tile_n))
    out = np.zeros_like(t)
    for kt in range(tiling.k_tiles):
        ks = tiling.k_slice(kt)
        for nt in range(tiling.n_tiles):
            ns = tiling.n_slice(nt)
            rk, cn = ks.stop - ks.start, ns.stop - ns.start
            for i in range(rk):
                for m in range(cn):
                    total = np.zeros(t.shape[:-2])
                    for d in range(-hr, hr + 1):
                        for e in range(-hc, hc + 1):
                            if 0 <= i + d < rk and 0 <= m - e < cn:
                                total = total + (row[hr + d] * col[hc + e] * env[i + d, m - e]
                                                 * t[..., ks.start + i + d, ns.start + m - e])
                    out[..., ks.start + i, ns.start + m] = total
    return out


@pytest.mark.parametrize(("tile_k", "tile_n"), [(2, 2), (1, 3), (3, 2)])
def test_coupling_of_tiles_no_wider_than_the_kernels(rng, tile_k, tile_n):
    """Kernels reaching across a whole tile (radius 1 and 2 on tiles of 1 to 3
    pixels): a pixel still takes the light of every neighbour in its tile."""
    coupling = SeparableCoupling(rng.uniform(0.5, 1.0, (tile_k, tile_n)),
                                 np.array([0.06, 0.9, 0.04]),
                                 np.array([0.01, 0.03, 0.85, 0.07, 0.02]))
    tiling = _tiling(5, 5, tile_k, tile_n)
    t = rng.uniform(0, 1, (2, 5, 5))
    np.testing.assert_allclose(coupling.apply(t, tiling), _documented_map(t, coupling, tiling),
                               rtol=1e-12, atol=1e-15)


def test_gain_is_at_most_one_under_a_brightening_envelope():
    """gain's result is in (0, 1]: an envelope of 1.5 would allow 1.5 with
    split weights (D+ = 1.5, t_min = 0, no crosstalk), and the gain says 1.
    Offset weights' bottom target binds below 1 there: 1 - 2 (1.5 t_min - t_min) / (1 - t_min)."""
    coupling = SeparableCoupling(np.full((2, 3), 1.5), np.array([1.0]), np.array([1.0]))
    tiling = _tiling(2, 3, 2, 3)
    np.testing.assert_array_equal(compensation.gain(coupling, tiling, 0.0, "split", 2),
                                  np.ones((1, 3)))
    t_min = 0.1
    np.testing.assert_allclose(compensation.gain(coupling, tiling, t_min, "offset", 1),
                               np.full((1, 3), 1 - 2 * (1.5 * t_min - t_min) / (1 - t_min)),
                               rtol=1e-12)


class _Uncached:
    """The same optics without their kernels: gain() keeps no reach for them."""

    def __init__(self, optics):
        self._optics = optics

    def diagonal(self, tiling):
        return self._optics.diagonal(tiling)

    def apply(self, t, tiling):
        return self._optics.apply(t, tiling)

    def leak_parts(self, tiling):
        return self._optics.leak_parts(tiling)


def test_lens_gain_kept_with_the_kernels_follows_the_min_transmission():
    """The lens optics' reach is kept with their kernels, which do not depend
    on the mask's contrast: a later weight load of the same optics at another
    contrast ratio gets the gain of its own min_transmission, not the first's."""
    iris = optical.presets.get("iris-like")
    cfg = optical.presets.get("ideal").replace({
        **{p: v for p, v in iris.items() if p.startswith("optics.")},
        "core.inputs": 12, "core.outputs": 12, "encoding.weights": "split"})
    tiling = _tiling(20, 18, 12, 12)  # partial tiles on both axes
    gains = {}
    for contrast in (50.0, 5.0):
        optics = quant._optics_map(cfg.replace({"mask.contrast_ratio": contrast}))
        t_min = 1 / contrast
        gains[contrast] = compensation.gain(optics, tiling, t_min, "split", 2)
        fresh = compensation.gain(_Uncached(optics), tiling, t_min, "split", 2)
        np.testing.assert_array_equal(gains[contrast], fresh)
    assert np.all(gains[5.0] < gains[50.0])  # the closed rail's pedestal costs gain


def test_tolerance_is_a_fraction_of_a_level_but_never_below_the_floor():
    t_min = 0.1
    assert compensation.tolerance(4, t_min) == pytest.approx(
        compensation.LEVEL_FRACTION * 0.9 / 15, rel=1e-15)
    # 24 bits: 1/32 of a level is 1.3e-9, below TOLERANCE
    assert compensation.LEVEL_FRACTION * 0.9 / (2**24 - 1) < compensation.TOLERANCE
    assert compensation.tolerance(24, t_min) == compensation.TOLERANCE


class _Counting:
    """A SeparableCoupling that counts the forward maps asked of it."""

    def __init__(self, coupling):
        self.coupling, self.calls = coupling, 0

    def diagonal(self, tiling):
        return self.coupling.diagonal(tiling)

    def apply(self, t, tiling):
        self.calls += 1
        return self.coupling.apply(t, tiling)


@pytest.mark.parametrize("scheme", ["split", "offset"])
def test_pre_distortion_stops_at_tol_or_max_iter(rng, scheme):
    """Each tile iterates until no value moves by more than tol, at most
    max_iter times: with a tolerance above any step every tile takes one
    step; with tol 0, max_iter steps; at the default tolerance it stops well
    before MAX_ITERATIONS (a strong contraction)."""
    kernel = np.array([0.03, 0.94, 0.03])
    coupling = SeparableCoupling(np.full((4, 4), 0.9), kernel, kernel)
    tiling = _tiling(8, 6, 4, 4)  # 2 x 2 tiles
    v = rng.uniform(-1, 1, (8, 6))
    rows = np.full((8, 6), 0.5)
    for tol, max_iter, steps in ((10.0, 200, 1), (0.0, 7, 7)):
        optics = _Counting(coupling)
        compensation.pre_distort(v, rows, optics, tiling, 0.1, scheme, tol=tol,
                                 max_iter=max_iter)
        assert optics.calls == 4 * steps, (tol, max_iter)
    optics = _Counting(coupling)
    compensation.pre_distort(v, rows, optics, tiling, 0.1, scheme)
    assert optics.calls <= 4 * 20


def test_unreachable_targets_are_clipped_to_the_mask_range():
    """Asked for more than the optics can show (gain 1 under an envelope of
    0.8), the levels stay in [0, 1]: the pixels that cannot get there are
    fully open (offset) or their rail fully open and the other closed (split)."""
    coupling = SeparableCoupling(np.full((2, 2), 0.8), np.array([1.0]), np.array([1.0]))
    tiling = _tiling(2, 2, 2, 2)
    v = np.array([[1.0, -1.0], [0.5, 0.0]])
    rows = np.ones((2, 2))
    t_min = 0.1
    offset = compensation.pre_distort(v, rows, coupling, tiling, t_min, "offset")
    assert offset.shape == (1, 2, 2)
    assert offset.min() >= 0 and offset.max() <= 1
    assert offset[0, 0, 0] == 1.0  # target 1.0 > 0.8: open
    # reachable ones are exact: 0.8 (t_min + 0.9 u) = t_min + 0.9 (g v + 1) / 2
    for (i, j) in ((1, 0), (1, 1)):
        target = t_min + 0.9 * (v[i, j] + 1) / 2
        assert offset[0, i, j] == pytest.approx((target / 0.8 - t_min) / 0.9, abs=1e-9)
    split = compensation.pre_distort(v, rows, coupling, tiling, t_min, "split")
    assert split.min() >= 0 and split.max() <= 1
    np.testing.assert_allclose(split[:, 0, 0], [1.0, 0.0], atol=0)
    np.testing.assert_allclose(split[:, 0, 1], [0.0, 1.0], atol=0)
    # 0.5 is reachable: 0.8 (t+ - t-) = 0.9 * 0.5
    assert split[0, 1, 0] - split[1, 1, 0] == pytest.approx(0.5 / 0.8, abs=1e-9)


@pytest.mark.parametrize("scheme", ["split", "offset"])
def test_pre_distortion_is_the_inverse_of_a_two_pixel_coupling(scheme):
    """Two rows sharing light ([a, b, a] row kernel, one column): the effective
    transmissions are C t with C = [[b, a], [a, b]] (each row keeps b of its
    source's light and takes a of the other's), so the solution is C^-1 of the
    target, solved here with numpy."""
    a, b, t_min = 0.1, 0.8, 0.05
    coupling = SeparableCoupling(np.ones((2, 1)), np.array([a, b, a]), np.array([1.0]))
    tiling = _tiling(2, 1, 2, 1)
    c = np.array([[b, a], [a, b]])
    v = np.array([[0.9], [-0.4]])
    rails = 2 if scheme == "split" else 1
    g = compensation.gain(coupling, tiling, t_min, scheme, rails)
    rows = np.broadcast_to(g, (2, 1))
    levels = compensation.pre_distort(v, rows, coupling, tiling, t_min, scheme, tol=1e-14,
                                      max_iter=10_000)
    t = t_min + (1 - t_min) * levels[:, :, 0]  # (rails, 2)
    if scheme == "offset":
        target = t_min + (1 - t_min) * (rows[:, 0] * v[:, 0] + 1) / 2
        np.testing.assert_allclose(t[0], np.linalg.solve(c, target), rtol=0, atol=1e-12)
    else:
        # the difference of the rails is C^-1 of the target; row 0 drives the
        # positive rail, row 1 the negative one (the other rail closed)
        diff = np.linalg.solve(c, rows[:, 0] * (1 - t_min) * v[:, 0])
        assert diff[0] > 0 > diff[1]
        np.testing.assert_allclose(t[0] - t[1], diff, rtol=0, atol=1e-12)
        np.testing.assert_allclose([t[1, 0], t[0, 1]], [t_min, t_min], rtol=0, atol=1e-15)


def test_separable_diagonal_is_each_pixels_own_derivative_even_with_a_larger_neighbour_tap():
    """D[i, m] is the derivative of a pixel's own effective transmission with
    respect to its transmission (module docstring): for a linear coupling,
    apply() of a mask with that pixel alone open, read at that pixel. Here
    the kernels leak more to one neighbour than they keep (centre 0.3 and 0.2,
    a neighbour 0.5 and 0.6), so the centre taps are not the largest."""
    from optical.quant import Tiling

    envelope = np.linspace(0.6, 1.0, 5)[None, :] * np.linspace(0.8, 1.0, 4)[:, None]
    optics = SeparableCoupling(envelope, np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.2, 0.6]))
    tiling = Tiling(4, 5, 4, 5)
    diag = np.broadcast_to(optics.diagonal(tiling), (4, 5))
    for i in range(4):
        for m in range(5):
            t = np.zeros((1, 4, 5))
            t[0, i, m] = 1.0
            assert diag[i, m] == pytest.approx(optics.apply(t, tiling)[0, i, m], rel=1e-12)


def test_an_offset_target_darker_than_its_neighbours_leak_closes_the_pixel():
    """Two rows, the bright one leaking 0.3 of its light onto the dark one:
    the dark row's target t_min = 0.1 needs a transmission below t_min, which
    the mask cannot show; pre_distort's levels stay in [0, 1] (its
    docstring), the dark pixel fully closed (level 0), not negative."""
    from optical.compensation import pre_distort
    from optical.quant import Tiling

    coupling = SeparableCoupling(np.ones((2, 1)), np.array([0.3, 1.0, 0.3]), np.array([1.0]))
    v = np.array([[1.0], [-1.0]])
    levels = pre_distort(v, np.ones((2, 1)), coupling, Tiling(2, 1, 2, 1), 0.1, "offset")
    assert levels.min() >= 0.0 and levels.max() <= 1.0
    assert levels[0, 1, 0] == 0.0


def test_coupling_of_tiles_narrower_than_the_kernels_radius():
    """Radius-3 kernels on 2 x 2 tiles (a radius past the tile, not just up
    to it): every pixel takes the light of its one in-tile neighbour, by the
    documented sum T_eff[i, m] = sum row[h + d] col[h + e] E T[i + d, m - e]
    written out by hand."""
    from optical.quant import Tiling

    row = np.array([0.01, 0.02, 0.05, 0.8, 0.07, 0.03, 0.02])
    col = np.array([0.02, 0.01, 0.04, 0.85, 0.06, 0.01, 0.01])
    env = np.array([[1.0, 0.9], [0.8, 0.7]])
    coupling = SeparableCoupling(env, row, col)
    t = np.random.default_rng(8).uniform(0, 1, (1, 2, 2))
    want = np.zeros_like(t)
    for i in range(2):
        for m in range(2):
            for j in range(2):  # source row
                for q in range(2):  # mask column
                    want[0, i, m] += row[3 + j - i] * col[3 + m - q] * env[j, q] * t[0, j, q]
    np.testing.assert_allclose(coupling.apply(t, Tiling(2, 2, 2, 2)), want, rtol=1e-12,
                               atol=1e-15)
