"""Outlier input channels that bypass the optics (LLM.int8-style decomposition).

Real LLM activations carry a few input channels tens to hundreds of times
larger than the rest. Scaled into one DAC range with them, every other channel
lands on a handful of levels. Splitting ``x @ w`` into the outlier channels
``D``, multiplied digitally in the working dtype, and the rest, multiplied
optically, keeps the optics' few bits for the bulk of the signal:

``x @ w = x[:, D] @ w[D] + optical(x[:, O], w[O])``.

``outliers.policy = "static"`` picks ``D`` once from calibration inputs when
the weights are programmed (the mask rows of ``D`` are never programmed: the
hardware choice). ``"dynamic"`` picks ``D`` in every call from that call's
inputs, over all its tokens (so the choice does not depend on chunking); the
whole matrix stays on the mask and the inputs of ``D`` are zeroed: dark
sources with split inputs, the offset level (half lit, adding their shot
noise) with offset inputs. A finite DAC cannot show that level exactly (an
even number of levels has none at 0.5): from 2 bits on each zeroed channel
reads as half a step above zero, and adds ``w[d] / (2**bits - 1)`` of the
token's input range to every output, a small bias that split inputs do not
have (at 1 bit the level rounds down to the bottom: -1 of the range).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from optical._gemm import row_block, rows_matmul
from optical._validation import read_only
from optical.config import OpticalConfig, OutliersConfig

if TYPE_CHECKING:
    from optical.core import MatmulStats
    from optical.quant import ProgrammedWeights

__all__ = ["DigitalBypass", "bypass_matmul", "channel_magnitude", "select_channels"]


@dataclasses.dataclass(frozen=True, eq=False)
class DigitalBypass:
    """The digital side of a decomposed weight matrix.

    Attributes
    ----------
    k : int
        Rows of the whole (logical) weight matrix.
    channels : ndarray of int64 or None
        Static policy: the sorted input channels multiplied digitally.
        ``None``: chosen per call (dynamic policy).
    optical_channels : ndarray of int64 or None
        Static policy: the channels on the mask, in mask-row order.
    weights : ndarray
        Static: ``w[channels]``; dynamic: the whole ``w`` (any row may be needed).
    """

    k: int
    channels: np.ndarray | None
    optical_channels: np.ndarray | None
    weights: np.ndarray

    def __post_init__(self) -> None:  # read-only, as ProgrammedWeights' arrays
        for name in ("channels", "optical_channels", "weights"):
            object.__setattr__(self, name, read_only(getattr(self, name)))

    def __reduce__(self) -> tuple[Any, ...]:  # through __post_init__, as ProgrammedWeights
        return (type(self), (self.k, self.channels, self.optical_channels, self.weights))

    @classmethod
    def static(cls, w: np.ndarray, channels: np.ndarray) -> DigitalBypass:
        """A bypass of the fixed input ``channels`` (rows of ``w``, chosen at
        programming from the calibration inputs)."""
        channels = np.array(channels, dtype=np.int64)  # a copy: the caller's stays writeable
        keep = np.setdiff1d(np.arange(w.shape[0]), channels)
        return cls(w.shape[0], channels, keep, w[channels].copy())

    @classmethod
    def dynamic(cls, w: np.ndarray) -> DigitalBypass:
        """A bypass whose channels each call chooses from its own inputs (all of
        ``w`` kept digitally)."""
        return cls(w.shape[0], None, None, w.copy())


def channel_magnitude(x2: np.ndarray) -> np.ndarray:
    """Absolute maximum of each input channel over the tokens, float64 (K,)."""
    if x2.shape[0] == 0:
        return np.zeros(x2.shape[1])
    return np.max(np.abs(x2), axis=0).astype(np.float64)


def select_channels(magnitude: np.ndarray, rule: OutliersConfig) -> np.ndarray:
    """The outlier channels, sorted: magnitude above ``threshold`` times the
    median of the nonzero magnitudes, the ``top_k`` largest at most (ties to
    the lower index)."""
    order = np.argsort(-magnitude, kind="stable")
    chosen = order
    if rule.threshold is not None:
        nonzero = magnitude[magnitude > 0]
        if nonzero.size == 0:
            return np.zeros(0, dtype=np.int64)
        chosen = order[magnitude[order] > rule.threshold * np.median(nonzero)]
    if rule.top_k is not None:
        chosen = chosen[:rule.top_k]
    return np.sort(chosen).astype(np.int64)


def bypass_matmul(x: np.ndarray, programmed: ProgrammedWeights, config: OpticalConfig, *,
                  optical: Callable[[np.ndarray, object], tuple[np.ndarray, object]],
                  return_stats: bool) -> np.ndarray | tuple[np.ndarray, MatmulStats]:
    """``x @ w`` with the outlier channels multiplied digitally.

    Parameters
    ----------
    x : ndarray, shape (..., K), validated
    programmed : ProgrammedWeights
        With a :class:`DigitalBypass`.
    config : OpticalConfig
    optical : callable
        ``optical(x_optical, programmed_optical) -> (y, stats)``: the optical
        matmul of the rest (``optical.matmul`` with the caller's seed and options).
    return_stats : bool

    Returns
    -------
    y, and stats with ``digital_channels``, ``digital_macs`` and
    ``digital_mac_fraction`` filled in if ``return_stats``.
    """
    bypass = programmed.bypass
    k = bypass.k
    x2 = x.reshape(-1, k)
    optical_part = dataclasses.replace(programmed, bypass=None)
    if bypass.channels is None:
        channels = select_channels(channel_magnitude(x2), config.outliers)
        x_optical = x2.copy()
        x_optical[:, channels] = 0
        w_digital = bypass.weights[channels]
    else:
        channels = bypass.channels
        # No channel bypassed: the optical part is all of x (no gather, no copy).
        x_optical = x2[:, bypass.optical_channels] if channels.size else x2
        w_digital = bypass.weights
    y, stats = optical(x_optical, optical_part)
    if channels.size:
        y += rows_matmul(np.ascontiguousarray(x2[:, channels]), w_digital, row_block(len(x2)))
    y = y.reshape(*x.shape[:-1], y.shape[-1])
    if not return_stats:
        return y
    tokens, n = x2.shape[0], y.shape[-1]
    return y, dataclasses.replace(
        stats, digital_channels=int(channels.size),
        digital_macs=int(tokens * channels.size * n),
        digital_mac_fraction=channels.size / k)
