"""Scalar propagation against analytic diffraction: sinc^2 and Airy focal
patterns, Gaussian beam radius w(z), Parseval, and consistency between the
free-space, lens and relay operators."""

import math

import numpy as np
import pytest
from scipy import special

from optical.physics import propagation as P

LAM = 850e-9


def _first_minimum(profile: np.ndarray) -> float:
    """Index (sub-sample, parabolic) of the first local minimum of a 1-D profile
    that starts at its maximum."""
    i = int(np.argmax(np.diff(profile) > 0))
    a, b, c = profile[i - 1], profile[i], profile[i + 1]
    return i + 0.5 * (a - c) / (a - 2 * b + c)


def test_slit_focuses_to_sinc_squared_with_first_zero_at_lambda_f_over_d():
    f, d, dx, n = 50e-3, 1e-3, 1e-6, 1 << 15
    x = P.coordinates(n, dx)
    # A slit of exactly 1000 samples; its width is the sample count times dx.
    field = (np.abs(x + dx / 2) < d / 2).astype(float)
    width = field.sum() * dx
    focal, pitch = P.lens_focus(field, wavelength=LAM, pixel_pitch=dx, focal_length=f,
                                object_distance=f)
    intensity = np.abs(focal[n // 2:]) ** 2
    zero = LAM * f / width
    assert _first_minimum(intensity) * pitch == pytest.approx(zero, rel=0.01)
    # The whole main lobe follows sinc^2 (relative to the peak).
    u = np.arange(int(zero / pitch)) * pitch
    np.testing.assert_allclose(intensity[:u.size] / intensity[0], np.sinc(u * width / (LAM * f))
                               ** 2, atol=2e-3)


def test_circular_aperture_focuses_to_airy_pattern_first_zero_1_22_lambda_f_over_d():
    f, d, n = 20e-3, 1e-3, 512
    dx = 8 * d / n  # aperture spans 1/8 of the window: focal pitch lambda f / (8 d)
    x = P.coordinates(n, dx)
    r = np.hypot(x[:, None], x[None, :])
    field = (r <= d / 2).astype(float)
    focal, pitch = P.lens_focus(field, wavelength=LAM, pixel_pitch=dx, focal_length=f,
                                object_distance=f)
    row = np.abs(focal[n // 2, n // 2:]) ** 2
    zero = 1.2197 * LAM * f / d
    assert abs(_first_minimum(row) * pitch - zero) <= pitch
    u = np.arange(1, int(zero / pitch)) * pitch
    arg = math.pi * d * u / (LAM * f)
    airy = (2 * special.j1(arg) / arg) ** 2
    np.testing.assert_allclose(row[1:u.size + 1] / row[0], airy, atol=0.02)


@pytest.mark.parametrize("ndim", [1, 2])
def test_gaussian_beam_radius_follows_w_of_z_and_power_is_conserved(ndim):
    w0, dx, n = 8e-6, 0.5e-6 if ndim == 1 else 1e-6, 4096 if ndim == 1 else 512
    x = P.coordinates(n, dx)
    r2 = x**2 if ndim == 1 else x[:, None] ** 2 + x[None, :] ** 2
    beam = np.exp(-r2 / w0**2)
    z_r = math.pi * w0**2 / LAM
    for z in (0.5 * z_r, z_r, 2 * z_r):
        out = P.angular_spectrum(beam, wavelength=LAM, pixel_pitch=dx, distance=z)
        intensity = np.abs(out) ** 2
        # Second moment: <x^2> = w^2 / 4 per axis.
        second = np.sum(intensity * r2) / np.sum(intensity) / ndim
        assert 2 * math.sqrt(second) == pytest.approx(
            P.gaussian_beam_radius(z, waist=w0, wavelength=LAM), rel=0.01)
        assert P.power(out, dx) == pytest.approx(P.power(beam, dx), rel=1e-6)


def test_parseval_for_every_lossless_operator():
    rng = np.random.default_rng(3)
    n, dx = 1024, 1e-6
    x = P.coordinates(n, dx)
    # A random but band-limited field (no evanescent content).
    spectrum = np.where(np.abs(np.fft.fftfreq(n, dx)) < 0.5 / LAM,
                        rng.standard_normal(n) + 1j * rng.standard_normal(n), 0)
    field = np.fft.ifft(spectrum) * np.exp(-(x / 200e-6) ** 2)
    before = P.power(field, dx)
    for out, pitch in [
        (P.angular_spectrum(field, wavelength=LAM, pixel_pitch=dx, distance=3e-4), dx),
        (P.fresnel(field, wavelength=LAM, pixel_pitch=dx, distance=3e-4), dx),
        (P.thin_lens(field, wavelength=LAM, pixel_pitch=dx, focal_length=1e-2), dx),
        P.lens_focus(field, wavelength=LAM, pixel_pitch=dx, focal_length=1e-2),
        P.lens_focus(field, wavelength=LAM, pixel_pitch=dx, focal_length=1e-2,
                     object_distance=4e-3),
    ]:
        assert P.power(out, pitch) == pytest.approx(before, rel=1e-6)


def test_fresnel_matches_angular_spectrum_in_the_paraxial_regime():
    n, dx = 2048, 1e-6
    x = P.coordinates(n, dx)
    beam = np.exp(-(x / 40e-6) ** 2) * np.exp(1j * 2 * math.pi * 0.01 * x / LAM)
    a = P.angular_spectrum(beam, wavelength=LAM, pixel_pitch=dx, distance=2e-3)
    b = P.fresnel(beam, wavelength=LAM, pixel_pitch=dx, distance=2e-3)
    assert np.max(np.abs(a - b)) / np.max(np.abs(a)) < 1e-3


def test_lens_focus_equals_thin_lens_then_propagation_to_the_focal_plane():
    # A Gaussian focused by a lens: the one-FFT focal field against the lens
    # phase followed by Fresnel propagation over f. At the critical sampling
    # dx = sqrt(lambda f / n) both land on the same grid.
    f, n = 2e-3, 4096
    dx = math.sqrt(LAM * f / n)
    x = P.coordinates(n, dx)
    beam = np.exp(-(x / 150e-6) ** 2)
    focal, pitch = P.lens_focus(beam, wavelength=LAM, pixel_pitch=dx, focal_length=f)
    assert pitch == pytest.approx(dx)
    propagated = P.fresnel(P.thin_lens(beam, wavelength=LAM, pixel_pitch=dx, focal_length=f),
                           wavelength=LAM, pixel_pitch=dx, distance=f)
    np.testing.assert_allclose(np.abs(focal) ** 2, np.abs(propagated) ** 2,
                               atol=1e-6 * np.max(np.abs(focal) ** 2))
    # The complex fields too: lens_focus leaves out only Fresnel's exp(ikf),
    # its prefactor is Goodman's 1 / sqrt(i lambda f) (a field added coherently
    # to another needs the phase, which the intensities above cannot see).
    np.testing.assert_allclose(focal * np.exp(2j * math.pi / LAM * f), propagated,
                               atol=1e-6 * np.max(np.abs(focal)))
    # The focused waist is lambda f / (pi w).
    intensity = np.abs(focal) ** 2
    waist = 2 * math.sqrt(np.sum(intensity * x**2) / np.sum(intensity))
    assert waist == pytest.approx(LAM * f / (math.pi * 150e-6), rel=0.01)


def test_two_fourier_lenses_with_a_pupil_are_the_imaging_relay():
    rng = np.random.default_rng(0)
    n, dx, f, d = 1024, 1e-6, 5e-3, 1.2e-3
    field = rng.standard_normal(n) * (np.abs(P.coordinates(n, dx)) < 200e-6)
    aberr = {"defocus": 0.2, "spherical": -0.1}
    spec, du = P.lens_focus(field, wavelength=LAM, pixel_pitch=dx, focal_length=f,
                            object_distance=f)
    spec = spec * P.pupil(P.coordinates(n, du), aperture=d, **aberr)
    image, pitch = P.lens_focus(spec, wavelength=LAM, pixel_pitch=du, focal_length=f,
                                object_distance=f)
    assert pitch == pytest.approx(dx)
    inverted = image[(2 * (n // 2) - np.arange(n)) % n]
    relay = P.imaging_relay(field, wavelength=LAM, pixel_pitch=dx, focal_length=f, aperture=d,
                            **aberr)
    # Equal up to the constant phase the lenses drop, and up to where the pupil
    # edge falls between frequency samples (one sample of du).
    ratio = np.vdot(relay, inverted) / np.vdot(relay, relay)
    assert abs(abs(ratio) - 1) < 0.02
    assert np.linalg.norm(inverted - ratio * relay) / np.linalg.norm(relay) < 0.05


def test_relay_with_an_open_pupil_is_the_identity():
    rng = np.random.default_rng(1)
    field = rng.standard_normal(256) + 1j * rng.standard_normal(256)
    out = P.imaging_relay(field, wavelength=LAM, pixel_pitch=1e-6, focal_length=1e-3,
                          aperture=1.9e-3)  # NA 0.95 passes every sampled frequency
    np.testing.assert_allclose(out, field, atol=1e-12)


@pytest.mark.parametrize("circular", [False, True])
def test_aberration_coefficients_are_rms_waves_and_orthogonal(circular):
    n = 601 if circular else 2001
    u = np.linspace(-1, 1, n)
    if circular:
        phase = np.angle(P.pupil((u, u), aperture=2.0, defocus=0.03, spherical=0.0))
        inside = np.hypot(u[:, None], u[None, :]) <= 1
        sph = np.angle(P.pupil((u, u), aperture=2.0, defocus=0.0, spherical=0.03))
    else:
        phase = np.angle(P.pupil(u, aperture=2.0, defocus=0.03))
        inside = np.abs(u) <= 1
        sph = np.angle(P.pupil(u, aperture=2.0, spherical=0.03))
    waves, waves_s = phase[inside] / (2 * math.pi), sph[inside] / (2 * math.pi)
    assert np.sqrt(np.mean(waves**2)) == pytest.approx(0.03, rel=0.01)
    assert np.sqrt(np.mean(waves_s**2)) == pytest.approx(0.03, rel=0.01)
    # Orthogonal: the correlation of the two terms is a sampling residue.
    assert abs(np.mean(waves * waves_s)) < 0.02 * 0.03**2
    assert np.all(P.pupil(np.array([1.01]), aperture=2.0) == 0)


@pytest.mark.parametrize(("dtype", "expected"), [(np.float32, np.complex64),
                                                 (np.complex64, np.complex64),
                                                 (np.float64, np.complex128),
                                                 (np.complex128, np.complex128)])
def test_precision_is_kept(dtype, expected):
    field = np.ones(64, dtype=dtype)
    kw = {"wavelength": LAM, "pixel_pitch": 1e-6}
    assert P.angular_spectrum(field, distance=1e-4, **kw).dtype == expected
    assert P.fresnel(field, distance=1e-4, **kw).dtype == expected
    assert P.thin_lens(field, focal_length=1e-3, **kw).dtype == expected
    assert P.lens_focus(field, focal_length=1e-3, **kw)[0].dtype == expected
    assert P.imaging_relay(field, focal_length=1e-3, aperture=1e-4, **kw).dtype == expected


def test_cylindrical_element_along_one_axis_of_a_batch():
    rng = np.random.default_rng(2)
    batch = rng.standard_normal((3, 128))
    kw = {"wavelength": LAM, "pixel_pitch": 1e-6, "focal_length": 1e-3}
    out, _ = P.lens_focus(batch, axis=1, **kw)
    for i in range(3):
        np.testing.assert_allclose(out[i], P.lens_focus(batch[i], **kw)[0], atol=1e-12)
    out = P.lens_focus(batch.T.copy(), axis=0, **kw)[0].T
    np.testing.assert_allclose(out[1], P.lens_focus(batch[1], **kw)[0], atol=1e-12)
    # Negative axes count from the end, as in numpy.
    np.testing.assert_array_equal(P.lens_focus(batch, axis=-1, **kw)[0],
                                  P.lens_focus(batch, axis=1, **kw)[0])
    np.testing.assert_array_equal(P.thin_lens(batch.T, axis=-2, **kw),
                                  P.thin_lens(batch.T, axis=0, **kw))


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: P.angular_spectrum([1.0, 2.0], wavelength=LAM, pixel_pitch=1e-6, distance=1.0),
     TypeError, "field: expected a numpy.ndarray"),
    (lambda: P.angular_spectrum(np.ones(4, dtype=int), wavelength=LAM, pixel_pitch=1e-6,
                                distance=1.0), TypeError, "field: dtype int"),
    (lambda: P.fresnel(np.array([1.0, np.nan]), wavelength=LAM, pixel_pitch=1e-6,
                       distance=1.0), ValueError, "field: contains NaN"),
    (lambda: P.fresnel(np.ones((2, 2, 2)), wavelength=LAM, pixel_pitch=1e-6, distance=1.0),
     ValueError, "1-D or 2-D field"),
    (lambda: P.fresnel(np.ones(8), wavelength=-LAM, pixel_pitch=1e-6, distance=1.0),
     ValueError, "wavelength"),
    (lambda: P.fresnel(np.ones(8), wavelength=LAM, pixel_pitch=0.0, distance=1.0),
     ValueError, "pixel_pitch"),
    (lambda: P.fresnel(np.ones(8), wavelength=LAM, pixel_pitch=1e-6, distance=math.inf),
     ValueError, "distance"),
    (lambda: P.lens_focus(np.ones((4, 8)), wavelength=LAM, pixel_pitch=1e-6, focal_length=1.0),
     ValueError, "must be square"),
    (lambda: P.lens_focus(np.ones(8), wavelength=LAM, pixel_pitch=1e-6, focal_length=-1.0),
     ValueError, "focal_length"),
    (lambda: P.thin_lens(np.ones(8), wavelength=LAM, pixel_pitch=1e-6, focal_length=0.0),
     ValueError, "focal_length"),
    (lambda: P.lens_focus(np.ones((2, 8)), wavelength=LAM, pixel_pitch=1e-6, focal_length=1.0,
                          axis=2), ValueError, "axis: 2 is out of range"),
    (lambda: P.pupil(np.ones(4), aperture=0.0), ValueError, "aperture"),
    (lambda: P.pupil((np.ones(4),), aperture=1.0), ValueError, "coordinates"),
])
def test_bad_input_is_refused_naming_the_problem(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("n", [8, 9])
def test_grids_are_centred_and_frequencies_are_the_dft_reciprocal_grid(n):
    dx = 2e-6
    x = P.coordinates(n, dx)
    assert x[n // 2] == 0.0 and x[0] == -(n // 2) * dx
    np.testing.assert_allclose(np.diff(x), dx, rtol=1e-12)
    # The centred DFT's frequencies are numpy's, shifted: spacing 1 / (n dx).
    np.testing.assert_allclose(P.frequencies(n, dx), np.fft.fftshift(np.fft.fftfreq(n, dx)),
                               rtol=1e-12, atol=0)


def test_power_weighs_each_transverse_axis_by_the_pitch():
    dx = 3e-6
    assert P.power(np.ones(5), dx) == pytest.approx(5 * dx, rel=1e-12)
    assert P.power(np.ones((3, 5)), dx) == pytest.approx(15 * dx**2, rel=1e-12)
    # With axis= the sum runs along that axis only: one pitch, one value per field.
    np.testing.assert_allclose(P.power(np.ones((3, 5)), dx, axis=1), np.full(3, 5 * dx),
                               rtol=1e-12)


def test_plane_waves_gain_the_exact_free_space_phase_and_evanescent_waves_decay():
    # A plane wave exp(i 2 pi fx x) on the periodic grid is an eigenmode of free
    # space: it gains exp(i 2 pi z sqrt(1/lambda^2 - fx^2)) exactly (normal
    # incidence: exp(i k z)); past fx = 1/lambda it decays as
    # exp(-2 pi z sqrt(fx^2 - 1/lambda^2)). Fresnel's paraxial phase is
    # exp(i k z) exp(-i pi lambda z fx^2).
    n, dx, z = 256, 0.25e-6, 7.3e-6
    x = P.coordinates(n, dx)
    for m in (0, 3, 40, 60):  # 1/lambda is m = 75.3 on this grid
        fx = m / (n * dx)
        wave = np.exp(2j * math.pi * fx * x)
        got = P.angular_spectrum(wave, wavelength=LAM, pixel_pitch=dx, distance=z)
        expected = wave * np.exp(2j * math.pi * z * math.sqrt(1 / LAM**2 - fx**2))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-9)
        paraxial = P.fresnel(wave, wavelength=LAM, pixel_pitch=dx, distance=z)
        expected = wave * np.exp(2j * math.pi * z / LAM - 1j * math.pi * LAM * z * fx**2)
        np.testing.assert_allclose(paraxial, expected, rtol=0, atol=1e-9)
    z = 0.5e-6  # within a wavelength: the decay stays measurable
    for m in (78, 90):
        fx = m / (n * dx)
        wave = np.exp(2j * math.pi * fx * x)
        got = P.angular_spectrum(wave, wavelength=LAM, pixel_pitch=dx, distance=-z)
        decay = math.exp(-2 * math.pi * z * math.sqrt(fx**2 - 1 / LAM**2))
        assert 0.05 < decay < 0.5
        np.testing.assert_allclose(got, wave * decay, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("d_over_f", [0.0, 0.5, 1.0, 2.0])
def test_focal_field_carries_goodmans_quadratic_phase(d_over_f):
    # A centred Gaussian has a real, positive Fourier transform, so by Goodman
    # eq. 5-19 the focal field's phase is exactly pi (1 - d/f) u^2 / (lambda f)
    # plus a constant, and its modulus the Gaussian of waist lambda f / (pi w).
    f, n, w = 5e-3, 1024, 40e-6
    dx = 4 * w / 64
    x = P.coordinates(n, dx)
    focal, pitch = P.lens_focus(np.exp(-(x / w) ** 2), wavelength=LAM, pixel_pitch=dx,
                                focal_length=f, object_distance=d_over_f * f)
    u = P.coordinates(n, pitch)
    waist = LAM * f / (math.pi * w)
    lit = np.abs(u) < 1.5 * waist
    phase = np.angle(focal[lit] / focal[n // 2])
    chirp = math.pi * (1 - d_over_f) * u[lit] ** 2 / (LAM * f)
    np.testing.assert_allclose(np.angle(np.exp(1j * (phase - chirp))), 0, atol=1e-9)
    modulus = np.abs(focal[lit]) / np.abs(focal[n // 2])
    np.testing.assert_allclose(modulus, np.exp(-(u[lit] / waist) ** 2), rtol=1e-9)


def test_spherical_lens_focus_conserves_power_on_its_own_pitch():
    # A 2-D field: the focal pitch differs from the input's, and power weighs
    # both transverse axes, pitch**2.
    n, dx, f = 128, 2e-6, 3e-3
    x = P.coordinates(n, dx)
    field = np.exp(-(x[:, None] ** 2 + (x[None, :] - 10e-6) ** 2) / (30e-6) ** 2)
    focal, pitch = P.lens_focus(field, wavelength=LAM, pixel_pitch=dx, focal_length=f,
                                object_distance=1e-3)
    assert pitch == pytest.approx(LAM * f / (n * dx), rel=1e-12) and pitch != dx
    assert P.power(focal, pitch) == pytest.approx(P.power(field, dx), rel=1e-9)


def test_slit_relay_gives_a_passed_plane_wave_the_legendre_defocus_phase():
    # The 1-D relay's defocus is W rms waves of sqrt(5) P2(rho) =
    # sqrt(5) (3 rho**2 - 1) / 2 over the slit, with the sign of the circular
    # stop's Zernike sqrt(3) (2 rho**2 - 1) (below): a passed plane wave takes
    # it at its pupil coordinate rho = lambda f |fx| / (D / 2).
    n, dx, f, d = 256, 1e-6, 2e-3, 1.3e-3
    x = P.coordinates(n, dx)
    for m in (0, 30, 60, 90):  # the cut-off is at m = 97.9
        fx = m / (n * dx)
        wave = np.exp(2j * math.pi * fx * x)
        rho = LAM * f * fx / (d / 2)
        defocused = P.imaging_relay(wave, wavelength=LAM, pixel_pitch=dx, focal_length=f,
                                    aperture=d, defocus=0.1)
        legendre = 0.1 * math.sqrt(5) * (3 * rho**2 - 1) / 2
        np.testing.assert_allclose(defocused, wave * np.exp(2j * math.pi * legendre),
                                   atol=1e-12)


def test_circular_relay_passes_plane_waves_inside_the_coherent_cut_off_only():
    # On a non-square grid, plane waves along y, along x and diagonally: the
    # 4f relay with a circular stop passes those with lambda f |f_xy| inside
    # the stop's radius unchanged (NA / lambda cut-off) and removes the rest;
    # with defocus, a passed wave takes the Zernike phase at its pupil radius.
    ny, nx, dx, f, d = 48, 64, 1e-6, 2e-3, 1.3e-3
    y, x = P.coordinates(ny, dx), P.coordinates(nx, dx)
    cut = d / 2 / (LAM * f)  # 382 per mm: 18.4 samples of fy, 24.5 of fx
    for my, mx in [(18, 0), (19, 0), (0, 24), (0, 25), (13, 17), (14, 19)]:
        fy, fx = my / (ny * dx), mx / (nx * dx)
        wave = np.exp(2j * math.pi * (fy * y[:, None] + fx * x[None, :]))
        inside = math.hypot(fy, fx) < cut
        out = P.imaging_relay(wave, wavelength=LAM, pixel_pitch=dx, focal_length=f, aperture=d)
        np.testing.assert_allclose(out, wave if inside else 0, atol=1e-12)
        if inside:
            rho = math.hypot(fy, fx) / cut
            defocused = P.imaging_relay(wave, wavelength=LAM, pixel_pitch=dx, focal_length=f,
                                        aperture=d, defocus=0.1)
            zernike = 0.1 * math.sqrt(3) * (2 * rho**2 - 1)
            np.testing.assert_allclose(defocused, wave * np.exp(2j * math.pi * zernike),
                                       atol=1e-12)
