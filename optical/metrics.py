"""Accuracy of a test result against a reference (reference first, test second).

All metrics are computed in float64 over every element of the arrays.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["cosine", "max_abs_error", "relative_error", "sqnr_db"]


def _pair(reference: object, test: object) -> tuple[np.ndarray, np.ndarray]:
    ref = np.asarray(reference, dtype=np.float64)
    out = np.asarray(test, dtype=np.float64)
    if ref.shape != out.shape:
        raise ValueError(f"shape mismatch: reference {ref.shape} vs test {out.shape}")
    if ref.size == 0:
        raise ValueError("metrics of empty arrays are undefined")
    for name, arr in (("reference", ref), ("test", out)):
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} contains NaN or infinite values")
    return ref.ravel(), out.ravel()


def sqnr_db(reference: object, test: object) -> float:
    """Signal-to-quantisation-noise ratio, dB: ``10 log10(sum ref^2 / sum (ref - test)^2)``.

    ``inf`` when the arrays are equal; ``-inf`` when the reference is zero and
    the test is not.
    """
    ref, out = _pair(reference, test)
    signal = float(np.dot(ref, ref))
    err = ref - out
    error = float(np.dot(err, err))
    if error == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / error)


def cosine(reference: object, test: object) -> float:
    """Cosine similarity of the flattened arrays (1 for equal directions)."""
    ref, out = _pair(reference, test)
    norm = float(np.linalg.norm(ref) * np.linalg.norm(out))
    if norm == 0.0:
        return 1.0 if not ref.any() and not out.any() else 0.0
    return float(np.dot(ref, out) / norm)


def relative_error(reference: object, test: object) -> float:
    """``||ref - test|| / ||ref||`` (Frobenius); ``inf`` if the reference is zero
    and the test is not."""
    ref, out = _pair(reference, test)
    num = float(np.linalg.norm(ref - out))
    den = float(np.linalg.norm(ref))
    if num == 0.0:
        return 0.0
    return num / den if den else math.inf


def max_abs_error(reference: object, test: object) -> float:
    """Largest elementwise absolute difference."""
    ref, out = _pair(reference, test)
    return float(np.max(np.abs(ref - out)))
