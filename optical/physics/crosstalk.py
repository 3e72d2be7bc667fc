"""Lens geometry -> coupling kernels and illumination envelope, and the
effective transmissions a programmed mask tile shows to the light.

The optical train (cylindrical optics; ``y`` runs down a column of the mask
across its rows, one row per source; ``x`` along a row across its columns):

Fan-out (sources -> mask), focal length ``f_o``, clear aperture ``D_o``
    * in ``y`` each source (a Gaussian mode of waist ``beam_waist``) is imaged
      1:1 onto its mask row by a relay whose pupil is ``D_o`` wide
      (``NA = D_o / (2 f_o)``) and carries the defocus and spherical
      aberration. Light landing in row ``j + d`` is the **input coupling**
      ``c_in[d]``; light between pixel apertures is lost.
    * in ``x`` the source sits in the front focal plane of the fan-out lens
      and the mask in its back focal plane: the collimated beam across the
      row is the source's far field, clipped by the lens aperture and
      diffracted over ``f_o``. A "gaussian" source gives a beam of 1/e**2
      radius ``W = lambda f_o / (pi beam_waist)``; a "flat_top" one (a line
      generator) fills the aperture uniformly. The beam's intensity over each
      pixel is the **illumination envelope**.
Mask
    square pixels at ``pixel_pitch``, transmitting apertures of side
    ``sqrt(fill_factor) * pixel_pitch``, amplitude-only modulation: a pixel
    of intensity transmission ``t`` passes the field times ``sqrt(t)``; the
    gaps are opaque. With split weights the two rails of an output sit on
    adjacent columns (``2 n`` positive, ``2 n + 1`` negative), so the mask has
    ``rails * core.outputs`` physical columns.
Fan-in (mask -> detectors), focal length ``f_i``, clear aperture ``D_i``
    * in ``y`` a lens Fourier-transforms each column onto its detector, which
      collects every ray: the rows' powers add (Parseval), with no crosstalk.
    * in ``x`` a 1:1 relay with pupil ``D_i`` (and the same aberrations)
      images the mask columns onto detectors one pitch wide.

Coherence. Sources are separate lasers, mutually incoherent: powers of
different sources add, which makes the input side an intensity kernel. One
source's light is coherent along its row, so the fields of neighbouring
columns interfere on a detector: the output side is the quadratic form

    Q[i, n] = sum_{d, d'} Re(M[d, d'] e[n+d] conj(e[n+d'])) sqrt(t[i, n+d] t[i, n+d'])

with ``M[d, d'] = integral over detector 0 of g(x - d p) conj(g(x - d' p))``,
``g`` the image of one pixel aperture and ``e`` the envelope field. Its
diagonal is the familiar **output coupling** (what column ``n + d`` alone
puts on detector ``n``); the off-diagonal terms are the interference. The
effective transmission from source ``j`` to detector ``n`` is then
``T[j, n] = sum_d c_in[d] Q[j + d, n]``.

Normalisation: ``photons_per_mac`` keeps its meaning, detected photons per
MAC at full input and full transmission, taken at the brightest column of an
open mask. So ``c_in`` sums to 1, the envelope peaks at 1 and ``M`` sums to 1;
the absolute fraction of a source's power that reaches one such detector is
:attr:`Kernels.efficiency` (for the energy budget).

Approximations of the fast path (tested against :mod:`optical.physics.fieldsim`):
kernels are cut at ``optics.kernel_radius`` pixels (coherent ringing of a
hard pupil decays only as 1/d, see :attr:`Kernels.truncation`); the envelope
field is taken constant over each pixel (its pixel average) and enters the
quadratic form through its modulus, ``e -> |e|``: its phase differences
between pixels within the radius are neglected (exact for a flat-phase
collimated beam; a beam with Fresnel ripples on the pixel scale, e.g. a
strongly clipped one, breaks both); light does not cross tile edges; the
fan-in optics vignette nothing. The kernels themselves are computed from the
objects' exact spectra (band-limited images, exact quadrature), converged to
about 1e-3 (the periodic window's wrap of the 1/d tails).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING

import numpy as np

from optical.config import OpticalConfig, OpticsConfig, check_config
from optical.physics import _mask_apply, encoding, propagation

if TYPE_CHECKING:
    from optical.quant import Tiling

__all__ = [
    "Kernels",
    "effective_tile",
    "effective_transmissions",
    "kernels",
]

#: Least samples per pixel pitch on the 1-D grids the kernels are computed on.
_SAMPLES_PER_PIXEL = 8
#: Least pixels on each side over which :attr:`Kernels.truncation` is assessed
#: (it is assessed out to twice ``optics.kernel_radius`` beyond that).
_ASSESS_RADIUS = 16
#: Largest 1-D grid the kernel computation may use.
_MAX_GRID = 1 << 21


@dataclasses.dataclass(frozen=True, eq=False)
class Kernels:
    """Coupling kernels and illumination of one optical core.

    Attributes
    ----------
    input_coupling : ndarray, shape (2 r + 1,)
        ``input_coupling[r + d]``: share of a source's light that lands in
        mask row ``j + d`` (sums to 1 over the kept rows).
    output_mutual : ndarray, shape (2 r + 1, 2 r + 1), complex
        Mutual-intensity matrix ``M[r + d, r + d']`` of the fan-in relay on one
        detector (Hermitian, sums to 1).
    envelope_field : ndarray, shape (columns,), complex
        Pixel-averaged fan-out field over the core's physical columns
        (``rails * core.outputs``); peak modulus 1.
    rails : int
        Mask columns per output (2 for split weights, interleaved).
    inputs : int
        Rows (sources) of the core.
    efficiency : float
        Fraction of one source's emitted power detected by one detector at
        the brightest column through an open mask (1 for ideal optics, whose
        losses are folded into ``photons_per_mac``).
    throughput : float
        Fraction of one source's emitted power detected by all the core's
        detectors together through an open mask (fill factor, aperture and
        diffraction losses; 1 for ideal optics).
    truncation : float
        Worst case (open mask) relative error of a detector's readout from
        cutting the kernels at ``radius``, assessed out to ``max(16, 2 *
        radius)`` pixels. Every neglected coupling term is taken at its
        absolute value, so for a hard-edged pupil, whose coherent ringing
        decays only as 1/d, it grows slowly with the assessed reach and is
        far above the typical error; informational, not enforced.
    ideal : bool
        True for ideal optics: :func:`effective_tile` is the identity.
    """

    input_coupling: np.ndarray
    output_mutual: np.ndarray
    envelope_field: np.ndarray
    rails: int
    inputs: int
    efficiency: float = 1.0
    throughput: float = 1.0
    truncation: float = 0.0
    ideal: bool = False

    @property
    def radius(self) -> int:
        """Pixels kept on each side of the kernels."""
        return (self.input_coupling.size - 1) // 2

    @property
    def envelope(self) -> np.ndarray:
        """Relative illumination intensity of every physical column (peak 1)."""
        return np.abs(self.envelope_field) ** 2

    @property
    def output_coupling(self) -> np.ndarray:
        """``output_coupling[r + d]``: share of a lone column's detected light
        that falls on detector ``n + d`` (the diagonal of ``output_mutual``,
        normalised to sum 1)."""
        diag = np.real(np.diag(self.output_mutual))[::-1]
        return diag / diag.sum()


# --------------------------------------------------------------------------- #
# Kernel computation
# --------------------------------------------------------------------------- #


def kernels(config: OpticalConfig) -> Kernels:
    """The kernels of a configuration's optics (computed once, then cached).

    Raises
    ------
    ValueError
        If the geometry cannot be sampled (pixel pitch below the wavelength,
        a point-spread function wider than the kernel grid).
    """
    check_config(config)
    rails = encoding.n_rails(config.encoding.weights)
    return _kernels(config.optics, config.source.wavelength, config.core.inputs,
                    config.core.outputs, rails)


@functools.lru_cache(maxsize=64)
def _kernels(optics: OpticsConfig, wavelength: float, inputs: int, outputs: int,
             rails: int) -> Kernels:
    columns = rails * outputs
    if optics.model == "ideal":
        arrays = [np.ones(1), np.ones((1, 1), dtype=complex), np.ones(columns, dtype=complex)]
        for a in arrays:
            a.flags.writeable = False
        return Kernels(*arrays, rails, inputs, ideal=True)
    p = optics.pixel_pitch
    if p <= wavelength:
        raise ValueError(f"optics.pixel_pitch: {p} m is not above source.wavelength = "
                         f"{wavelength} m; scalar diffraction needs pixels wider than the "
                         "wavelength")
    r = optics.kernel_radius
    c_in = _input_coupling(optics, wavelength, max(2 * r, _ASSESS_RADIUS))
    m_abs = _output_mutual(optics, wavelength, max(2 * r, _ASSESS_RADIUS))
    env = _envelope(optics, wavelength, columns)

    big = (c_in.size - 1) // 2
    keep = slice(big - r, big + r + 1)
    c_kept, m_kept = c_in[keep], m_abs[keep, keep]
    if not c_kept.sum() > 0:  # (the kernels came out NaN)
        raise ValueError(f"optics.beam_waist: {optics.beam_waist} m passes no light through "
                         "the fan-out relay's pupil in float64: a mode "
                         f"{optics.beam_waist / wavelength:.3g} wavelengths wide spreads "
                         "almost all of it outside (its share falls with the waist)")
    m_norm = float(np.sum(m_kept).real)
    # Worst case: every neglected term adds with the same sign on an open mask.
    m_all = np.abs(m_abs).sum() - np.abs(m_kept).sum()
    truncation = float(m_all / m_norm + (c_in.sum() - c_kept.sum()) / c_kept.sum())
    peak = float(np.max(np.abs(env) ** 2))
    if not peak > 0:
        raise ValueError("optics: no light reaches the mask (the fan-out aperture misses it)")
    efficiency = float(c_kept.sum() * peak * m_norm)
    m_rel = np.real(m_kept) / m_norm
    v = np.pad(np.abs(env) / math.sqrt(peak), r)
    shifted = np.stack([v[r + d:r + d + columns] for d in range(-r, r + 1)])
    open_mask = np.einsum("dn,de,en->n", shifted, m_rel, shifted)
    arrays = [c_kept / c_kept.sum(), m_kept / m_norm, env / math.sqrt(peak)]
    for a in arrays:  # shared through the cache: nobody may change them
        a.flags.writeable = False
    return Kernels(*arrays, rails, inputs, efficiency=efficiency,
                   throughput=float(efficiency * open_mask.sum()), truncation=truncation)


def _grid_size(extent: float, pitch: float, why: str) -> int:
    """Samples of a grid of ``pitch`` spanning ``extent`` (a power of two),
    or ValueError saying ``why`` the extent is that wide."""
    ratio = extent / pitch
    if not ratio <= _MAX_GRID:  # (inf too: a subnormal aperture's point-spread function)
        need = (f"a grid of 2**{math.ceil(math.log2(ratio))} samples"
                if math.isfinite(ratio) else "an unbounded grid")
        raise ValueError(f"optics: the geometry needs {need} (at most {_MAX_GRID} samples): "
                         f"{why}")
    return 1 << max(12, math.ceil(math.log2(max(ratio, 1.0))))


def _cover(x: np.ndarray, lo: float, hi: float, dx: float) -> np.ndarray:
    """Fraction of each sample cell ``[x - dx/2, x + dx/2]`` inside ``[lo, hi]``."""
    return np.clip(np.minimum(x + dx / 2, hi) - np.maximum(x - dx / 2, lo), 0, None) / dx


def _relay_grid(optics: OpticsConfig, wavelength: float, radius: int,
                focal_length: float, aperture: float) -> tuple[int, float, int]:
    """Size, pitch and samples per pixel of a 1-D grid for a relay's images.

    Intensities and overlaps of images have twice the pupil's cut-off
    ``NA / lambda``; the grid's Nyquist frequency stays 25% above that, so
    every integral below is exact for them. The window spans ``radius``
    pixels and the point-spread function with ample margin.
    """
    p = optics.pixel_pitch
    na = aperture / (2 * focal_length)
    s = max(_SAMPLES_PER_PIXEL, 2 * math.ceil(2.5 * na * p / wavelength))
    dx = p / s
    psf = wavelength / (2 * na)  # first zero of the slit PSF
    extent = 8 * ((radius + 2) * p + 32 * psf + 8 * optics.beam_waist)
    why = (f"a relay's window of {extent / p:.3g} pixel pitches (from the {radius} "
           f"neighbours assessed each side, {8 * (radius + 2)}; the point-spread "
           f"function, wavelength / (2 NA) = {psf:.3g} m with NA = aperture / (2 f) = "
           f"{na:.3g}, {256 * psf / p:.3g}; the beam waist, "
           f"{64 * optics.beam_waist / p:.3g}) at {s} samples a pitch (more as NA x pitch "
           "/ wavelength grows)")
    return _grid_size(extent, dx, why), dx, s


def _band_limited_image(spectrum, n: int, dx: float, wavelength: float, focal_length: float,
                        aperture: float, optics: OpticsConfig) -> np.ndarray:
    """Image, through a 4f relay, of an object given by its exact Fourier
    transform ``spectrum(fx)``, sampled on the centred grid of ``n`` points.

    The pupil band-limits the image (cut-off ``NA / lambda``, far below the
    grid's Nyquist frequency), so the samples are exact up to the window's
    periodic wrap: no staircase error from sampling the object's edges.
    """
    fx = np.fft.fftfreq(n, d=dx)
    pupil = propagation.pupil(wavelength * focal_length * fx, aperture=aperture,
                              **_aberrations(optics))
    if wavelength * focal_length / (2 * dx) <= aperture / 2:
        raise ValueError("optics: the pupil is not sampled; pixel_pitch is too small for the "
                         "numerical aperture")
    return np.fft.fftshift(np.fft.ifft(spectrum(fx) * pupil)) / dx


def _rect_transform(width: float, f: np.ndarray) -> np.ndarray:
    """Fourier transform of a unit rect of the given width, ``width sinc(width f)``."""
    return width * np.sinc(width * f)


def _integrate(values: np.ndarray, dx: float, width: float, centres: np.ndarray) -> np.ndarray:
    """Integrals over ``[c - width/2, c + width/2]`` of a band-limited function
    sampled on a centred grid of pitch ``dx``, for centres ``c`` on the grid;
    exact up to the window's periodicity.

    The running integral is the convolution with a rect, whose transform is
    applied to the DFT of the samples.
    """
    n = values.size
    f = np.fft.fftfreq(n, d=dx)
    smoothed = np.fft.ifft(np.fft.fft(np.fft.ifftshift(values)) * _rect_transform(width, f))
    smoothed = np.fft.fftshift(smoothed)
    index = np.rint(centres / dx).astype(int) + n // 2
    if not np.allclose((index - n // 2) * dx, centres, rtol=0, atol=1e-6 * dx):
        raise AssertionError("interval centres must fall on the grid")  # internal invariant
    out = smoothed[index]
    return out.real if np.isrealobj(values) else out


def _rect_weights(n: int, dx: float, width: float) -> np.ndarray:
    """Quadrature weights on the centred grid that integrate any band-limited
    function (below Nyquist) exactly over ``[-width/2, width/2]``."""
    f = np.fft.fftfreq(n, d=dx)
    return np.fft.fftshift(np.fft.ifft(_rect_transform(width, f)).real)


def _aberrations(optics: OpticsConfig) -> dict[str, float]:
    return {"defocus": optics.defocus_waves, "spherical": optics.spherical_waves}


def _input_coupling(optics: OpticsConfig, wavelength: float, radius: int) -> np.ndarray:
    """Absolute share of a source's power landing in each row aperture."""
    f, aperture = optics.fan_out_focal_length, optics.fan_out_aperture
    n, dx, _ = _relay_grid(optics, wavelength, radius, f, aperture)
    w0 = optics.beam_waist
    # exp(-x^2 / w0^2) <-> w0 sqrt(pi) exp(-(pi w0 fx)^2); its power is w0 sqrt(pi / 2).
    image = _band_limited_image(lambda fx: w0 * math.sqrt(math.pi) * np.exp(-(math.pi * w0 * fx)
                                                                              ** 2),
                                n, dx, wavelength, f, aperture, optics)
    p = optics.pixel_pitch
    rows = np.arange(-radius, radius + 1) * p
    width = math.sqrt(optics.fill_factor) * p
    return _integrate(np.abs(image) ** 2, dx, width, rows) / (w0 * math.sqrt(math.pi / 2))


def _output_mutual(optics: OpticsConfig, wavelength: float, radius: int) -> np.ndarray:
    """``M[d, d']`` in absolute units (m): overlap on detector 0 of the images
    of unit-amplitude pixel apertures at columns ``d`` and ``d'``."""
    f, aperture = optics.fan_in_focal_length, optics.fan_in_aperture
    n, dx, s = _relay_grid(optics, wavelength, radius, f, aperture)
    width = math.sqrt(optics.fill_factor) * optics.pixel_pitch
    g = _band_limited_image(lambda fx: _rect_transform(width, fx), n, dx, wavelength, f,
                            aperture, optics)
    weights = _rect_weights(n, dx, optics.pixel_pitch)  # detector 0: [-p/2, p/2]
    # g(x - d p) is g shifted d * s samples to the right (the grid is periodic).
    shifted = np.stack([np.roll(g, d * s) for d in range(-radius, radius + 1)])
    return (shifted * weights) @ np.conj(shifted).T


def _envelope(optics: OpticsConfig, wavelength: float, columns: int) -> np.ndarray:
    """Pixel-averaged fan-out field over the physical columns, normalised to a
    source of unit power in ``x`` (units 1/sqrt(m))."""
    f, aperture = optics.fan_out_focal_length, optics.fan_out_aperture
    p = optics.pixel_pitch
    half_mask = columns * p / 2
    dx = p / 4
    # The transfer-function method needs dx >= lambda f / window; a window of
    # twice the lit region and the mask is far more than enough at dx = p / 4.
    # That spacing aliases what the aperture's hard edges diffract beyond
    # lambda / (2 dx): an audit against the exact Fresnel slit pattern,
    # pixel-averaged, measured 1.4e-3 of the unit envelope for 21-25 mm
    # apertures at f = 50 mm (1.2e-4 at p / 16); the iris-like envelope is
    # flat to 4e-12 where the exact one ripples by 4e-4.
    extent = 2 * max(aperture, 2 * half_mask) + 64 * math.sqrt(wavelength * f)
    window = max(extent, wavelength * f / dx)
    n = _grid_size(window, dx, f"the fan-out's window of {window / p:.3g} pixel pitches (its "
                   f"aperture, {aperture:.3g} m; the mask, {2 * half_mask:.3g} m; the "
                   f"diffraction spread over f = {f:.3g} m) at 4 samples a pitch")
    x = propagation.coordinates(n, dx)
    stop = _cover(x, -aperture / 2, aperture / 2, dx)
    if optics.beam_profile == "gaussian":
        radius = wavelength * f / (math.pi * optics.beam_waist)
        beam = np.exp(-(x / radius) ** 2)
        source_power = radius * math.sqrt(math.pi / 2)  # integral of |beam|^2
    else:
        beam = np.ones_like(x)
        source_power = aperture
    lens_plane = beam * stop
    mask_plane = propagation.fresnel(lens_plane, wavelength=wavelength, pixel_pitch=dx,
                                     distance=f)
    centres = (np.arange(columns) - (columns - 1) / 2) * p
    half = math.sqrt(optics.fill_factor) * p / 2
    mean_power = _integrate(np.abs(mask_plane) ** 2, dx, 2 * half, centres) / (2 * half)
    mean_field = _integrate(mask_plane, dx, 2 * half, centres) / (2 * half)
    phase = np.exp(1j * np.angle(mean_field))
    # Far out in a beam's tail the integrated power can come out a rounding
    # error below zero: that is no light, not a NaN.
    return np.sqrt(np.maximum(mean_power, 0.0) / source_power) * phase


# --------------------------------------------------------------------------- #
# Applying the kernels to programmed transmissions
# --------------------------------------------------------------------------- #


def effective_tile(transmissions: np.ndarray, kern: Kernels, *,
                   column_offset: int = 0) -> np.ndarray:
    """Effective transmissions of one programmed tile: what the light sees.

    ``T[r, j, n]`` is the power detected on rail ``r`` of output ``n`` per unit
    power of source ``j``, in units of the nominal full-scale MAC: input
    coupling along the mask rows, the illumination envelope, and the coherent
    output coupling along the columns, all within the tile (light does not
    cross its edges). Costs ``O(k n radius**2)``; the digital side is left to
    the caller (this is the map a pre-distortion would invert).

    Parameters
    ----------
    transmissions : ndarray, shape (rails, k, n), float32 or float64
        Intensity transmissions of the tile's mask rails: finite and
        non-negative. A physical mask's lie in [0, 1]; the map scales with
        them (``c`` times every transmission gives ``c`` times the light),
        though it is not additive (neighbouring columns interfere through
        ``sqrt(t t')``), so larger values (an unclipped pre-distortion, say)
        are accepted, where
        :func:`optical.physics.fieldsim.simulate_tile` refuses them.
    kern : Kernels
        From :func:`kernels` for the configuration that programs the tile.
    column_offset : int
        First output of the tile within the core (tiles are loaded from the
        core's first output on, so 0 unless the caller places them otherwise).

    Returns
    -------
    ndarray, same shape and dtype (a new array).
    """
    if not isinstance(kern, Kernels):
        raise TypeError(f"kern: expected Kernels, got {type(kern).__name__}")
    t = _mask_apply.check_transmissions(transmissions, kern.rails)
    if isinstance(column_offset, bool) or not isinstance(column_offset, int | np.integer):
        raise TypeError(f"column_offset: expected an integer, got {type(column_offset).__name__}")
    outputs = kern.envelope_field.size // kern.rails
    if not 0 <= column_offset <= outputs - t.shape[2]:
        raise ValueError(f"transmissions: {t.shape[2]} outputs from output {column_offset} do "
                         f"not fit the core's {outputs} outputs")
    if t.shape[1] > kern.inputs:
        raise ValueError(f"transmissions: {t.shape[1]} rows exceed the core's {kern.inputs} "
                         "inputs")
    if kern.ideal:
        return t.copy()
    return _mask_apply.apply(t, kern, [(0, t.shape[1])], [(0, t.shape[2])], column_offset)


def effective_transmissions(transmissions: np.ndarray, tiling: Tiling, config: OpticalConfig, *,
                            out: np.ndarray | None = None) -> np.ndarray:
    """:func:`effective_tile` on every (K-tile, N-tile) of a programmed matrix.

    Parameters
    ----------
    transmissions : ndarray, shape (rails, K, N), float32 or float64
    tiling : optical.quant.Tiling
        How the matrix is cut into core-sized tiles.
    config : OpticalConfig
    out : ndarray, optional
        Where to write the result (same shape and dtype, C-contiguous); may be
        ``transmissions`` itself, which saves a copy of the matrix.

    Returns
    -------
    ndarray, same shape and dtype; ``transmissions`` itself (or ``out``
    holding a copy of it) for ideal optics.
    """
    kern = kernels(config)
    if out is not None and (not isinstance(out, np.ndarray) or out.shape != np.shape(
            transmissions) or out.dtype != getattr(transmissions, "dtype", None)
            or not out.flags.c_contiguous):
        raise ValueError("out: expected a C-contiguous array of the transmissions' shape "
                         "and dtype")
    if kern.ideal:
        if out is None or out is transmissions:
            return transmissions
        out[...] = transmissions
        return out
    t = _mask_apply.check_transmissions(transmissions, kern.rails)
    if t.shape[1:] != (tiling.k, tiling.n):
        raise ValueError(f"transmissions: shape {t.shape} does not match the tiling's "
                         f"({tiling.k}, {tiling.n})")
    if tiling.tile_k > kern.inputs or tiling.tile_n * kern.rails > kern.envelope_field.size:
        raise ValueError("tiling: tiles are larger than the core the kernels describe")
    return _mask_apply.apply_tiled(t, kern, tiling, out)
