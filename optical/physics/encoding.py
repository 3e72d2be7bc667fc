"""Signed values to non-negative light levels, and back.

Light intensity and mask transmission are non-negative, but inputs and weights
are signed. A value ``v`` in [-1, 1] becomes one or two *rails* of levels
``u`` in [0, 1]:

- ``"offset"``: one rail, ``u = (v + 1) / 2``. Costs the shot noise of the
  offset light and a bit of signed resolution: ``2**b`` levels of ``u`` span
  [-1, 1] in steps of ``2 / (2**b - 1)``, with no level at 0 (a mid-rise
  quantiser; a zero reads half a step high from 2 bits on); the offset is
  removed digitally.
- ``"split"``: two rails, ``u+ = max(v, 0)`` and ``u- = max(-v, 0)``, carried
  on separate passes (inputs) or separate detector rails (weights): sign and
  magnitude, ``2**(b+1) - 1`` signed levels in steps of ``1 / (2**b - 1)``,
  0 among them (6 dB more SQNR at the same ``b``).

The same maps serve inputs (source intensities) and weights (mask levels).
Decoding is linear, ``v = sum_r c_r u_r + c_0``, which is what lets the
digital side undo the encoding of a dot product from its rail readouts:
``sum_j a_j v_j = sum_r c_r (sum_j a_j u_rj) + c_0 sum_j a_j``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SCHEMES", "decode", "encode", "n_rails", "rail_coefficients"]

SCHEMES = ("offset", "split")

_COEFFICIENTS = {"offset": ((2.0,), -1.0), "split": ((1.0, -1.0), 0.0)}


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown encoding {scheme!r}; valid: {', '.join(SCHEMES)}")


def n_rails(scheme: str) -> int:
    """Number of rails the scheme uses (1 for offset, 2 for split)."""
    _check_scheme(scheme)
    return len(_COEFFICIENTS[scheme][0])


def rail_coefficients(scheme: str) -> tuple[tuple[float, ...], float]:
    """``(c_r, c_0)`` with ``v = sum_r c_r u_r + c_0``."""
    _check_scheme(scheme)
    return _COEFFICIENTS[scheme]


def encode(v: np.ndarray, scheme: str) -> np.ndarray:
    """Map values in [-1, 1] to rail levels in [0, 1].

    Parameters
    ----------
    v : ndarray, dimensionless
        Normalised signed values, ``|v| <= 1``.
    scheme : {"offset", "split"}

    Returns
    -------
    ndarray of shape ``(n_rails, *v.shape)``, same dtype as ``v``.
    """
    _check_scheme(scheme)
    v = np.asarray(v)
    if v.size and not np.all(np.abs(v) <= 1):
        raise ValueError("encode: values must lie in [-1, 1] (normalise first)")
    if scheme == "offset":
        return ((v + 1) / 2)[None]
    zero = np.zeros((), dtype=v.dtype)
    return np.stack([np.maximum(v, zero), np.maximum(-v, zero)])


def decode(u: np.ndarray, scheme: str) -> np.ndarray:
    """Inverse of :func:`encode` along the leading rail axis."""
    coeffs, const = rail_coefficients(scheme)
    u = np.asarray(u)
    if u.shape[:1] != (len(coeffs),):
        raise ValueError(f"decode: expected {len(coeffs)} rails on axis 0 for {scheme!r}, "
                         f"got shape {u.shape}")
    out = coeffs[0] * u[0]
    for c, rail in zip(coeffs[1:], u[1:], strict=True):
        out = out + c * rail
    return (out + const).astype(u.dtype, copy=False)
