"""DAC, mask and ADC: uniform quantisers with a range, clipping and ENOB noise.

A ``bits``-bit converter has ``2**bits`` levels spread evenly over its range,
ends included, so its step is ``range / (2**bits - 1)``. ``bits=None`` is the
ideal converter: no quantisation and, for the ADC, no clipping.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "adc_quantize",
    "adc_step",
    "enob_noise_std",
    "quantize_levels",
    "top_code",
    "transmission",
]


def _valid_bits(bits: object) -> bool:
    return not isinstance(bits, bool) and isinstance(bits, int | np.integer) and 1 <= bits <= 24


def _check_bits(bits: int | None) -> None:
    if bits is not None and not _valid_bits(bits):
        raise ValueError(f"bits: {bits!r} is not valid; valid: integer in [1, 24] or None")


def top_code(bits: int | None) -> int:
    """A ``bits``-bit converter's largest code, ``2**bits - 1``; 0 for an ideal
    one (``bits=None``), which is how the kernels are told not to quantise."""
    _check_bits(bits)
    return 0 if bits is None else (1 << int(bits)) - 1


def quantize_levels(u: np.ndarray, bits: int | None) -> np.ndarray:
    """Round levels in [0, 1] to the nearest of ``2**bits`` evenly spaced levels.

    Used for DAC drive levels (source intensities) and mask levels. Values
    outside [0, 1] clip to the ends: a source cannot emit negative light nor
    a pixel transmit more than fully open. ``bits=None`` (an ideal converter)
    returns ``u`` unchanged, neither rounded nor clipped.

    Parameters
    ----------
    u : ndarray, dimensionless
    bits : int or None
    """
    _check_bits(bits)
    u = np.asarray(u)
    if u.dtype.kind == "f" and u.dtype.itemsize < 4:  # 2**16 - 1 is inf in float16
        raise TypeError(f"u: dtype {u.dtype} is not supported; pass float32 or float64 levels")
    if bits is None:
        return u
    top = u.dtype.type(top_code(bits))
    return np.rint(np.clip(u, 0, 1) * top) / top


def transmission(u: np.ndarray, min_transmission: float) -> np.ndarray:
    """Mask transmission of level ``u``: ``t_min + (1 - t_min) u`` in [t_min, 1].

    Parameters
    ----------
    u : ndarray, dimensionless
        Mask level in [0, 1].
    min_transmission : float, dimensionless
        Transmission of a fully closed pixel, ``1 / contrast_ratio``.
    """
    if not 0.0 <= min_transmission < 1.0:
        raise ValueError(f"min_transmission: {min_transmission} is out of range; valid: [0, 1)")
    u = np.asarray(u)
    t_min = u.dtype.type(min_transmission)
    return t_min + (1 - t_min) * u


def adc_step(lo: np.ndarray, hi: np.ndarray, bits: int) -> np.ndarray:
    """Code width of a ``bits``-bit ADC spanning [lo, hi]."""
    if bits is None or not _valid_bits(bits):
        raise ValueError(f"bits: {bits!r} is not valid; valid: integer in [1, 24] (an ideal "
                         "ADC, None, has no code width)")
    return (np.asarray(hi) - np.asarray(lo)) / top_code(bits)


def enob_noise_std(lo: np.ndarray, hi: np.ndarray, bits: int, enob: float | None) -> np.ndarray:
    """Standard deviation of the Gaussian noise that makes a ``bits``-bit ADC
    perform as an ideal ``enob``-bit one.

    An ideal converter's error variance is ``step**2 / 12``; one with ``enob``
    effective bits has ``(step * 2**(bits - enob))**2 / 12``. The difference is
    added as input-referred Gaussian noise before rounding.

    Returned in float64 whatever the windows' dtype (the noise is drawn in
    float64 and added to the readouts before they are rounded; it was float64
    with an ENOB loss and the windows' dtype without one). The product is
    taken as before, then widened: the same values under numpy 1.x, whose
    value-based casting keeps a float32 step's product in float32, and 2.x.
    """
    step = adc_step(lo, hi, bits)
    if enob is None or enob >= bits:
        return np.zeros(np.shape(step))
    return np.asarray(step * np.sqrt((4.0 ** (bits - enob) - 1.0) / 12.0), dtype=np.float64)


def adc_quantize(r: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                 bits: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Digitise readouts ``r`` with an ADC whose window is [lo, hi].

    Parameters
    ----------
    r : ndarray
        Readouts (any unit; ``lo`` and ``hi`` share it and broadcast with it).
    lo, hi : ndarray
        Window ends, ``lo <= hi`` (else ValueError). A zero-width window returns ``lo``.
    bits : int or None
        ``None`` returns ``r`` unchanged and never clips.

    Returns
    -------
    values : ndarray
        The reconstructed readouts, ``lo + code * step``, dtype of ``r``.
    clipped : ndarray of bool
        Where the readout's nearest code (half to even) lies outside the
        window: more than half a step below it, or half a step or more above
        it (the top code, ``2**bits - 1``, is odd).
    """
    _check_bits(bits)
    r = np.asarray(r)
    if bits is None:
        return r, np.zeros(r.shape, dtype=bool)
    lo = np.asarray(lo, dtype=r.dtype)
    hi = np.asarray(hi, dtype=r.dtype)
    inverted = lo > hi
    if np.any(inverted):
        first = np.unravel_index(np.argmax(inverted), inverted.shape)
        lo_b, hi_b = np.broadcast_arrays(lo, hi)
        raise ValueError(f"lo, hi: the ADC window needs lo <= hi; got lo = {lo_b[first]} > "
                         f"hi = {hi_b[first]} (in {np.count_nonzero(inverted)} window(s))")
    top = top_code(bits)
    step = (hi - lo) / top
    safe = np.where(step > 0, step, 1)
    code = np.rint((r - lo) / safe)
    clipped = ((code < 0) | (code > top)) & (step > 0)
    code = np.clip(code, 0, top)
    return (lo + code * np.where(step > 0, step, 0)).astype(r.dtype, copy=False), clipped
