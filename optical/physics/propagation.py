"""Scalar diffraction on sampled complex fields: free space, thin lenses, pupils.

Conventions
-----------
- A field is a complex array sampled on a centred grid,
  ``x_i = (i - n // 2) * pixel_pitch`` (:func:`coordinates`), so ``x = 0`` is
  sample ``n // 2`` whatever ``n``.
- A 1-D field models cylindrical optics (one transverse axis, the field
  uniform along the other); a 2-D field ``(ny, nx)`` both transverse axes
  (spherical optics). With ``axis=`` an element acts along that one axis of an
  array of any rank (a cylindrical element; every other axis indexes
  independent fields).
- Power is ``sum |U|**2 * pixel_pitch**m`` over ``m`` transverse axes
  (:func:`power`); lossless operations conserve it to float rounding.
- Constant (position-independent) phase factors of lenses are dropped; free
  space keeps its ``exp(i k z)``.
- dtypes: complex64 and float32 give complex64; complex128 and float64 give
  complex128.

All lengths are in m, wavelengths in vacuum (the medium is air, n = 1).
Aberrations are in waves (RMS over the pupil).
"""

from __future__ import annotations

import math

import numpy as np

from optical._validation import check_positive_int

__all__ = [
    "angular_spectrum",
    "coordinates",
    "fresnel",
    "frequencies",
    "gaussian_beam_radius",
    "imaging_relay",
    "lens_focus",
    "power",
    "pupil",
    "thin_lens",
]

_COMPLEX = {np.dtype(np.float32): np.complex64, np.dtype(np.complex64): np.complex64,
            np.dtype(np.float64): np.complex128, np.dtype(np.complex128): np.complex128}


# --------------------------------------------------------------------------- #
# Checks and grids
# --------------------------------------------------------------------------- #


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}: {value} must be a finite number > 0")
    return value


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name}: {value} must be finite")
    return value


def _field(field: object) -> np.ndarray:
    """``field`` as a complex array of matching precision; TypeError/ValueError if unusable."""
    if not isinstance(field, np.ndarray):
        raise TypeError(f"field: expected a numpy.ndarray, got {type(field).__name__}")
    if field.dtype not in _COMPLEX:
        raise TypeError(f"field: dtype {field.dtype} is not supported; use float32/64 or "
                        "complex64/128")
    if field.ndim == 0 or 0 in field.shape:
        raise ValueError(f"field: shape {field.shape} has no samples")
    if not np.isfinite(field).all():
        raise ValueError("field: contains NaN or infinite values")
    return field.astype(_COMPLEX[field.dtype], copy=False)


def _axes(field: np.ndarray, axis: int | None) -> tuple[int, ...]:
    """Transverse axes of ``field``: all of a 1-D/2-D field, or the one given."""
    if axis is None:
        if field.ndim not in (1, 2):
            raise ValueError(f"field: expected a 1-D or 2-D field, got shape {field.shape}; "
                             "pass axis= for a cylindrical element along one axis of a batch")
        return tuple(range(field.ndim))
    if isinstance(axis, bool) or not isinstance(axis, int | np.integer):
        raise TypeError(f"axis: expected an integer or None, got {type(axis).__name__}")
    if not -field.ndim <= axis < field.ndim:
        raise ValueError(f"axis: {axis} is out of range for a field of shape {field.shape}")
    return (int(axis) % field.ndim,)


def _along(values: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    """Reshape a 1-D array to broadcast along ``axis`` of an ``ndim`` array."""
    shape = [1] * ndim
    shape[axis] = values.size
    return values.reshape(shape)


def coordinates(n: int, pixel_pitch: float) -> np.ndarray:
    """Centred sample positions ``(i - n // 2) * pixel_pitch``, m (float64)."""
    n = check_positive_int(n, "n")
    return (np.arange(n) - n // 2) * _positive("pixel_pitch", pixel_pitch)


def frequencies(n: int, pixel_pitch: float) -> np.ndarray:
    """Spatial frequencies of the centred DFT of ``n`` samples, 1/m (float64)."""
    return coordinates(n, 1.0) / (n * _positive("pixel_pitch", pixel_pitch))


def power(field: np.ndarray, pixel_pitch: float, *, axis: int | None = None) -> float | np.ndarray:
    """Power ``sum |U|**2 * pixel_pitch**m`` over the transverse axes.

    Returns a float for a 1-D/2-D field, an array over the other axes when
    ``axis`` is given (units: those of ``|U|**2`` times m**m).
    """
    u = _field(field)
    axes = _axes(u, axis)
    total = np.sum(np.abs(u) ** 2, axis=axes) * _positive("pixel_pitch", pixel_pitch) ** len(axes)
    return float(total) if np.ndim(total) == 0 else total


def _ft(u: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Centred DFT over ``axes`` (sample n//2 is the origin on both sides)."""
    return np.fft.fftshift(np.fft.fftn(np.fft.ifftshift(u, axes), axes=axes), axes)


def _transfer(u: np.ndarray, axes: tuple[int, ...], pixel_pitch: float, h_of_f2) -> np.ndarray:
    """Multiply the angular spectrum by ``h_of_f2(fx**2 + fy**2)`` (uncentred FFT)."""
    f2 = 0.0
    for ax in axes:
        f = np.fft.fftfreq(u.shape[ax], d=pixel_pitch)
        f2 = f2 + _along(f * f, ax, u.ndim)
    h = h_of_f2(np.asarray(f2, dtype=np.float64)).astype(u.dtype)
    return np.fft.ifftn(np.fft.fftn(u, axes=axes) * h, axes=axes).astype(u.dtype, copy=False)


def _phase_kz(distance: float, wavelength: float) -> complex:
    """``exp(i k z)`` with the phase reduced modulo 2 pi before it is formed."""
    return complex(np.exp(2j * math.pi * math.fmod(distance / wavelength, 1.0)))


# --------------------------------------------------------------------------- #
# Free space
# --------------------------------------------------------------------------- #


def angular_spectrum(field: np.ndarray, *, wavelength: float, pixel_pitch: float,
                     distance: float, axis: int | None = None) -> np.ndarray:
    """Propagate a field through free space by the exact scalar angular spectrum.

    Each plane-wave component ``(fx, fy)`` gains ``exp(i 2 pi z sqrt(1/lambda**2
    - fx**2 - fy**2))``; evanescent components (``f > 1/lambda``) decay as
    ``exp(-2 pi |z| sqrt(f**2 - 1/lambda**2))``. A field without evanescent
    content keeps its power exactly (Parseval). The grid is periodic: keep the
    field and its spread inside the window (zero-pad).

    Parameters
    ----------
    field : ndarray, complex or real
        1-D or 2-D field, or any array with ``axis`` given.
    wavelength : float, m
    pixel_pitch : float, m
        Sample spacing (the same on every transverse axis).
    distance : float, m
        Propagation distance (negative: backwards).
    axis : int, optional
        Propagate along this axis only (a field uniform in the other
        transverse direction).

    Returns
    -------
    ndarray, same shape, complex of the input's precision.
    """
    u = _field(field)
    lam = _positive("wavelength", wavelength)
    dx = _positive("pixel_pitch", pixel_pitch)
    z = _finite("distance", distance)
    axes = _axes(u, axis)

    def h(f2: np.ndarray) -> np.ndarray:
        arg = 1.0 / lam**2 - f2
        root = np.sqrt(np.abs(arg))
        # exp(i k z) times exp(i 2 pi z (sqrt(arg) - 1/lam)), the difference written
        # without cancellation: the large phase is reduced exactly, the small one kept.
        delta = -f2 / (root + 1.0 / lam)
        prop = np.exp(2j * math.pi * z * delta) * _phase_kz(z, lam)
        return np.where(arg >= 0, prop, np.exp(-2 * math.pi * abs(z) * root))

    return _transfer(u, axes, dx, h)


def fresnel(field: np.ndarray, *, wavelength: float, pixel_pitch: float, distance: float,
            axis: int | None = None) -> np.ndarray:
    """Fresnel (paraxial) propagation, transfer-function form.

    ``H = exp(i k z) exp(-i pi lambda z (fx**2 + fy**2))``: the paraxial limit
    of :func:`angular_spectrum`, unitary (power is conserved exactly). Same
    grid in and out; accurate while ``pixel_pitch >= lambda z / window`` (the
    "short distance" regime of the transfer-function method).

    Parameters and returns as :func:`angular_spectrum`.
    """
    u = _field(field)
    lam = _positive("wavelength", wavelength)
    dx = _positive("pixel_pitch", pixel_pitch)
    z = _finite("distance", distance)
    axes = _axes(u, axis)
    return _transfer(u, axes, dx, lambda f2: np.exp(-1j * math.pi * lam * z * f2)
                     * _phase_kz(z, lam))


# --------------------------------------------------------------------------- #
# Lenses and pupils
# --------------------------------------------------------------------------- #


def thin_lens(field: np.ndarray, *, wavelength: float, pixel_pitch: float,
              focal_length: float, axis: int | None = None) -> np.ndarray:
    """Multiply by the phase of a thin lens, ``exp(-i pi r**2 / (lambda f))``.

    A 1-D field (or ``axis``) gets a cylindrical lens, a 2-D field a
    spherical one, centred on the grid's origin. Negative ``focal_length``
    is a diverging lens. ``wavelength``, ``pixel_pitch`` (the grid's
    sample spacing) and ``focal_length`` are in m.
    """
    u = _field(field)
    lam = _positive("wavelength", wavelength)
    dx = _positive("pixel_pitch", pixel_pitch)
    f = _finite("focal_length", focal_length)
    if f == 0:
        raise ValueError("focal_length: 0 is not valid; valid: a finite non-zero number")
    phase = np.zeros((1,) * u.ndim)
    for ax in _axes(u, axis):
        x = coordinates(u.shape[ax], dx)
        phase = phase + _along(-math.pi * x * x / (lam * f), ax, u.ndim)
    return u * np.exp(1j * phase).astype(u.dtype)


def lens_focus(field: np.ndarray, *, wavelength: float, pixel_pitch: float,
               focal_length: float, object_distance: float = 0.0,
               axis: int | None = None) -> tuple[np.ndarray, float]:
    """Field in the back focal plane of a thin lens, and its sample pitch.

    With the field given a distance ``d`` in front of the lens (Goodman,
    *Introduction to Fourier Optics*, eq. 5-19)::

        U_f(u) = exp(i pi (1 - d/f) u**2 / (lambda f)) / sqrt(i lambda f)
                 * FT{U}(u / (lambda f))          (per transverse axis)

    so at ``d = f`` it is an exact Fourier transform. Computed with one
    centred FFT: the focal-plane pitch is ``lambda f / (n * pixel_pitch)``
    (zero-pad the input for finer focal sampling). Power is conserved.

    Parameters
    ----------
    field : ndarray
        1-D (cylindrical lens) or 2-D (spherical lens; must be square so both
        axes share one focal pitch), or any array with ``axis``.
    wavelength, pixel_pitch, focal_length : float, m
        ``focal_length > 0``.
    object_distance : float, m
        Distance from the input plane to the lens (0: the field just before
        the lens; ``focal_length``: the front focal plane).
    axis : int, optional
        A cylindrical lens along this axis of a batch of fields.

    Returns
    -------
    field : ndarray, complex, same shape
    pitch : float, m
        Sample pitch of the focal-plane field.
    """
    u = _field(field)
    lam = _positive("wavelength", wavelength)
    dx = _positive("pixel_pitch", pixel_pitch)
    f = _positive("focal_length", focal_length)
    d = _finite("object_distance", object_distance)
    axes = _axes(u, axis)
    sizes = {u.shape[ax] for ax in axes}
    if len(sizes) != 1:
        raise ValueError(f"field: a 2-D field must be square for one focal-plane pitch, got "
                         f"shape {u.shape}")
    n = sizes.pop()
    pitch = lam * f / (n * dx)
    out = _ft(u, axes) * (dx / np.sqrt(1j * lam * f)) ** len(axes)
    if d != f:
        x = coordinates(n, pitch)
        chirp = np.exp(1j * math.pi * (1 - d / f) * x * x / (lam * f))
        for ax in axes:
            out = out * _along(chirp, ax, u.ndim)
    return out.astype(u.dtype, copy=False), pitch


def _aberration_waves(rho: np.ndarray, defocus: float, spherical: float,
                      circular: bool) -> np.ndarray:
    """Wavefront error in waves from RMS-normalised defocus and spherical terms.

    Circular pupils: Zernike (Noll) Z4 = sqrt(3) (2 rho^2 - 1) and Z11 =
    sqrt(5) (6 rho^4 - 6 rho^2 + 1). Slit (cylindrical) pupils: their 1-D
    counterparts, the Legendre polynomials sqrt(5) P2 and 3 P4, orthonormal
    over rho in [-1, 1]. Either way a coefficient is the RMS wavefront error.
    """
    r2 = rho * rho
    if circular:
        return (defocus * math.sqrt(3) * (2 * r2 - 1)
                + spherical * math.sqrt(5) * (6 * r2 * r2 - 6 * r2 + 1))
    return (defocus * math.sqrt(5) * (3 * r2 - 1) / 2
            + spherical * 3 * (35 * r2 * r2 - 30 * r2 + 3) / 8)


def pupil(coordinates: np.ndarray | tuple[np.ndarray, np.ndarray], *, aperture: float,
          defocus: float = 0.0, spherical: float = 0.0) -> np.ndarray:
    """Complex pupil transmission: a hard stop times the aberration phase.

    Parameters
    ----------
    coordinates : ndarray, or (v, u) pair of ndarrays, m
        Pupil-plane positions. One array: a slit of width ``aperture``
        (cylindrical optics). A pair ``(v, u)`` of 1-D arrays (rows, columns):
        a circular stop of diameter ``aperture`` on their grid.
    aperture : float, m
        Width (slit) or diameter (circle) of the stop.
    defocus, spherical : float, waves RMS
        Defocus and primary spherical aberration coefficients (Zernike Z4 and
        Z11, or for a slit their Legendre counterparts, all RMS-normalised).

    Returns
    -------
    ndarray, complex128: ``exp(2 pi i W(rho))`` inside the stop, 0 outside.
    """
    half = _positive("aperture", aperture) / 2
    defocus = _finite("defocus", defocus)
    spherical = _finite("spherical", spherical)
    if isinstance(coordinates, tuple):
        if len(coordinates) != 2:
            raise ValueError("coordinates: expected one array (slit) or a (v, u) pair (circle)")
        v, u = (np.asarray(c, dtype=np.float64) for c in coordinates)
        if v.ndim != 1 or u.ndim != 1:
            raise ValueError("coordinates: the (v, u) pair must be two 1-D arrays")
        rho = np.sqrt((v[:, None] / half) ** 2 + (u[None, :] / half) ** 2)
        circular = True
    else:
        rho = np.abs(np.asarray(coordinates, dtype=np.float64)) / half
        circular = False
    inside = rho <= 1
    waves = _aberration_waves(np.where(inside, rho, 0.0), defocus, spherical, circular)
    return np.where(inside, np.exp(2j * math.pi * waves), 0)


def imaging_relay(field: np.ndarray, *, wavelength: float, pixel_pitch: float,
                  focal_length: float, aperture: float, defocus: float = 0.0,
                  spherical: float = 0.0, axis: int | None = None) -> np.ndarray:
    """Image a field through a 1:1 4f relay with a stop in its Fourier plane.

    Two lenses of focal length ``f``; the pupil (:func:`pupil`) sits in the
    common focal plane, where position ``u`` carries spatial frequency
    ``u / (lambda f)``. The relay therefore multiplies the angular spectrum by
    ``P(lambda f fx)``: a coherent low-pass of cut-off ``NA / lambda`` with
    ``NA = aperture / (2 f)``. The physical 4f image is inverted; the result
    is returned erect (sample ``i`` is the image of object sample ``i``).

    Parameters
    ----------
    field : ndarray
        1-D (slit pupil), 2-D (circular pupil), or any array with ``axis``.
    wavelength, pixel_pitch, focal_length, aperture : float, m
    defocus, spherical : float, waves RMS
    axis : int, optional

    Returns
    -------
    ndarray, same shape and precision (complex).
    """
    u = _field(field)
    lam = _positive("wavelength", wavelength)
    dx = _positive("pixel_pitch", pixel_pitch)
    f = _positive("focal_length", focal_length)
    axes = _axes(u, axis)
    scale = lam * f
    if len(axes) == 1:
        ax = axes[0]
        fx = np.fft.fftfreq(u.shape[ax], d=dx)
        p = _along(pupil(scale * fx, aperture=aperture, defocus=defocus,
                         spherical=spherical), ax, u.ndim)
    else:
        fy = np.fft.fftfreq(u.shape[0], d=dx)
        fx = np.fft.fftfreq(u.shape[1], d=dx)
        p = pupil((scale * fy, scale * fx), aperture=aperture, defocus=defocus,
                  spherical=spherical)
    spectrum = np.fft.fftn(u, axes=axes) * p.astype(u.dtype)
    return np.fft.ifftn(spectrum, axes=axes).astype(u.dtype, copy=False)


# --------------------------------------------------------------------------- #
# Gaussian beams (analytic)
# --------------------------------------------------------------------------- #


def gaussian_beam_radius(distance: float | np.ndarray, *, waist: float,
                         wavelength: float) -> float | np.ndarray:
    """1/e**2 intensity radius of a Gaussian beam a distance from its waist,
    ``w(z) = w0 sqrt(1 + (z / z_R)**2)`` with ``z_R = pi w0**2 / lambda``, m
    (``distance``, ``waist`` and ``wavelength`` in m)."""
    w0 = _positive("waist", waist)
    lam = _positive("wavelength", wavelength)
    z_r = math.pi * w0 * w0 / lam
    return w0 * np.sqrt(1 + (np.asarray(distance, dtype=np.float64) / z_r) ** 2)
