"""Optical prefill against the GPU: ratios and break-even points.

The break-evens are exact consequences of the model's structure, not fits:
the laser term is proportional to ``photons_per_mac`` (so the photon count at
which the two energies are equal is a ratio), the per-token cost of mask
loads falls as ``1 / batch`` (so the batch at which optics wins is found by
bisection over integers on the full model), and the prompt length at which
optics wins is the first of every length tried in order (the ratio is not
monotone in it: tiles of tokens fill unevenly, and attention grows with it).
"""

from __future__ import annotations

from typing import Any

from optical._validation import check_positive_int
from optical.config import OpticalConfig
from optical.energy import gpu as gpu_model
from optical.energy import model
from optical.transformer.spec import ModelSpec

__all__ = ["break_even_batch", "break_even_photons", "break_even_tokens", "compare"]

#: The longest prompt :func:`break_even_tokens` tries by default (or the
#: model's ``max_position_embeddings`` when shorter): ~0.4-0.6 ms a length
#: on a 2-core CPU.
MAX_BREAK_EVEN_TOKENS = 8192


def break_even_photons(spec: ModelSpec, tokens: int, config: OpticalConfig,
                       gpu: gpu_model.GPUSpec, *, batch: int = 1) -> float | None:
    """The ``photons_per_mac`` at which the optical prefill costs as much
    energy as the GPU's; ``None`` when the rest of the optical machine
    alone already costs more (no photon count breaks even).

    Returns
    -------
    float or None, photons
    """
    tokens = check_positive_int(tokens, "tokens")
    batch = check_positive_int(batch, "batch")
    opt = model.prefill(spec, tokens, config, batch=batch)
    ref = gpu_model.prefill(spec, tokens, gpu, batch=batch).energy
    laser = opt.components["laser"]
    rest = opt.total - laser
    if rest >= ref or laser <= 0:
        return None
    return config.source.photons_per_mac * (ref - rest) / laser


def _ratio(spec: ModelSpec, tokens: int, config: OpticalConfig, gpu: gpu_model.GPUSpec,
           batch: int, *, checked: bool = False) -> float:
    """Optical over GPU energy per token. ``checked``: a ratio of these
    arguments was computed before (which checked them), so the optical side
    is priced without its report (``model._total``, the same total)."""
    optical = (model._total(spec, tokens, config, batch) if checked
               else model.prefill(spec, tokens, config, batch=batch).total)
    return optical / (batch * tokens) / gpu_model.prefill(spec, tokens, gpu, batch=batch).per_token


def break_even_batch(spec: ModelSpec, tokens: int, config: OpticalConfig,
                     gpu: gpu_model.GPUSpec, *, max_batch: int = 1 << 20) -> int | None:
    """The smallest batch (prompts prefilled per weight load) at which the
    optical prefill's energy per token is at most the GPU's; ``None`` if not
    reached by ``max_batch``."""
    tokens = check_positive_int(tokens, "tokens")
    max_batch = check_positive_int(max_batch, "max_batch")
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


def break_even_tokens(spec: ModelSpec, config: OpticalConfig, gpu: gpu_model.GPUSpec, *,
                      batch: int = 1, max_tokens: int | None = None) -> int | None:
    """The shortest prompt (tokens, at ``batch`` prompts per weight load) at
    which the optical prefill's energy per token is at most the GPU's;
    ``None`` if no length up to ``max_tokens`` breaks even (default: the
    model's ``max_position_embeddings``, at most
    :data:`MAX_BREAK_EVEN_TOKENS`). Every length is tried in order, so the
    answer is the shortest even where the ratio is not monotone (about
    0.4-0.6 ms a length: up to ~4-5 s where nothing breaks even by the
    default limit; ``compare`` tries up to its prompt when that is longer,
    ~0.5 min at 65536 tokens). Optics may
    still lose at some longer lengths; on the bundled Llama models under
    iris-like it does not up to 8192 tokens."""
    batch = check_positive_int(batch, "batch")
    limit = _token_limit(spec)
    if max_tokens is not None:
        limit = check_positive_int(max_tokens, "max_tokens")
        spec.check_tokens(limit, "max_tokens")
    # The first length goes through the public models, which check the spec,
    # the config's prices, the GPU and the batch (``limit`` was checked
    # against the positions above); the others price their totals alone.
    for tokens in range(1, limit + 1):
        if _ratio(spec, tokens, config, gpu, batch, checked=tokens > 1) <= 1:
            return tokens
    return None


def _token_limit(spec: ModelSpec) -> int:
    """The longest prompt :func:`break_even_tokens` tries by default."""
    return min(MAX_BREAK_EVEN_TOKENS, spec.max_positions or MAX_BREAK_EVEN_TOKENS)


def compare(spec: ModelSpec, tokens: int, config: OpticalConfig, gpu: gpu_model.GPUSpec, *,
            batch: int = 1) -> dict[str, Any]:
    """Energy and TTFT ratios (GPU over optical: > 1 means optics wins), the
    break-even photon count and batch at ``tokens``, and the break-even
    prompt length at ``batch`` (:func:`break_even_tokens`, tried up to the
    default limit or ``tokens``, whichever is longer; None: none up to
    ``break_even_tokens_tried``)."""
    tokens = check_positive_int(tokens, "tokens")
    batch = check_positive_int(batch, "batch")
    opt = model.prefill(spec, tokens, config, batch=batch)
    ref = gpu_model.prefill(spec, tokens, gpu, batch=batch)
    tried = max(_token_limit(spec), tokens)
    return {
        "energy_ratio_gpu_over_optical": ref.energy / opt.total,
        "ttft_ratio_gpu_over_optical": ref.time / opt.ttft,
        "break_even_photons_per_mac": break_even_photons(spec, tokens, config, gpu,
                                                         batch=batch),
        "break_even_batch": break_even_batch(spec, tokens, config, gpu),
        "break_even_tokens": break_even_tokens(spec, config, gpu, batch=batch,
                                               max_tokens=tried),
        "break_even_tokens_tried": tried,
    }
