"""How many photons per MAC a dot product of width d needs, measured with the emulator.

For each width ``d`` the emulator runs ``x (tokens, d) @ w (d, outputs)`` on a
core whose fan-in is ``d`` (one detector readout sums the whole dot product)
and finds the ``photons_per_mac`` ``p*`` at which the output SNR
(:func:`optical.metrics.sqnr_db` against the exact product) reaches a target;
a power-law fit of ``p*`` against ``d`` gives the scaling exponent.

Why the exponent depends on the operands. Shot noise makes the output noise
variance grow like ``d / p`` (every MAC adds photons). The signal grows like
``d`` when the operands have a non-zero mean (a *coherent* sum: activations
and weights of real transformers, the setting of Anderson et al., "Optical
Transformers", 2024), so ``SNR ~ d p`` and ``p* ~ 1/d``: the optical energy
per MAC falls as ``1/d``. For zero-mean random operands the signal grows only
like ``sqrt(d)``, so ``SNR ~ p`` and ``p*`` does not depend on ``d``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import numpy as np

from optical import metrics, presets
from optical._gemm import cols_matmul
from optical._validation import check_nonnegative_int, check_positive_int, check_seed
from optical.config import (
    MAX_FINITE_PHOTONS_PER_MAC,
    MIN_PHOTONS_PER_MAC,
    OpticalConfig,
    check_config,
)
from optical.core import matmul, schedule
from optical.energy import model

__all__ = ["OPERANDS", "PhotonRequirement", "PhotonScaling", "output_snr_db",
           "photon_scaling", "power_law_exponent", "required_photons"]

#: Operand distributions: name -> (low, high) of i.i.d. uniform inputs and weights.
OPERANDS = {"coherent": (0.0, 1.0), "zero_mean": (-1.0, 1.0)}


def _operands(width: int, tokens: int, outputs: int, operands: str,
              seed: int) -> tuple[np.ndarray, np.ndarray]:
    if operands not in OPERANDS:
        raise ValueError(f"operands: {operands!r} is not valid; valid: "
                         f"{', '.join(repr(o) for o in OPERANDS)}")
    width, tokens, outputs = (check_positive_int(value, name) for name, value in
                              (("width", width), ("tokens", tokens), ("outputs", outputs)))
    low, high = OPERANDS[operands]
    rng = np.random.default_rng(seed)
    x = rng.uniform(low, high, size=(tokens, width))
    w = rng.uniform(low, high, size=(width, outputs))
    return x, w


def _width_config(config: OpticalConfig | None, width: int, outputs: int) -> OpticalConfig:
    base = presets.get("ideal") if config is None else config
    check_config(base)
    return base.replace({"core.inputs": width, "core.outputs": outputs})


def output_snr_db(width: int, photons_per_mac: float, *, operands: str = "coherent",
                  tokens: int = 64, outputs: int = 64, config: OpticalConfig | None = None,
                  seed: int = 0) -> float:
    """Output SNR, dB, of the emulated ``x @ w`` at one photon count.

    ``config`` (default: the ideal preset) is used with ``core.inputs = width``
    and ``core.outputs = outputs``; the same ``seed`` draws the operands and
    the noise, so SNRs at different photon counts share their random numbers.

    Parameters
    ----------
    width : int
        K, the inputs summed per output (one tile's width).
    photons_per_mac : float, photons
    operands : {"coherent", "zero_mean"}
        ``x`` (tokens, width) and ``w`` (width, outputs) drawn uniform on
        [0, 1] ("coherent": the products add up, the signal grows as K) or
        on [-1, 1] ("zero_mean": it grows as sqrt(K)).
    tokens, outputs : int
        Rows of ``x`` and columns of ``w``.
    config : OpticalConfig, optional
        Default: the ideal preset (shot noise only).
    seed : int
    """
    x, w = _operands(width, tokens, outputs, operands, check_seed(seed))
    cfg = _width_config(config, width, outputs).replace(
        {"source.photons_per_mac": float(photons_per_mac)})
    return metrics.sqnr_db(cols_matmul(x, w), matmul(x, w, cfg, seed=seed))


@dataclasses.dataclass(frozen=True)
class PhotonRequirement:
    """The photons per MAC one width needs for a target SNR.

    Attributes
    ----------
    width : int
    photons_per_mac : float, photons
        Detected photons per MAC at which the fitted SNR equals the target.
    snr_slope_db_per_decade : float, dB
        Fitted SNR gain per tenfold photons near ``photons_per_mac`` (10 for
        shot noise alone).
    laser_energy_per_mac : float, J
        Electrical source energy per MAC at ``photons_per_mac``: the
        schedule's source activations times
        :func:`optical.energy.model.laser_energy_per_activation`, over its MACs.
    points : tuple of (photons, snr_db)
        The measurements of the final fit.
    """

    width: int
    photons_per_mac: float
    snr_slope_db_per_decade: float
    laser_energy_per_mac: float
    points: tuple[tuple[float, float], ...]


def required_photons(width: int, *, target_snr_db: float = 20.0, operands: str = "coherent",
                     tokens: int = 64, outputs: int = 64, config: OpticalConfig | None = None,
                     seed: int = 0, max_steps: int = 12) -> PhotonRequirement:
    """Find the photons per MAC at which the emulated output SNR reaches a target.

    Steps towards the target from 100 photons per MAC by secant steps in
    (``log10(photons)``, SNR dB), the first assuming the shot-noise slope;
    then measures the SNR at three photon counts a quarter-decade apart
    around the last step and solves a least-squares line of SNR against
    ``log10(photons)`` for the target.

    Parameters
    ----------
    width, operands, tokens, outputs, config, seed
        As :func:`output_snr_db`.
    target_snr_db : float, dB
    max_steps : int
        Secant steps allowed before the final fit (0: the start must already
        be within 0.5 dB of the target).

    Returns
    -------
    PhotonRequirement

    Raises
    ------
    ValueError
        If the SNR does not rise with photons (a floor set by other noise or
        the converters), the target is not reached within ``max_steps``, or
        it needs photon counts beyond a config's range (1e-30 to 1e30 per MAC).
    """
    if isinstance(target_snr_db, bool) or not isinstance(target_snr_db, numbers.Real) \
            or not math.isfinite(target_snr_db):
        raise ValueError(f"target_snr_db: {target_snr_db!r} must be a finite number")
    max_steps = check_nonnegative_int(max_steps, "max_steps")

    start = 100.0

    def snr(p: float) -> float:
        if not MIN_PHOTONS_PER_MAC <= p <= MAX_FINITE_PHOTONS_PER_MAC:  # what a config takes
            side = "more" if p > 1 else "fewer"
            bound = MAX_FINITE_PHOTONS_PER_MAC if p > 1 else MIN_PHOTONS_PER_MAC
            raise ValueError(f"target_snr_db: {target_snr_db} dB needs {side} than {bound:g} "
                             f"photons per MAC, beyond the range a config takes (searching "
                             f"from {start:g} photons per MAC at {first:.2f} dB)")
        return output_snr_db(width, p, operands=operands, tokens=tokens, outputs=outputs,
                             config=config, seed=seed)

    # Secant steps in (log10 p, SNR dB), starting from the shot-noise slope of
    # 10 dB per decade (read noise alone gives 20).
    first = snr(start)
    p, value, slope = start, first, 10.0
    for _ in range(max_steps):
        if abs(value - target_snr_db) < 0.5:
            break
        step = float(np.clip((target_snr_db - value) / slope, -3.0, 3.0))
        p_next = p * 10.0 ** step
        v_next = snr(p_next)
        if (v_next - value) * step <= 0:
            raise ValueError(f"width {width}: the SNR does not rise with photons_per_mac "
                             f"({value:.2f} dB at {p:.3g}, {v_next:.2f} dB at {p_next:.3g}); "
                             f"{_flat(target_snr_db, max(value, v_next))}")
        slope = (v_next - value) / step
        p, value = p_next, v_next
    if not abs(value - target_snr_db) < 0.5:
        raise ValueError(f"width {width}: target {target_snr_db} dB not reached in "
                         f"{max_steps} steps (last {value:.2f} dB at {p:.3g} photons/MAC)")
    probes = [p * 10.0 ** s for s in (-0.25, 0.0, 0.25)]
    values = [value if s == 0.0 else snr(q) for s, q in zip((-0.25, 0.0, 0.25), probes,
                                                            strict=True)]
    slope, intercept = np.polyfit(np.log10(probes), values, 1)
    if not slope > 0:
        raise ValueError(f"width {width}: the SNR does not rise with photons_per_mac near "
                         f"{p:.3g} ({', '.join(f'{v:.2f}' for v in values)} dB at "
                         f"{', '.join(f'{q:.3g}' for q in probes)}); "
                         f"{_flat(target_snr_db, max(values))}")
    p_star = float(10.0 ** ((target_snr_db - intercept) / slope))
    cfg = _width_config(config, width, outputs).replace({"source.photons_per_mac": p_star})
    s = schedule(tokens, width, outputs, cfg)
    laser = s.dac_conversions * model.laser_energy_per_activation(cfg) / s.macs
    return PhotonRequirement(width=width, photons_per_mac=p_star,
                             snr_slope_db_per_decade=float(slope), laser_energy_per_mac=laser,
                             points=tuple(zip(probes, values, strict=True)))


def _flat(target_snr_db: float, best: float) -> str:
    """What an SNR that does not rise with photons means for the target: out
    of reach above its best, else met (no photon count is the one that gives it)."""
    if target_snr_db > best:
        return f"target {target_snr_db} dB is not reachable with this config"
    return (f"target {target_snr_db} dB is met there: the SNR is set by other noise or the "
            "converters, not by the photons, so no photon count is the one that gives it")


@dataclasses.dataclass(frozen=True)
class PhotonScaling:
    """Photons per MAC against dot-product width, and the fitted exponents.

    Attributes
    ----------
    operands : str
    target_snr_db : float, dB
    requirements : tuple of PhotonRequirement
    photons_exponent : float
        Slope of ``log p*`` against ``log d`` (-1 for coherent operands).
    energy_exponent : float
        Slope of ``log(laser energy per MAC)`` against ``log d``.
    """

    operands: str
    target_snr_db: float
    requirements: tuple[PhotonRequirement, ...]
    photons_exponent: float
    energy_exponent: float


def power_law_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or not (np.isfinite(x).all() and np.isfinite(y).all()) \
            or np.any(x <= 0) or np.any(y <= 0) or np.unique(x).size < 2:
        raise ValueError("power_law_exponent: need at least two positive, finite (x, y) pairs "
                         "at two different x or more")
    return float(np.polyfit(np.log(x), np.log(y), 1)[0])


def photon_scaling(widths: Sequence[int], *, target_snr_db: float = 20.0,
                   operands: str = "coherent", tokens: int = 64, outputs: int = 64,
                   config: OpticalConfig | None = None, seed: int = 0) -> PhotonScaling:
    """:func:`required_photons` for each width and the power-law exponents."""
    if isinstance(widths, np.ndarray):
        widths = widths.tolist()
    if isinstance(widths, str | bytes) or not isinstance(widths, Sequence) or \
            len(set(widths)) < 2:
        raise ValueError(f"widths: {widths!r}: need at least two different widths for the "
                         "exponents")
    reqs = tuple(required_photons(d, target_snr_db=target_snr_db, operands=operands,
                                  tokens=tokens, outputs=outputs, config=config, seed=seed)
                 for d in widths)
    d = [r.width for r in reqs]
    return PhotonScaling(
        operands=operands, target_snr_db=target_snr_db, requirements=reqs,
        photons_exponent=power_law_exponent(d, [r.photons_per_mac for r in reqs]),
        energy_exponent=power_law_exponent(d, [r.laser_energy_per_mac for r in reqs]))
