"""What a transformer layer's prefill does on the optical core, counted from
its shapes: one :class:`optical.Schedule` per product.

The layer implementations report the same counts from their runs (fewer DAC
conversions and MACs where outlier channels bypass the optics: see
docs/energy.md); the energy model reads them from here without running
anything.
"""

from __future__ import annotations

from optical._validation import check_positive_int
from optical.config import OpticalConfig
from optical.core import Schedule, schedule
from optical.transformer.spec import ModelSpec

__all__ = ["layer_schedule"]


def layer_schedule(spec: ModelSpec, tokens: int, config: OpticalConfig, *,
                   batch: int = 1) -> dict[str, Schedule]:
    """Schedules of one layer's prefill of ``batch`` prompts of ``tokens`` tokens.

    Weight matmuls stream all ``batch * tokens`` rows through each weight
    tile once. With ``mapping.attention == "optical"`` the attention products
    run optically too: per prompt and KV head, ``K^T`` (head_dim x tokens) is
    loaded as a mask and the queries of the heads sharing it stream through
    (``"attention.scores"``); then ``V`` (tokens x head_dim) is loaded and the
    probability rows stream through (``"attention.values"``). The causal mask
    is not exploited (every tile of the full product is counted).

    Returns
    -------
    dict of str to Schedule
        Keyed by matmul name: the linear products in execution order, then
        (with ``mapping.attention = "optical"``) the two attention products,
        which run between the value and the output projections.
    """
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"spec: expected a ModelSpec (optical.transformer.read_spec(path) or "
                        f"a loaded model's .spec), got {type(spec).__name__}")
    tokens = check_positive_int(tokens, "tokens")
    batch = check_positive_int(batch, "batch")
    rows = batch * tokens
    out = {s.name: schedule(rows, s.in_features, s.out_features, config)
           for s in spec.linear_shapes()}
    if config.mapping.attention == "optical":
        group = spec.num_heads // spec.num_kv_heads
        per_head = {
            "attention.scores": schedule(group * tokens, spec.head_dim, tokens, config),
            "attention.values": schedule(group * tokens, tokens, spec.head_dim, config),
        }
        repeats = batch * spec.num_kv_heads
        for name, one in per_head.items():
            out[name] = Schedule(**{k: (v * repeats if k not in ("k_tiles", "n_tiles",
                                                                  "input_passes") else v)
                                    for k, v in one.to_dict().items()})
    return out
