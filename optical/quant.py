"""Programming the mask: what is loaded on the hardware once per weight load.

:func:`program` turns a weight matrix into :class:`ProgrammedWeights`: the
per-column scales, the quantised mask transmissions of every rail (the
physical, effective ones that the light sees), the weights the digital side
believes it programmed, and the ADC window of every column of every K-tile.
:func:`optical.matmul` streams inputs through it and does no weight work.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from optical._validation import check_float_array
from optical.config import OpticalConfig
from optical.physics import converters, crosstalk, encoding

__all__ = ["ProgrammedWeights", "Tiling", "adc_rails", "program"]

#: Config paths that programming does not depend on: a programmed matrix may
#: be used with configs that differ only in these.
PROGRAM_INDEPENDENT = ("dac.bits", "dac.scaling")

# Mean and variance of one pass's source levels when the normalised input is
# uniform on [-1, 1]: the assumption of the "rms" ADC window.
_UNIFORM_INPUT_MOMENTS = {"offset": (1 / 2, 1 / 12), "split": (1 / 4, 5 / 48)}


@dataclasses.dataclass(frozen=True)
class Tiling:
    """How a (K, N) matrix is cut into core-sized tiles."""

    k: int
    n: int
    tile_k: int
    tile_n: int

    @property
    def k_tiles(self) -> int:
        return -(-self.k // self.tile_k)

    @property
    def n_tiles(self) -> int:
        return -(-self.n // self.tile_n)

    def k_slice(self, i: int) -> slice:
        return slice(i * self.tile_k, min((i + 1) * self.tile_k, self.k))

    def n_slice(self, i: int) -> slice:
        return slice(i * self.tile_n, min((i + 1) * self.tile_n, self.n))


def adc_rails(config: OpticalConfig) -> np.ndarray:
    """How detector rails combine into ADC readouts: a (n_adc, n_detector) matrix.

    Split weights on balanced detectors are subtracted in analogue before one
    ADC; otherwise every detector rail has its own ADC.
    """
    n_det = encoding.n_rails(config.encoding.weights)
    if n_det == 2 and config.detector.balanced:
        return np.array([[1.0, -1.0]])
    return np.eye(n_det)


@dataclasses.dataclass(frozen=True, eq=False)
class ProgrammedWeights:
    """A weight matrix as loaded on the mask, with everything derived from it
    once per weight load.

    Attributes
    ----------
    config : OpticalConfig
        The configuration it was programmed for.
    tiling : Tiling
    scale : ndarray, shape (k_tiles, N)
        Weight scale of every column of every K-tile: the rows of K-tile ``i``
        hold ``w[rows, n] ~ scale[i, n] * weights[rows, n]``. Restored
        digitally before the K-tiles' partial sums are added.
    weights : ndarray, shape (K, N)
        Normalised, quantised weights in [-1, 1] as the digital side believes
        they are programmed (used to undo the encoding).
    weight_sums : ndarray, shape (k_tiles, N)
        Column sums of ``weights`` over each K-tile.
    transmissions : ndarray, shape (rails, K, N)
        Physical transmission of each mask rail as the light sees it.
    adc_lo, adc_hi : ndarray, shape (k_tiles, adc_rails, N)
        ADC window of every column of every K-tile, in units of full-scale
        MACs (photoelectrons divided by ``photons_per_mac``).
    input_range : float or None
        A static input full scale (e.g. from calibration): inputs are divided
        by it and clipped to [-1, 1]. ``None``: ``dac.scaling`` decides
        (dynamic abs-max).
    """

    config: OpticalConfig
    tiling: Tiling
    scale: np.ndarray
    weights: np.ndarray
    weight_sums: np.ndarray
    transmissions: np.ndarray
    adc_lo: np.ndarray
    adc_hi: np.ndarray
    input_range: float | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.tiling.k, self.tiling.n)

    @property
    def dtype(self) -> np.dtype:
        return self.weights.dtype

    def check_compatible(self, config: OpticalConfig) -> None:
        """Raise ValueError if ``config`` differs from the programming config in
        anything programming depends on, naming the differing paths."""
        differing = [p for p in self.config.diff(config) if p not in PROGRAM_INDEPENDENT]
        if differing:
            raise ValueError(
                "programmed weights do not match this config (re-program them): "
                + ", ".join(f"{p} = {self.config.get(p)!r} when programmed, "
                            f"{config.get(p)!r} now" for p in differing)
            )


def _column_scale(w: np.ndarray, policy: str) -> np.ndarray:
    absmax = np.max(np.abs(w), axis=0) if policy == "per_column" else np.full(
        w.shape[1], np.max(np.abs(w)) if w.size else 0.0)
    return np.where(absmax > 0, absmax, 1).astype(w.dtype)


def program(w: np.ndarray, config: OpticalConfig) -> ProgrammedWeights:
    """Program a weight matrix onto the mask.

    Parameters
    ----------
    w : ndarray, shape (K, N), float32 or float64
        The weights, ``y = x @ w``.
    config : OpticalConfig

    Returns
    -------
    ProgrammedWeights
    """
    if not isinstance(config, OpticalConfig):
        raise TypeError(f"config: expected an OpticalConfig, got {type(config).__name__}")
    w = check_float_array(w, "w", ndim=2)
    if 0 in w.shape:
        raise ValueError(f"w: shape {w.shape} has an empty dimension")
    k, n = w.shape
    tiling = Tiling(k, n, config.core.inputs, config.core.outputs)
    column_scale = _column_scale(w, config.mask.scaling)
    scale = np.repeat(column_scale[None, :], tiling.k_tiles, axis=0)
    t_min = config.mask.min_transmission
    levels = converters.quantize_levels(encoding.encode(w / column_scale, config.encoding.weights),
                                        config.mask.bits)
    weights = encoding.decode(levels, config.encoding.weights)
    transmissions = converters.transmission(levels, t_min)
    # What the light sees: lens crosstalk and illumination within each tile
    # (identity for ideal optics). The digital side keeps the nominal weights.
    transmissions = crosstalk.effective_transmissions(transmissions, tiling, config,
                                                      out=transmissions)
    weight_sums = np.stack([weights[tiling.k_slice(i)].sum(axis=0)
                            for i in range(tiling.k_tiles)])
    lo, hi = _adc_windows(transmissions, tiling, config)
    return ProgrammedWeights(config, tiling, scale, weights, weight_sums, transmissions, lo, hi)


def _adc_windows(transmissions: np.ndarray, tiling: Tiling,
                 config: OpticalConfig) -> tuple[np.ndarray, np.ndarray]:
    """ADC window per (K-tile, ADC rail, column), in full-scale-MAC units."""
    g = adc_rails(config)
    p = config.source.photons_per_mac
    mean_a, var_a = _UNIFORM_INPUT_MOMENTS[config.encoding.inputs]
    lo = np.empty((tiling.k_tiles, g.shape[0], tiling.n), dtype=transmissions.dtype)
    hi = np.empty_like(lo)
    for i in range(tiling.k_tiles):
        t = transmissions[:, tiling.k_slice(i)].astype(np.float64)  # (rails, k, N)
        combined = np.einsum("er,rkn->ekn", g, t)
        floor = np.minimum(combined, 0).sum(axis=1)
        ceiling = np.maximum(combined, 0).sum(axis=1)
        if config.adc.full_scale == "max":
            lo[i], hi[i] = floor, ceiling
            continue
        mean = mean_a * combined.sum(axis=1)
        square = np.square(combined).sum(axis=1)
        signal_var = var_a * square
        noise_var = config.source.rin_sigma ** 2 * (var_a + mean_a ** 2) * square
        if math.isfinite(p):
            detected = mean_a * t.sum(axis=1)  # (rails, N)
            noise_var += (np.square(g) @ detected) / p
            noise_var += np.square(g).sum(axis=1)[:, None] * config.detector.dark_electrons / p**2
            noise_var += config.detector.read_noise_electrons ** 2 / p**2
        # The window covers the signal's spread plus the noise; the signal part
        # never needs more than the noise-free extremes, the noise part may.
        half = config.adc.headroom * np.sqrt(signal_var + noise_var)
        noise_half = config.adc.headroom * np.sqrt(noise_var)
        lo[i] = np.maximum(mean - half, floor - noise_half)
        hi[i] = np.minimum(mean + half, ceiling + noise_half)
    return lo, hi
