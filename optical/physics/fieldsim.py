"""Field-level simulation of a small optical core: the truth for the kernels.

:func:`simulate_tile` propagates the field of every source numerically
through the optical train that :mod:`optical.physics.crosstalk` describes,
sampled on a fine 2-D grid (rows ``y`` x columns ``x``), and integrates the
detected intensity on every detector:

1. fan-out, ``x``: the source mode (or, for a "flat_top" beam, the uniformly
   filled lens) is propagated by the angular spectrum to the fan-out lens,
   takes the lens phase and the aperture stop, and is propagated on to the
   mask, one focal length further;
2. fan-out, ``y``: the source, at its mirror position, is imaged onto its
   row by two Fourier-transforming lenses with the aberrated pupil between;
3. the mask multiplies the field by ``sqrt(t)`` over each pixel aperture;
4. fan-in, ``x``: the same two-lens relay with the fan-in pupil; ``y``: one
   Fourier-transforming lens onto the detector, which collects the whole
   plane; each detector integrates ``|U|**2`` over its pitch.

Sources are mutually incoherent, so each is simulated alone. Nothing here
uses the kernels: the only shared code is :mod:`optical.physics.propagation`.
Sampling: pixel edges along ``x`` are the rect low-passed at the grid's
Nyquist frequency (their spectrum is exact where the pupil passes light),
rows are area-weighted on a grid fine enough for the source mode, and each
detector integrates with weights exact for the band-limited image. It is slow
(a few 2-D FFTs per source) and meant for cores of tens of pixels.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
from scipy import special

from optical._validation import check_nonnegative_int, check_positive_int
from optical.config import OpticalConfig, check_config
from optical.physics import encoding, propagation

__all__ = ["simulate_tile"]

#: Largest tile side the simulation accepts.
MAX_SIDE = 64


def _cover(x: np.ndarray, lo: float, hi: float, dx: float) -> np.ndarray:
    """Fraction of each sample cell ``[x - dx/2, x + dx/2]`` inside ``[lo, hi]``."""
    return np.clip(np.minimum(x + dx / 2, hi) - np.maximum(x - dx / 2, lo), 0, None) / dx


def _band_limited_rect(x: np.ndarray, lo: float, hi: float, dx: float) -> np.ndarray:
    """The rect on ``[lo, hi]`` low-passed at the grid's Nyquist frequency:
    its samples have exactly the rect's spectrum below Nyquist (no staircase),
    ``(Si(pi (x - lo) / dx) - Si(pi (x - hi) / dx)) / pi``."""
    return (special.sici(math.pi * (x - lo) / dx)[0]
            - special.sici(math.pi * (x - hi) / dx)[0]) / math.pi


def _interval_weights(n: int, dx: float, centre_index: int, width: float) -> np.ndarray:
    """Weights that integrate a function band-limited below Nyquist, sampled on
    the periodic grid, exactly over ``width`` centred on sample ``centre_index``."""
    f = np.fft.fftfreq(n, d=dx)
    weights = np.fft.ifft(width * np.sinc(width * f)).real
    return np.roll(weights, centre_index)


def _fft_size(n: int) -> int:
    """The next size >= n of the form 2**a * 3**b (fast FFTs)."""
    best = 1 << max(0, math.ceil(math.log2(n)))
    three = 3
    while three < 2 * n:
        size = three * (1 << max(0, math.ceil(math.log2(n / three))))
        best = min(best, size) if size >= n else best
        three *= 3
    return best


def simulate_tile(transmissions: np.ndarray, config: OpticalConfig, *,
                  samples_per_pixel: int = 8, margin: int = 16,
                  pupil_samples: int = 256) -> np.ndarray:
    """Detected power of every detector rail per unit power of every source.

    Parameters
    ----------
    transmissions : ndarray, shape (rails, k, n)
        Intensity transmissions of the tile's mask rails, in [0, 1]; the tile
        sits at the core's first output, as :func:`optical.program` loads it.
    config : OpticalConfig
        With ``optics.model = "diffraction"``.
    samples_per_pixel : int
        Grid samples per pixel pitch along a row (even; raised where the
        fan-in pupil needs more). Along a column the grid is finer still where
        the source mode needs it.
    margin : int, pixels
        Dark border on each side of the tile's columns in the window.
    pupil_samples : int
        Minimum samples across each relay pupil (zero-pads the grid).

    Returns
    -------
    ndarray, shape (rails, k, n), float64
        ``P[r, j, n]``: absolute fraction of source ``j``'s emitted power
        detected on rail ``r`` of output ``n``. Compare with
        ``kernels.efficiency * effective_tile(transmissions, kernels)``.
    """
    check_config(config)
    optics = config.optics
    if optics.model != "diffraction":
        raise ValueError("config: the field simulation needs optics.model = 'diffraction'")
    rails = encoding.n_rails(config.encoding.weights)
    t = np.asarray(transmissions, dtype=np.float64)
    if t.ndim != 3 or t.shape[0] != rails:
        raise ValueError(f"transmissions: expected shape (rails={rails}, k, n), got {t.shape}")
    _, k, n = t.shape
    if not (1 <= k <= min(MAX_SIDE, config.core.inputs)
            and 1 <= n <= min(MAX_SIDE, config.core.outputs)):
        raise ValueError(f"transmissions: a {k} x {n} tile does not fit; the simulation takes "
                         f"up to {MAX_SIDE} x {MAX_SIDE} and at most the core "
                         f"({config.core.inputs} x {config.core.outputs})")
    if not (np.isfinite(t).all() and t.min() >= 0 and t.max() <= 1):
        raise ValueError("transmissions: must lie in [0, 1]")
    if isinstance(samples_per_pixel, bool) or not isinstance(samples_per_pixel, numbers.Integral) \
            or samples_per_pixel < 2 or samples_per_pixel % 2:
        raise ValueError(f"samples_per_pixel: {samples_per_pixel!r} must be an even integer >= 2")
    # A negative margin shrank the window until the field wrapped around it
    # (22-73 % off at the peak, an audit); a pupil of no samples failed in math.
    margin = check_nonnegative_int(margin, "margin")
    pupil_samples = check_positive_int(pupil_samples, "pupil_samples")
    samples_per_pixel = int(samples_per_pixel)

    lam = config.source.wavelength
    p = optics.pixel_pitch
    half = math.sqrt(optics.fill_factor) * p / 2
    aberr = {"defocus": optics.defocus_waves, "spherical": optics.spherical_waves}
    f_in, d_in = optics.fan_in_focal_length, optics.fan_in_aperture
    # Detected intensities reach twice the fan-in cut-off: keep them below Nyquist.
    s = max(samples_per_pixel, 2 * math.ceil(2.5 * d_in / (2 * f_in) * p / lam))
    dx = p / s
    columns = rails * n
    core_columns = rails * config.core.outputs

    # x window, centred on the tile (which sits at the core's first columns).
    col_x = (np.arange(columns) - (core_columns - 1) / 2) * p
    centre_x = (col_x[0] + col_x[-1]) / 2
    nx = _fft_size(max((columns + 2 * margin) * s,
                       math.ceil(pupil_samples * lam * f_in / (d_in * dx))))
    x = centre_x + propagation.coordinates(nx, dx)
    # y window: the tile's rows and one dark row on each side, finely sampled.
    sy = s * max(2, math.ceil(4 * dx / optics.beam_waist))
    dy = p / sy
    # Offset half a sample (sy is even): every gap between rows is then centred
    # on a cell boundary, so no cell holds light of two rows, which one
    # amplitude cannot carry (their powers add; amplitudes would interfere).
    row_y = (np.arange(k) - (k - 1) / 2) * p + dy / 2
    ny = _fft_size((k + 2) * sy)
    y = propagation.coordinates(ny, dy)

    envelope = _fan_out_x(optics, lam, dx, x)                                   # (nx,)
    # Rows only matter through the power they pass (the y-optics then
    # collect everything), so an edge cell gets the amplitude that passes its
    # share of the power (of one row only: see row_y).
    rows = np.sqrt(np.stack([_cover(y, c - half, c + half, dy) for c in row_y]).T)  # (ny, k)
    cols = np.stack([_band_limited_rect(x, c - half, c + half, dx) for c in col_x])  # (C, nx)
    mask = rows @ np.sqrt(np.moveaxis(t, 0, -1).reshape(k, columns)) @ cols    # (ny, nx)
    centre_index = np.rint((col_x - x[0]) / dx).astype(int)
    detectors = np.stack([_interval_weights(nx, dx, i, p) for i in centre_index]).T  # (nx, C)

    power = np.empty((k, columns))
    for j in range(k):
        source = _fan_out_y(optics, lam, dy, row_y[j], y, aberr, pupil_samples)
        field = source[:, None] * envelope[None, :] * mask
        # Fan-in, x: two Fourier-transforming lenses around the pupil; the image
        # comes out inverted about the window centre, so it is flipped back.
        spectrum, du = propagation.lens_focus(field, wavelength=lam, pixel_pitch=dx,
                                              focal_length=f_in, object_distance=f_in, axis=1)
        spectrum *= propagation.pupil(propagation.coordinates(nx, du), aperture=d_in,
                                      **aberr)[None, :]
        image, _ = propagation.lens_focus(spectrum, wavelength=lam, pixel_pitch=du,
                                          focal_length=f_in, object_distance=f_in, axis=1)
        image = image[:, (2 * (nx // 2) - np.arange(nx)) % nx]
        # Fan-in, y: a Fourier-transforming lens onto the detector, which
        # collects the whole plane.
        focused, dv = propagation.lens_focus(image, wavelength=lam, pixel_pitch=dy,
                                             focal_length=f_in, object_distance=f_in, axis=0)
        intensity = np.sum(np.abs(focused) ** 2, axis=0) * dv                  # (nx,)
        power[j] = intensity @ detectors
    return np.moveaxis(power.reshape(k, n, rails), -1, 0)


def _fan_out_x(optics, lam: float, dx: float, x: np.ndarray) -> np.ndarray:
    """Fan-out field on the mask at the window positions ``x``, for a source of
    unit power in ``x`` (units 1/sqrt(m))."""
    f, aperture = optics.fan_out_focal_length, optics.fan_out_aperture
    if optics.beam_profile == "gaussian":
        # The source mode needs finer samples than the mask: a sub-grid.
        sub = max(1, math.ceil(4 * dx / optics.beam_waist))
    else:
        sub = 1
    fine = dx / sub
    extent = 2 * max(aperture, 2 * np.max(np.abs(x))) + 64 * math.sqrt(lam * f)
    n = _fft_size(math.ceil(extent / fine))
    if n > 1 << 23:
        raise ValueError("optics: the fan-out beam is too wide for a field simulation")
    xs = propagation.coordinates(n, fine)
    stop = _cover(xs, -aperture / 2, aperture / 2, fine)
    if optics.beam_profile == "gaussian":
        source = np.exp(-(xs / optics.beam_waist) ** 2).astype(complex)
        source_power = propagation.power(source, fine)
        lens = propagation.angular_spectrum(source, wavelength=lam, pixel_pitch=fine,
                                            distance=f)
        lens = propagation.thin_lens(lens, wavelength=lam, pixel_pitch=fine,
                                     focal_length=f) * stop
    else:
        lens = stop.astype(complex)
        source_power = aperture
    mask = propagation.angular_spectrum(lens, wavelength=lam, pixel_pitch=fine, distance=f)
    index = np.rint(x / fine).astype(int) + n // 2
    return mask[index] / math.sqrt(source_power)


def _fan_out_y(optics, lam: float, dx: float, row: float, y: np.ndarray,
               aberr: dict[str, float], pupil_samples: int) -> np.ndarray:
    """Image in ``y`` of a source of unit power whose image centre is ``row``."""
    f, aperture = optics.fan_out_focal_length, optics.fan_out_aperture
    sub = max(1, math.ceil(4 * dx / optics.beam_waist))
    fine = dx / sub
    n = _fft_size(max(math.ceil(4 * (np.max(np.abs(y)) + abs(row)) / fine),
                      math.ceil(pupil_samples * lam * f / (aperture * fine))))
    ys = propagation.coordinates(n, fine)
    # The relay inverts: a source at -row images at +row.
    source = np.exp(-((ys + row) / optics.beam_waist) ** 2).astype(complex)
    spectrum, du = propagation.lens_focus(source, wavelength=lam, pixel_pitch=fine,
                                          focal_length=f, object_distance=f)
    spectrum *= propagation.pupil(propagation.coordinates(n, du), aperture=aperture, **aberr)
    image, _ = propagation.lens_focus(spectrum, wavelength=lam, pixel_pitch=du, focal_length=f,
                                      object_distance=f)
    index = np.rint(y / fine).astype(int) + n // 2
    return image[index] / math.sqrt(propagation.power(source, fine))
