"""Crosstalk kernels and illumination from the lens geometry: analytic limits,
the trends diffraction predicts, the fast tile map against a plain loop, and
the engine integration (what program() and matmul() do with them)."""

import math

import numpy as np
import pytest
from scipy import special

import optical
from optical.physics import _mask_apply
from optical.physics import crosstalk as X
from optical.quant import Tiling

#: iris-like's physics, programmed naively: the effective tiles are the bare kernels'.
BASE = optical.presets.get("iris-like").replace({
    "mask.compensate": False, "adc.full_scale": "rms", "outliers.policy": "none"})


def diffraction(**optics) -> optical.OpticalConfig:
    changes = {"optics.model": "diffraction"}
    changes.update({f"optics.{k}": v for k, v in optics.items()})
    return BASE.replace(changes)


def reference_tile(t, kern, column_offset=0):
    """The effective tile by explicit loops over detectors, pixel pairs and rows."""
    rails, k, n = t.shape
    cols = rails * n
    r = kern.radius
    mask = np.zeros((k, cols))
    for rail in range(rails):
        for j in range(n):
            mask[:, rails * j + rail] = t[rail, :, j]
    v = np.sqrt(mask) * np.abs(kern.envelope_field[rails * column_offset:][:cols])
    m = np.real(kern.output_mutual)
    q = np.zeros_like(mask)
    for det in range(cols):
        for d in range(-r, r + 1):
            for e in range(-r, r + 1):
                if 0 <= det + d < cols and 0 <= det + e < cols:
                    q[:, det] += m[r + d, r + e] * v[:, det + d] * v[:, det + e]
    out = np.zeros_like(q)
    for row in range(k):
        for d in range(-r, r + 1):
            if 0 <= row + d < k:
                out[row] += kern.input_coupling[r + d] * q[row + d]
    return np.stack([out[:, rail::rails] for rail in range(rails)])


# --------------------------------------------------------------------------- #
# The kernels against analytic limits
# --------------------------------------------------------------------------- #


def test_ideal_optics_are_the_identity():
    kern = X.kernels(optical.presets.get("ideal"))
    assert kern.ideal and kern.efficiency == 1.0 and kern.throughput == 1.0
    t = np.random.default_rng(0).uniform(0.02, 1, (2, 7, 5))
    np.testing.assert_array_equal(X.effective_tile(t, kern), t)
    tiling = Tiling(7, 5, 4, 4)
    assert X.effective_transmissions(t, tiling, optics_off := optical.presets.get("ideal")) is t
    assert optics_off.optics.model == "ideal"


def test_input_coupling_of_a_well_resolved_gaussian_source_is_its_erf_integral():
    # NA 0.6 passes the whole angular spectrum of a 4 um waist: the image is the
    # source, so the share in row d is the Gaussian's integral over that row.
    w0, pitch, fill = 4e-6, 10e-6, 0.81
    cfg = diffraction(beam_waist=w0, fan_out_aperture=60e-3, fan_out_focal_length=50e-3,
                      fill_factor=fill, kernel_radius=3)
    kern = X.kernels(cfg)
    half = math.sqrt(fill) * pitch / 2
    d = np.arange(-3, 4) * pitch
    share = (special.erf(math.sqrt(2) * (d + half) / w0)
             - special.erf(math.sqrt(2) * (d - half) / w0)) / 2
    np.testing.assert_allclose(kern.input_coupling, share / share.sum(), rtol=1e-6, atol=1e-12)


def test_unclipped_gaussian_fan_out_gives_a_gaussian_envelope():
    # Source waist 2 um, f = 50 mm: W = lambda f / (pi w0) = 6.76 mm; the
    # 50 mm aperture does not clip it, so each pixel sees exp(-2 x^2 / W^2)
    # averaged over its aperture.
    lam, f, w0 = 850e-9, 50e-3, 2e-6
    cfg = diffraction(beam_profile="gaussian", beam_waist=w0, fan_out_focal_length=f,
                      fan_out_aperture=48e-3)
    kern = X.kernels(cfg)
    big_w = lam * f / (math.pi * w0)
    cols = 2 * cfg.core.outputs
    centres = (np.arange(cols) - (cols - 1) / 2) * 10e-6
    half = math.sqrt(0.9) * 10e-6 / 2
    scale = math.sqrt(2) / big_w
    mean = (special.erf(scale * (centres + half)) - special.erf(scale * (centres - half))) \
        * math.sqrt(math.pi / 2) * big_w / 2 / (2 * half)
    np.testing.assert_allclose(kern.envelope, mean / mean.max(), rtol=2e-4)
    assert kern.envelope[0] == pytest.approx(math.exp(-2 * (centres[0] / big_w) ** 2), rel=0.01)


def test_a_narrow_slit_s_fresnel_pattern_is_averaged_over_each_open_pixel():
    """A flat-top beam through a 160 um fan-out aperture reaches the mask,
    5.6 mm on, as the Fresnel pattern of a slit (Fresnel number 1.3): its
    intensity is analytic in Fresnel integrals and varies on the pixel scale,
    so each column's envelope must be that intensity averaged over the
    pixel's open width, sqrt(fill) p, no more and no less (integrated here by
    quadrature). Averaging over twice the width moves the envelope by 4 % of
    its peak; the model agrees to its ~1e-3 sampling accuracy."""
    from scipy import integrate

    lam, f, d, p, fill = 850e-9, 5.6e-3, 160e-6, 10e-6, 0.9
    cfg = diffraction(beam_profile="flat_top", fan_out_focal_length=f, fan_out_aperture=d,
                      pixel_pitch=p, fill_factor=fill).replace(
        {"core.inputs": 32, "core.outputs": 32})
    kern = X.kernels(cfg)
    scale = math.sqrt(2 / (lam * f))

    def intensity(x):  # of a unit-intensity plane wave through the slit
        s2, c2 = special.fresnel(scale * (d / 2 - x))
        s1, c1 = special.fresnel(scale * (-d / 2 - x))
        return ((c2 - c1) ** 2 + (s2 - s1) ** 2) / 2

    cols = 2 * cfg.core.outputs
    centres = (np.arange(cols) - (cols - 1) / 2) * p
    half = math.sqrt(fill) * p / 2
    mean = np.array([integrate.quad(intensity, c - half, c + half)[0] for c in centres])
    expected = mean / mean.max()
    assert expected.min() < 1e-3 and expected[cols // 2 - 1:cols // 2 + 1].min() < 0.8
    np.testing.assert_allclose(kern.envelope, expected, rtol=0, atol=3e-3)


def test_iris_like_crosstalk_is_physically_plausible():
    kern = X.kernels(BASE)
    assert kern.radius == 1
    # NA 0.5 resolves the 1.5 um sources: no light strays into the next row.
    assert kern.input_coupling[0] < 1e-6
    # The NA 0.25 fan-in relay leaks a few tenths of a percent onto the next
    # detector, the regime of real SLM-based multipliers.
    assert 1e-3 < kern.output_coupling[0] < 1e-2
    # The 20.5 mm of columns sit 15 mm inside the 50.8 mm fan-out aperture:
    # the edge's Fresnel ripple (period ~3 um there) averages out over a pixel.
    assert kern.envelope.min() > 0.999
    # The flat top fills the aperture; the mask takes 20.48 / 50.8 of it, of
    # which pixel apertures pass the fill factor.
    assert kern.throughput == pytest.approx(20.48 / 50.8 * 0.9, rel=0.03)
    assert kern.efficiency == pytest.approx(kern.throughput / 2048, rel=0.01)
    assert np.allclose(kern.output_mutual, kern.output_mutual.conj().T)
    assert X.kernels(BASE) is kern  # computed once per configuration


@pytest.mark.parametrize("path", ["fan_out_aperture", "fan_in_aperture"])
def test_crosstalk_grows_as_the_aperture_shrinks(path):
    side = 0 if path == "fan_out_aperture" else 1
    apertures = [25e-3, 12e-3, 6e-3, 3e-3]
    leak = []
    for d in apertures:
        kern = X.kernels(diffraction(**{path: d, "kernel_radius": 2}))
        leak.append(1 - (kern.input_coupling if side == 0 else kern.output_coupling)[2])
    assert np.all(np.diff(leak) > 0), leak
    assert leak[-1] > 10 * leak[0]


@pytest.mark.parametrize("path", ["defocus_waves", "spherical_waves"])
def test_crosstalk_grows_with_aberration(path):
    leak_in, leak_out = [], []
    for w in [0.0, 0.1, 0.2, 0.4]:
        kern = X.kernels(diffraction(**{path: w, "kernel_radius": 2}))
        leak_in.append(1 - kern.input_coupling[2])
        leak_out.append(1 - kern.output_coupling[2])
    assert np.all(np.diff(leak_in) > 0), leak_in
    assert np.all(np.diff(leak_out) > 0), leak_out


def test_kernels_are_normalised_to_the_photons_per_mac_convention():
    kern = X.kernels(diffraction(kernel_radius=3))
    assert kern.input_coupling.sum() == pytest.approx(1.0)
    assert np.sum(kern.output_mutual).real == pytest.approx(1.0)
    assert kern.envelope.max() == pytest.approx(1.0)
    # An open tile in the middle of the core reads one full-scale MAC per
    # source, times the local illumination.
    t = np.ones((2, 64, 64))
    start = kern.envelope.size // 4 - 32
    eff = X.effective_tile(t, kern, column_offset=start)
    assert eff[0, 32, 32] == pytest.approx(kern.envelope[2 * (start + 32)], rel=2e-3)


@pytest.mark.parametrize("aperture", [25.4e-3, 6e-3])
@pytest.mark.parametrize("radius", [1, 4, 16, 20])
def test_truncation_bounds_what_a_wider_kernel_changes(aperture, radius):
    # Kernels cut at `radius` against the same optics cut much further out, on
    # an open, a random and a binary mask: every readout moves by at most
    # `truncation` of the open mask's brightest one (it was 0 from radius 16,
    # its old assessment reach, on).
    cut = diffraction(kernel_radius=radius, fan_in_aperture=aperture,
                      fan_out_aperture=aperture).replace({"core.inputs": 48, "core.outputs": 48})
    narrow = X.kernels(cut)
    wide = X.kernels(cut.replace({"optics.kernel_radius": 2 * radius + 8}))
    rng = np.random.default_rng(radius)
    masks = [np.ones((2, 48, 48)), rng.uniform(0.02, 1, (2, 48, 48)),
             np.where(rng.uniform(size=(2, 48, 48)) < 0.5, 1.0, 0.02)]
    full = X.effective_tile(masks[0], wide).max()
    moved = max(np.abs(X.effective_tile(t, narrow) - X.effective_tile(t, wide)).max()
                for t in masks) / full
    assert 0 < moved <= narrow.truncation


@pytest.mark.parametrize("radius", [1, 2])
def test_truncation_counts_the_input_side_too(radius):
    # A small fan-out aperture spreads each source over many rows while the
    # wide fan-in relay barely couples columns: the rows cut from the input
    # kernel dominate what a wider kernel changes, and truncation bounds it.
    cut = diffraction(kernel_radius=radius, fan_in_aperture=25.4e-3, fan_out_aperture=3e-3
                      ).replace({"core.inputs": 48, "core.outputs": 48})
    narrow = X.kernels(cut)
    wide = X.kernels(cut.replace({"optics.kernel_radius": 2 * radius + 8}))
    t = np.ones((2, 48, 48))
    full = X.effective_tile(t, wide).max()
    moved = np.abs(X.effective_tile(t, narrow) - X.effective_tile(t, wide)).max() / full
    assert 0 < moved <= narrow.truncation


def test_truncation_counts_every_input_row_out_to_sixteen_pixels():
    # Kernels.truncation is assessed out to max(16, 2 * radius) pixels: at
    # radius 1 it holds at least the light of a source that lands 2..16 rows
    # away relative to what the kernel keeps, read off a radius-16 kernel's
    # input coupling (a ratio of its entries: the normalisation cancels).
    cut = diffraction(kernel_radius=1, fan_in_aperture=25.4e-3, fan_out_aperture=3e-3)
    wide = X.kernels(cut.replace({"optics.kernel_radius": 16})).input_coupling
    kept = wide[15:18].sum()
    assert X.kernels(cut).truncation >= (wide.sum() - kept) / kept


# --------------------------------------------------------------------------- #
# The fast tile map
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("radius", [0, 1, 2, 4])
@pytest.mark.parametrize("weights", ["split", "offset"])
def test_fast_tile_map_matches_the_plain_loop(radius, weights):
    cfg = diffraction(kernel_radius=radius, fan_in_aperture=8e-3, fan_out_aperture=8e-3,
                      defocus_waves=0.1).replace({"encoding.weights": weights,
                                                  "core.inputs": 40, "core.outputs": 30})
    kern = X.kernels(cfg)
    rng = np.random.default_rng(radius)
    t = rng.uniform(0.02, 1, (kern.rails, 37, 23))
    np.testing.assert_allclose(X.effective_tile(t, kern, column_offset=5),
                               reference_tile(t, kern, 5), rtol=1e-12, atol=1e-15)


def test_whole_matrix_map_is_the_tile_map_per_tile_and_light_stays_in_its_tile():
    cfg = diffraction(kernel_radius=2, fan_in_aperture=6e-3, fan_out_aperture=6e-3).replace(
        {"core.inputs": 16, "core.outputs": 12})
    kern = X.kernels(cfg)
    rng = np.random.default_rng(7)
    t = rng.uniform(0.02, 1, (2, 40, 30))  # partial last tiles on both axes
    tiling = Tiling(40, 30, 16, 12)
    out = X.effective_transmissions(t, tiling, cfg)
    for i in range(tiling.k_tiles):
        for j in range(tiling.n_tiles):
            ks, ns = tiling.k_slice(i), tiling.n_slice(j)
            np.testing.assert_allclose(out[:, ks, ns], X.effective_tile(t[:, ks, ns], kern),
                                       rtol=1e-12)
    # Changing one tile changes no other tile.
    t2 = t.copy()
    t2[:, 16:32, 12:24] = rng.uniform(0.02, 1, (2, 16, 12))
    out2 = X.effective_transmissions(t2, tiling, cfg)
    changed = np.any(out2 != out, axis=0)
    assert changed[16:32, 12:24].all()
    changed[16:32, 12:24] = False
    assert not changed.any()


def test_dark_pixels_are_valid_and_a_lone_lit_pixel_spreads_by_the_kernels():
    # Transmission 0 (an opaque pixel) is in range: a dark tile detects no
    # light, and one lit pixel reaches its neighbours as the plain loop says.
    cfg = diffraction(kernel_radius=2, fan_in_aperture=6e-3, fan_out_aperture=6e-3).replace(
        {"core.inputs": 16, "core.outputs": 12})
    kern = X.kernels(cfg)
    dark = np.zeros((2, 9, 7))
    np.testing.assert_array_equal(X.effective_tile(dark, kern), 0.0)
    lit = dark.copy()
    lit[1, 4, 3] = 1.0
    got = X.effective_tile(lit, kern)
    np.testing.assert_allclose(got, reference_tile(lit, kern), rtol=1e-12, atol=1e-15)
    assert np.count_nonzero(got) > 1  # the light did spread


def test_whole_matrix_map_refuses_tiles_wider_than_the_core():
    # 12 outputs of split weights are 24 physical columns: 13-output tiles
    # do not fit, though 13 < 24.
    cfg = diffraction(kernel_radius=1).replace({"core.inputs": 16, "core.outputs": 12})
    t = np.full((2, 16, 26), 0.5)
    with pytest.raises(ValueError, match="tiles are larger than the core"):
        X.effective_transmissions(t, Tiling(16, 26, 16, 13), cfg)
    with pytest.raises(ValueError, match="tiles are larger than the core"):
        X.effective_transmissions(t, Tiling(16, 26, 17, 12), cfg)


def test_dtype_is_kept_and_float32_agrees_with_float64():
    cfg = diffraction(kernel_radius=2).replace({"core.inputs": 32, "core.outputs": 32})
    kern = X.kernels(cfg)
    t = np.random.default_rng(1).uniform(0.02, 1, (2, 32, 32))
    out32 = X.effective_tile(t.astype(np.float32), kern)
    assert out32.dtype == np.float32
    assert X.effective_tile(t, kern).dtype == np.float64
    np.testing.assert_allclose(out32, X.effective_tile(t, kern), rtol=1e-5)


@pytest.mark.parametrize(("args", "error", "match"), [
    ((np.ones((3, 4, 4)),), ValueError, r"expected shape \(rails=2, k, n\)"),
    ((np.ones((2, 4, 4), dtype=np.int64),), TypeError, "dtype int64"),
    ((-np.ones((2, 4, 4)),), ValueError, "non-negative"),
    ((np.full((2, 4, 4), np.nan),), ValueError, "finite"),
    ((np.full((2, 4, 4), np.inf),), ValueError, "finite"),
    ([[1.0]], TypeError, "numpy.ndarray"),
    ((np.ones((2, 4, 33)),), ValueError, "do not fit the core's 32 outputs"),
    ((np.ones((2, 40, 4)),), ValueError, "exceed the core's 32 inputs"),
    ((np.ones((2, 33, 4)),), ValueError, "33 rows exceed the core's 32 inputs"),
])
def test_effective_tile_refuses_bad_input(args, error, match):
    kern = X.kernels(diffraction().replace({"core.inputs": 32, "core.outputs": 32}))
    with pytest.raises(error, match=match):
        X.effective_tile(*args, kern) if isinstance(args, tuple) else X.effective_tile(args, kern)


def test_column_offset_is_checked():
    kern = X.kernels(diffraction().replace({"core.inputs": 32, "core.outputs": 32}))
    with pytest.raises(ValueError, match="from output 30"):
        X.effective_tile(np.ones((2, 4, 4)), kern, column_offset=30)
    with pytest.raises(TypeError, match="column_offset"):
        X.effective_tile(np.ones((2, 4, 4)), kern, column_offset=1.5)
    with pytest.raises(TypeError, match="kern"):
        X.effective_tile(np.ones((2, 4, 4)), "kernels")


@pytest.mark.parametrize(("changes", "match"), [
    ({"optics.model": "ray"}, "optics.model: 'ray' is not valid"),
    ({"optics.fill_factor": 0.0}, "optics.fill_factor"),
    ({"optics.fill_factor": 1.2}, "optics.fill_factor"),
    ({"optics.pixel_pitch": -1e-6}, "optics.pixel_pitch"),
    ({"optics.kernel_radius": -1}, "optics.kernel_radius"),
    ({"optics.beam_profile": "top_hat"}, "optics.beam_profile"),
    ({"optics.fan_in_aperture": 0.2}, r"optics.fan_in_aperture: 0.2 m gives a numerical "
                                      r"aperture 2 >= 1"),
])
def test_bad_optics_config_is_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        BASE.replace(changes)


@pytest.mark.parametrize("pitch", [0.5e-6, 850e-9])  # below, and exactly at, 850 nm
def test_pixels_not_wider_than_the_wavelength_are_refused_when_kernels_are_computed(pitch):
    cfg = diffraction(pixel_pitch=pitch)
    assert cfg.source.wavelength == 850e-9
    with pytest.raises(ValueError, match="optics.pixel_pitch.*source.wavelength"):
        X.kernels(cfg)


# --------------------------------------------------------------------------- #
# Engine integration
# --------------------------------------------------------------------------- #


def test_program_applies_the_kernels_and_keeps_the_digital_side_nominal():
    cfg = diffraction(kernel_radius=2, fan_in_aperture=6e-3).replace(
        {"core.inputs": 64, "core.outputs": 48})
    off = cfg.replace({"optics.model": "ideal"})
    w = np.random.default_rng(3).standard_normal((150, 100)).astype(np.float32)
    on_pw, off_pw = optical.program(w, cfg), optical.program(w, off)
    np.testing.assert_array_equal(on_pw.weights, off_pw.weights)
    np.testing.assert_array_equal(on_pw.weight_sums, off_pw.weight_sums)
    np.testing.assert_array_equal(on_pw.scale, off_pw.scale)
    expected = X.effective_transmissions(off_pw.transmissions, off_pw.tiling, cfg)
    np.testing.assert_allclose(on_pw.transmissions, expected, rtol=1e-6)
    assert on_pw.transmissions.dtype == np.float32
    assert on_pw.transmissions.shape == off_pw.transmissions.shape
    # The ADC windows follow the light, not the nominal mask.
    assert not np.allclose(on_pw.adc_hi, off_pw.adc_hi)
    with pytest.raises(ValueError, match="optics.model = 'diffraction' when programmed"):
        on_pw.check_compatible(off)


def test_noise_free_matmul_carries_exactly_the_effective_weights():
    # Ideal converters and source, diffraction optics: the output is what the
    # effective transmissions give, decoded by a digital side that assumes the
    # nominal mask (offset inputs subtract the nominal weight sums).
    cfg = optical.presets.get("ideal").replace({
        "optics.model": "diffraction", "optics.kernel_radius": 2, "optics.fan_in_aperture": 6e-3,
        "core.inputs": 32, "core.outputs": 24, "encoding.inputs": "offset",
        "encoding.weights": "split"})
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 70))
    w = rng.standard_normal((70, 50))
    pw = optical.program(w, cfg)
    y = optical.matmul(x, pw, cfg, seed=0)
    t_min = cfg.mask.min_transmission
    w_eff = (pw.transmissions[0] - pw.transmissions[1]) / (1 - t_min)
    xs = np.abs(x).max(axis=1)
    a = (x / xs[:, None] + 1) / 2
    expected = np.zeros_like(y)
    for i in range(pw.tiling.k_tiles):
        ks = pw.tiling.k_slice(i)
        expected += (2 * a[:, ks] @ w_eff[ks] - pw.weights[ks].sum(axis=0)) * pw.scale[i]
    expected *= xs[:, None]
    np.testing.assert_allclose(y, expected, rtol=1e-10, atol=1e-12)
    # ... and differs measurably from the ideal-optics result.
    ideal = optical.matmul(x, w, cfg.replace({"optics.model": "ideal"}), seed=0)
    assert optical.metrics.relative_error(ideal, y) > 1e-3


def test_ideal_preset_stays_exact():
    from tests.conftest import EXACT_RTOL
    rng = np.random.default_rng(9)
    x = rng.standard_normal((8, 300)).astype(np.float32)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    y = optical.matmul(x, w, optical.presets.get("ideal"), seed=0)
    exact = x.astype(np.float64) @ w.astype(np.float64)
    assert optical.metrics.relative_error(exact, y) < EXACT_RTOL[np.float32]


def test_crosstalk_example_sweeps_and_writes_its_figure(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "examples" / "crosstalk_vs_optics.py"
    spec = importlib.util.spec_from_file_location("crosstalk_vs_optics", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    results = example.sweep(2)
    x, rows = results["aperture"]
    assert rows.shape == (2, 4) and np.all(np.diff(x) > 0)
    assert rows[0, 0] > rows[-1, 0]  # the smallest aperture couples the most
    example.plot(results, str(tmp_path / "fig.png"))
    assert (tmp_path / "fig.png").stat().st_size > 10_000


@pytest.mark.parametrize("radius", [1, 3])
def test_row_blocks_and_in_place_output_give_the_same_map(monkeypatch, radius):
    cfg = diffraction(kernel_radius=radius, fan_in_aperture=6e-3, fan_out_aperture=6e-3
                      ).replace({"core.inputs": 16, "core.outputs": 12})
    rng = np.random.default_rng(radius)
    t = rng.uniform(0.02, 1, (2, 40, 30)).astype(np.float32)
    tiling = Tiling(40, 30, 16, 12)
    whole = X.effective_transmissions(t, tiling, cfg)
    # Blocks of one or a few rows: the halo rows come from the input, or from
    # the copy kept before they were overwritten.
    monkeypatch.setattr(_mask_apply, "BLOCK_ELEMENTS", 2 * 30 + 30)
    np.testing.assert_allclose(X.effective_transmissions(t, tiling, cfg), whole, rtol=1e-6)
    inplace = t.copy()
    assert X.effective_transmissions(inplace, tiling, cfg, out=inplace) is inplace
    np.testing.assert_allclose(inplace, whole, rtol=1e-6)
    with pytest.raises(ValueError, match="out: expected"):
        X.effective_transmissions(t, tiling, cfg, out=np.empty((2, 40, 30)))


def test_cached_kernels_cannot_be_changed_by_a_caller():
    kern = X.kernels(BASE)
    with pytest.raises(ValueError, match="read-only"):
        kern.input_coupling[0] = 1.0
    with pytest.raises(ValueError, match="read-only"):
        kern.envelope_field[:] = 0


def test_a_gaussian_fan_out_beam_narrower_than_the_mask():
    """A 6 um source waist spreads to r = lambda f / (pi w0) = 2.25 mm on a
    20 mm row of rails: the envelope is the beam's Gaussian, exp(-(x/r)^2)
    in field, and its far tail is no light (it was a rounding error below
    zero, a NaN, and a misleading "no light reaches the mask")."""
    import warnings

    cfg = optical.presets.get("iris-like").replace({
        "optics.beam_profile": "gaussian", "optics.beam_waist": 6e-6})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kern = X.kernels(cfg)
    field = np.abs(kern.envelope_field)
    assert np.isfinite(field).all() and field.max() == pytest.approx(1.0)
    o = cfg.optics
    radius = cfg.source.wavelength * o.fan_out_focal_length / (np.pi * o.beam_waist)
    x = (np.arange(field.size) - (field.size - 1) / 2) * o.pixel_pitch
    expected = np.exp(-(x / radius) ** 2)
    bright = expected > 1e-3
    np.testing.assert_allclose(field[bright], expected[bright], rtol=2e-2)
    assert field[~bright].max() < 2e-3


@pytest.mark.parametrize("name", ["tight", "loose"])
def test_fast_tile_map_keeps_every_input_tap_of_a_wide_kernel(name):
    """The field-simulation geometries (kernel radius 24): their input-side
    taps span 1e-15 to 1e-3 of the centre, and the fast map keeps every one
    the plain loop sums (dropping those under 1e-3 moves T by ~1 %, which
    the 1 % field-simulation checks cannot see)."""
    from tests.test_fieldsim import GEOMETRIES

    cfg = GEOMETRIES[name]
    kern = X.kernels(cfg)
    rng = np.random.default_rng(3)
    t = rng.uniform(0.02, 1, (kern.rails, cfg.core.inputs, cfg.core.outputs))
    np.testing.assert_allclose(X.effective_tile(t, kern), reference_tile(t, kern),
                               rtol=1e-10, atol=1e-15)


def test_negative_defocus_is_accepted_and_conjugates_the_kernels():
    """Defocus is a signed Zernike coefficient. With real, symmetric pupils
    and no other aberration, W -> -W conjugates the pupil field: the complex
    mutual coupling is conjugated, intensities (efficiency, throughput,
    input coupling) are unchanged."""
    base = optical.presets.get("iris-like").replace({"core.inputs": 64, "core.outputs": 32})
    plus = X.kernels(base.replace({"optics.defocus_waves": 0.3}))
    minus = X.kernels(base.replace({"optics.defocus_waves": -0.3}))
    np.testing.assert_allclose(minus.output_mutual, np.conj(plus.output_mutual), atol=1e-12)
    np.testing.assert_allclose(minus.input_coupling, plus.input_coupling, atol=1e-12)
    assert minus.throughput == pytest.approx(plus.throughput, rel=1e-12)
    assert not np.allclose(minus.output_mutual, plus.output_mutual)  # the sign is seen


def test_an_unsampleable_geometry_says_why_in_numbers_a_reader_can_use():
    """A raises audit: a tiny aperture's refusal printed a 300-digit grid
    size and blamed the pixel pitch; a subnormal one (in range) raised
    OverflowError; a beam waist of 1e-200 m (in range) ended in "samples:
    contains 16 NaN". The grid is named by its power of two with every term
    of the window that needs it (a review: the largest term may be the
    kernel radius or the beam waist, not the point-spread function), and a
    waist that passes no light through the relay's pupil is refused by
    name; one far below the wavelength that still passes some is computed."""
    with pytest.raises(ValueError, match=r"grid of 2\*\*103 samples \(at most \d+ samples\): "
                                         r"a relay's window of 1.09e\+30 pixel pitches .*the "
                                         r"point-spread function, wavelength / \(2 NA\) = "
                                         r"4.25e\+22 m with NA = aperture / \(2 f\) = 1e-29, "
                                         r"1.09e\+30") as info:
        X.kernels(diffraction(fan_in_aperture=1e-30))
    assert len(str(info.value)) < 400
    with pytest.raises(ValueError, match=r"needs an unbounded grid"):
        X.kernels(diffraction(fan_in_aperture=1e-320))
    with pytest.raises(ValueError, match=r"the beam waist, 3.2e\+05\)"):  # the waist's term
        X.kernels(diffraction(beam_waist=1e-2, pixel_pitch=2e-6))
    with pytest.raises(ValueError, match=r"^optics.beam_waist: 1e-200 m passes no light"):
        X.kernels(diffraction(beam_waist=1e-200))
    kern = X.kernels(diffraction(beam_waist=1e-9))  # 0.3 % of its light: normalised away
    assert np.all(np.isfinite(kern.input_coupling)) and kern.input_coupling.sum() > 0.99
