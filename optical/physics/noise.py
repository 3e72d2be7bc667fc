"""Source and detector noise: shot, dark, read/TIA and relative intensity noise.

Every stochastic function takes ``seed`` and ``index`` (uint64 array, one
entry per draw): the draw for a given (seed, index) never depends on how
many other draws are made, in what order or in which chunk (see
``optical._rng``).

Photoelectron counts are in electrons; intensities are relative (dimensionless).
"""

from __future__ import annotations

import math

import numpy as np

from optical import _rng

__all__ = [
    "ELEMENTARY_CHARGE",
    "LIGHT_SPEED",
    "PLANCK",
    "dark_noise",
    "read_noise",
    "rin_factors",
    "rin_sigma",
    "shot_noise",
    "tia_noise_electrons",
]

#: Elementary charge, C (exact, SI 2019).
ELEMENTARY_CHARGE = 1.602176634e-19
#: Planck constant, J s, and the speed of light, m / s (exact, SI 2019): the
#: library's one copy (photon energies, quantum efficiency from responsivity).
PLANCK = 6.62607015e-34
LIGHT_SPEED = 299792458.0


def rin_sigma(rin_db_per_hz: float, bandwidth: float) -> float:
    """Relative standard deviation of a source's intensity from its RIN.

    Parameters
    ----------
    rin_db_per_hz : float, dB/Hz
        One-sided relative intensity noise density; ``-inf`` for none.
    bandwidth : float, Hz
        Detection bandwidth the density is integrated over.

    Returns
    -------
    float, dimensionless
        ``sqrt(10**(rin/10) * bandwidth)``; e.g. -150 dB/Hz over 1 GHz gives 1e-3.
    """
    if not 0 < bandwidth < math.inf:
        raise ValueError(f"bandwidth: {bandwidth} must be finite and > 0 Hz")
    if math.isnan(rin_db_per_hz) or rin_db_per_hz == math.inf:
        raise ValueError(f"rin_db_per_hz: {rin_db_per_hz} must be finite, or -inf for none")
    if rin_db_per_hz == -math.inf:
        return 0.0
    return math.sqrt(10.0 ** (rin_db_per_hz / 10.0) * bandwidth)


def tia_noise_electrons(current_noise_density: float, bandwidth: float) -> float:
    """Input-referred RMS noise, in electrons, of a TIA read out once per
    ``1 / bandwidth`` seconds.

    The convention: a receiver whose noise bandwidth equals its readout rate
    ``B``, its RMS noise current ``i_n sqrt(B)`` held over ``tau = 1 / B``: a
    charge ``i_n / sqrt(B)``. This is 3 dB (in variance) above an ideal
    integrate-and-dump over the same window, whose noise bandwidth is
    ``1 / (2 tau)`` (charge ``i_n sqrt(tau / 2)``: 1396 electrons in the
    example below) and whose shot noise is exactly the Poisson count the
    detector draws: conservative for TIA noise against shot noise. The RIN
    of :func:`rin_sigma` is integrated over the same ``B``.

    Parameters
    ----------
    current_noise_density : float, A/sqrt(Hz)
    bandwidth : float, Hz

    Returns
    -------
    float, electrons
        e.g. 10 pA/sqrt(Hz) at 1 GHz gives about 1974 electrons.
    """
    if not 0 <= current_noise_density < math.inf:
        raise ValueError(f"current_noise_density: {current_noise_density} must be finite "
                         "and >= 0 A/sqrt(Hz)")
    if not 0 < bandwidth < math.inf:
        raise ValueError(f"bandwidth: {bandwidth} must be finite and > 0 Hz")
    return current_noise_density / math.sqrt(bandwidth) / ELEMENTARY_CHARGE


def shot_noise(mean_electrons: np.ndarray, *, model: str, seed: int,
               index: np.ndarray) -> np.ndarray:
    """Photoelectron counts with shot noise around ``mean_electrons``.

    Parameters
    ----------
    mean_electrons : ndarray, electrons
        Expected counts, finite and ``>= 0`` (else ValueError).
    model : {"poisson", "gaussian"}
        Poisson counts (exact up to a mean of 2**32, rounded normal above:
        ``optical._rng.poisson``), or ``mean + sqrt(mean) * N(0, 1)``.
    seed : int
    index : ndarray of uint64
        One counter per draw, broadcastable with ``mean_electrons``.

    Returns
    -------
    ndarray of float64, electrons
    """
    if model not in ("poisson", "gaussian"):
        raise ValueError(f"shot noise model {model!r} is not valid; valid: 'poisson', 'gaussian'")
    mean = np.asarray(mean_electrons, dtype=np.float64)
    # min and max propagate NaN; a NaN mean would never end Poisson rejection.
    if mean.size and not (mean.min() >= 0 and mean.max() < math.inf):
        raise ValueError("mean_electrons: must be finite and >= 0 electrons; got values in "
                         f"[{mean.min()}, {mean.max()}]")
    if model == "poisson":
        return _rng.poisson(seed, _rng.STREAMS["shot"], index, mean)
    key = _rng.stream_key(seed, _rng.STREAMS["shot"])
    return mean + np.sqrt(mean) * _rng.normal(key, index)


def dark_noise(dark_electrons: float, *, model: str, seed: int, index: np.ndarray) -> np.ndarray:
    """Dark counts minus their mean (which is subtracted digitally), electrons.

    ``dark_electrons`` (mean counts per readout, finite and >= 0) are Poisson
    or Gaussian as ``model`` says, as for :func:`shot_noise`.
    """
    if model not in ("poisson", "gaussian"):
        raise ValueError(f"dark noise model {model!r} is not valid; valid: 'poisson', 'gaussian'")
    if not 0 <= dark_electrons < math.inf:
        raise ValueError(f"dark_electrons: {dark_electrons} must be finite and >= 0")
    if dark_electrons == 0:
        return np.zeros(np.shape(index))
    mean = np.full(np.shape(index), float(dark_electrons))
    if model == "poisson":
        return _rng.poisson(seed, _rng.STREAMS["dark"], index, mean, deviation=True)
    key = _rng.stream_key(seed, _rng.STREAMS["dark"])
    return math.sqrt(dark_electrons) * _rng.normal(key, index)


def read_noise(sigma_electrons: float, *, seed: int, index: np.ndarray) -> np.ndarray:
    """Gaussian read/TIA noise, electrons RMS ``sigma_electrons`` (finite, >= 0)."""
    if not 0 <= sigma_electrons < math.inf:
        raise ValueError(f"sigma_electrons: {sigma_electrons} must be finite and >= 0")
    if sigma_electrons == 0:
        return np.zeros(np.shape(index))
    return sigma_electrons * _rng.normal(_rng.stream_key(seed, _rng.STREAMS["read"]), index)


def rin_factors(sigma: float, *, seed: int, index: np.ndarray) -> np.ndarray:
    """Multiplicative intensity factors ``max(1 + sigma * N(0, 1), 0)``, one
    per source per pass: the same factor scales that source's light on every
    output of the pass, so RIN is correlated across outputs. A fluctuation
    that would make the light negative leaves the source dark (reached only
    near the model's limit, sigma = 1). ``sigma`` is finite, >= 0."""
    if not 0 <= sigma < math.inf:
        raise ValueError(f"sigma: {sigma} must be finite and >= 0")
    if sigma == 0:
        return np.ones(np.shape(index))
    return np.maximum(1.0 + sigma * _rng.normal(_rng.stream_key(seed, _rng.STREAMS["rin"]), index),
                      0.0)
