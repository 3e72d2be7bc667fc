"""Optical prefill against the GPU: ratios and break-even points.

Both break-evens are exact consequences of the model's structure, not fits:
the laser term is proportional to ``photons_per_mac`` (so the photon count at
which the two energies are equal is a ratio), and the per-token cost of mask
loads falls as ``1 / batch`` (so the batch at which optics wins is found by
bisection over integers on the full model).
"""

from __future__ import annotations

from typing import Any

from optical._validation import check_positive_int
from optical.config import OpticalConfig
from optical.energy import gpu as gpu_model
from optical.energy import model
from optical.transformer.spec import ModelSpec

__all__ = ["break_even_batch", "break_even_photons", "compare"]


def break_even_photons(spec: ModelSpec, tokens: int, config: OpticalConfig,
                       gpu: gpu_model.GPUSpec, *, batch: int = 1) -> float | None:
    """The ``photons_per_mac`` at which the optical prefill costs as much
    energy as the GPU's; ``None`` when the rest of the optical machine
    alone already costs more (no photon count breaks even).

    Returns
    -------
    float or None, photons
    """
    opt = model.prefill(spec, tokens, config, batch=batch)
    ref = gpu_model.prefill(spec, tokens, gpu, batch=batch).energy
    laser = opt.components["laser"]
    rest = opt.total - laser
    if rest >= ref or laser <= 0:
        return None
    return config.source.photons_per_mac * (ref - rest) / laser


def _ratio(spec: ModelSpec, tokens: int, config: OpticalConfig, gpu: gpu_model.GPUSpec,
           batch: int) -> float:
    """Optical over GPU energy per token."""
    return (model.prefill(spec, tokens, config, batch=batch).per_token
            / gpu_model.prefill(spec, tokens, gpu, batch=batch).per_token)


def break_even_batch(spec: ModelSpec, tokens: int, config: OpticalConfig,
                     gpu: gpu_model.GPUSpec, *, max_batch: int = 1 << 20) -> int | None:
    """The smallest batch (prompts prefilled per weight load) at which the
    optical prefill's energy per token is at most the GPU's; ``None`` if not
    reached by ``max_batch``."""
    check_positive_int(max_batch, "max_batch")
    if _ratio(spec, tokens, config, gpu, 1) <= 1:
        return 1
    lo = hi = 1  # ratio(lo) > 1 throughout
    while True:
        if hi >= max_batch:
            return None
        lo, hi = hi, min(2 * hi, max_batch)
        if _ratio(spec, tokens, config, gpu, hi) <= 1:
            break
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _ratio(spec, tokens, config, gpu, mid) > 1:
            lo = mid
        else:
            hi = mid
    return hi


def compare(spec: ModelSpec, tokens: int, config: OpticalConfig, gpu: gpu_model.GPUSpec, *,
            batch: int = 1) -> dict[str, Any]:
    """Energy and TTFT ratios (GPU over optical: > 1 means optics wins) and
    the break-even photon count and batch."""
    opt = model.prefill(spec, tokens, config, batch=batch)
    ref = gpu_model.prefill(spec, tokens, gpu, batch=batch)
    return {
        "energy_ratio_gpu_over_optical": ref.energy / opt.total,
        "ttft_ratio_gpu_over_optical": ref.time / opt.ttft,
        "break_even_photons_per_mac": break_even_photons(spec, tokens, config, gpu,
                                                         batch=batch),
        "break_even_batch": break_even_batch(spec, tokens, config, gpu),
    }
