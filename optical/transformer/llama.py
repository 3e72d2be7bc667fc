"""The Llama decoder layer's prefill: reference numerics and the optical run.

One forward pass, written against an engine (``_engines.py``):
RMSNorm -> q, k, v projections -> RoPE (llama3 scaling, rotate-half) ->
grouped-query causal attention -> o projection -> residual -> RMSNorm ->
SwiGLU MLP (gate, up, down) -> residual. The positions are 0..tokens-1: a
prefill from an empty cache.

The reference follows Hugging Face's ``LlamaDecoderLayer`` numerics: RMSNorm
statistics, the RoPE tables and the softmax in float32; every other op's
result rounded to the model dtype (the RoPE tables too, as HF casts them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from optical._frozen import FrozenMapping
from optical._validation import check_bool
from optical.config import OpticalConfig
from optical.core import MatmulStats
from optical.transformer._engines import (
    LayerInputs,
    LayerTrace,
    ReferenceEngine,
    check_hidden,
    check_weights,
    engine_for,
    matmul_inputs,
    weight_matmuls,
)
from optical.transformer.numerics import softmax, underflow_to_zero
from optical.transformer.rope import (
    _rope_field,
    apply_rope,
    inverse_frequencies,
    rope_settings,
    rope_tables,
)
from optical.transformer.spec import ModelSpec

__all__ = ["LlamaLayer", "check_llama_config"]

#: Short names of a Llama layer's tensors, in HF's layout under ``model.layers.N.``.
TENSORS = {
    "q_proj": "self_attn.q_proj.weight", "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight", "o_proj": "self_attn.o_proj.weight",
    "gate_proj": "mlp.gate_proj.weight", "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
}


def check_llama_config(spec: ModelSpec) -> None:
    """Raise ValueError naming the config.json key of a Llama variant this
    layer does not implement (biases, another activation, another RoPE, a
    sliding attention window)."""
    raw = spec.raw
    act = raw.get("hidden_act", "silu")
    if act not in ("silu", "swish"):  # one function: transformers maps both to SiLU
        raise ValueError(f"config.json: hidden_act {act!r} is not supported; Llama uses 'silu'")
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            value = raw[key]  # as config.json writes it: true, "false", 1
            shown = json.dumps(value) if isinstance(value, bool | str | int | float) else value
            raise ValueError(f"config.json: {key}={shown} is not supported (Llama has no "
                             "biases: false or absent)")
    window = raw.get("sliding_window")
    if window is not None and raw.get("use_sliding_window", True) not in (False, 0, None):
        # Mistral's or Qwen2's key, in a config relabelled "llama": it was ignored
        shown = json.dumps(window) if isinstance(window, bool | str | int | float) else window
        raise ValueError(f"config.json: sliding_window={shown} is not supported (Llama "
                         "attends to every earlier token: null or absent)")
    for prefix, where in (("", raw), ("rope_parameters.", raw.get("rope_parameters") or {}),
                          ("rope_scaling.", raw.get("rope_scaling") or {})):
        partial = where.get("partial_rotary_factor", 1.0) if isinstance(where, Mapping) else 1.0
        if partial != 1.0:  # another model's (Phi, GLM rotate part of each head)
            shown = json.dumps(partial) if isinstance(partial, bool | str | int | float) \
                else partial
            raise ValueError(f"config.json: {prefix}partial_rotary_factor={shown} is not "
                             "supported (Llama rotates the whole head: 1 or absent)")
    theta, scaling, key = rope_settings(raw)
    try:
        inverse_frequencies(spec.head_dim, theta, scaling, key=key)
    except ValueError as err:  # named as the checks above name theirs
        raise ValueError(f"config.json: {err}") from None
    if _rope_field(scaling or {}, "rope_type") == "dynamic" and spec.max_positions is None:
        # Beyond max_position_embeddings dynamic scaling rescales theta; without
        # the key transformers takes its default (2048), which no check here holds.
        raise ValueError(f"config.json: {key} 'dynamic' needs max_position_embeddings (the "
                         "prompt length past which transformers rescales the rotation)")


def _rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float, engine: ReferenceEngine) -> np.ndarray:
    # A row whose squares sum past float32's largest (an optical product far
    # past anything physical) overflows, as in Hugging Face's float32 norm:
    # the row reads zeros (validate's report names the product in a note;
    # numpy's warning was an error under -W error).
    with np.errstate(over="ignore"):
        variance = np.mean(np.square(x), axis=-1, keepdims=True)
    normed = engine.round(x * (np.float32(1.0) / np.sqrt(variance + np.float32(eps))))
    return engine.round(engine.round(gamma) * normed)


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) overflows to inf for x << 0: silu -> -0
        return x / (np.float32(1.0) + np.exp(-x))


def weight_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Each weight of a layer (by short name) and its shape under config.json:
    projections (out_features, in_features) as HF stores them, the norms (hidden,)."""
    shapes: dict[str, tuple[int, ...]] = {s.name: (s.out_features, s.in_features)
                                          for s in spec.linear_shapes()}
    shapes["input_layernorm"] = shapes["post_attention_layernorm"] = (spec.hidden_size,)
    return shapes


class LlamaLayer:
    """Layer ``index`` of a Llama model, with its weights.

    Obtain it from :meth:`optical.transformer.LlamaModel.layer`.

    Attributes
    ----------
    spec : ModelSpec
    index : int
    weights : mapping of str to ndarray
        float32; projections (out_features, in_features) as HF stores them.
        Read-only (the model keeps its last layer and hands it out again):
        change a weight by building a layer of new arrays.
    """

    def __init__(self, spec: ModelSpec, index: int, weights: Mapping[str, np.ndarray]) -> None:
        check_llama_config(spec)
        check_weights(weights, weight_shapes(spec), index)
        self.spec = spec
        self.index = index
        self.weights = FrozenMapping(weights)  # the model's cached layer is shared
        raw = spec.raw
        self.eps = float(raw.get("rms_norm_eps", 1e-6))
        theta, scaling, key = rope_settings(raw)
        self.inv_freq = inverse_frequencies(spec.head_dim, theta, scaling, key=key)

    def __repr__(self) -> str:
        return (f"LlamaLayer(index={self.index}, hidden={self.spec.hidden_size}, "
                f"heads={self.spec.num_heads}/{self.spec.num_kv_heads})")

    # -- public runs ------------------------------------------------------- #

    def reference(self, h: np.ndarray, dtype: str = "float16") -> np.ndarray:
        """The layer's output with Hugging Face numerics in ``dtype``.

        Parameters
        ----------
        h : ndarray, float32, shape (tokens, hidden) or (batch, tokens, hidden)
            Input hidden states at positions 0..tokens-1 (rounded to ``dtype`` first).
        dtype : {"float16", "bfloat16", "float32"}

        Returns
        -------
        ndarray, float32 holding ``dtype`` values, shaped like ``h``

        Raises
        ------
        TypeError
            ``h`` not a float32 numpy array (nothing is cast silently).
        ValueError
            ``h`` of the wrong shape, holding NaN or inf, with values ``dtype``
            rounds to inf (fp16: from 65520), or longer than the config's
            ``max_position_embeddings``. An overflow inside the layer is not
            refused: numpy warns and the output holds inf or NaN
            (:func:`optical.transformer.validate` names the product).

        Notes
        -----
        Future positions' scores are dropped (set to -inf) before the
        softmax, as SDPA's causal kernel leaves them out; HF's eager attention
        adds ``finfo.min`` to them instead, so a future score that overflowed
        to inf in fp16 makes eager's row NaN where this row stays finite.
        """
        return self.trace(h, dtype=dtype).output

    def optical(self, h: np.ndarray, config: OpticalConfig, *, seed: int,
                return_stats: bool = False,
                program_options: Mapping[str, Any] | None = None,
                matmul_options: Mapping[str, Any] | None = None,
                calibration: Mapping[str, np.ndarray] | None = None
                ) -> np.ndarray | tuple[np.ndarray, dict[str, MatmulStats]]:
        """The layer with every weight matmul on the optical core (digital ops in float32).

        Each weight is programmed once per call (``W.T``, as HF stores
        ``[out, in]``) and freed after its matmul. The attention products run
        digitally unless ``config.mapping.attention == "optical"``.

        Parameters
        ----------
        h : ndarray, float32, shape (tokens, hidden) or (batch, tokens, hidden)
        config : OpticalConfig
        seed : int
            Each product draws its noise from a seed derived from (seed, layer,
            product), keyed within it by each token's row in the batch laid end
            to end: a prompt's noise depends on its place in the batch (not on
            its neighbours' values), and only the first prompt draws the noise
            of its own call. Its *result* is free of its neighbours only
            where nothing is calibrated or pooled over the call's own inputs:
            with ``calibration`` given (held-out rows) and per-token scaling.
            Without it, the settings that need calibration are calibrated on
            the whole batch (every value of prompt 0 moved when prompt 1 was
            swapped), and ``dac.scaling="per_tensor"`` or the dynamic
            outlier policy pool over the batch too.
        return_stats : bool
            Also return each product's :class:`optical.MatmulStats`.
        program_options, matmul_options : mapping, optional
            Extra keyword arguments for every ``optical.program`` /
            ``optical.matmul`` call (engine options such as a backend): their
            keywords the layer does not set itself, else refused by name.
        calibration : mapping of str to ndarray, optional
            Held-out input rows of each weight matmul, by product name, for
            configs that need calibration (``layer.matmul_inputs(held_out)``
            gives them all); without them each product is calibrated on its
            own inputs (an oracle). Under a config that calibrates, a mapping
            missing a weight matmul is refused (ValueError naming it): that
            product alone would be calibrated on its own inputs. So are
            another layer's inputs (a :class:`~optical.transformer.LayerInputs`
            naming another index); a plain dict is taken as given.

        Returns
        -------
        out : ndarray, float32, the shape of ``h``
            The layer's output hidden states.
        stats : dict of str to MatmulStats, if ``return_stats``
            Each product's stats by name (``q_proj`` ... ``down_proj``, and
            ``attention.scores`` / ``attention.values`` summed over heads when
            they run optically).
        """
        return_stats = check_bool(return_stats, "return_stats")
        trace = self.trace(h, config=config, seed=seed, program_options=program_options,
                           matmul_options=matmul_options, calibration=calibration)
        return (trace.output, trace.stats) if return_stats else trace.output

    def trace(self, h: np.ndarray, *, dtype: str | None = None,
              config: OpticalConfig | None = None, seed: int = 0,
              program_options: Mapping[str, Any] | None = None,
              matmul_options: Mapping[str, Any] | None = None,
              calibration: Mapping[str, np.ndarray] | None = None,
              progress: Callable[[str], None] | None = None) -> LayerTrace:
        """Run the layer and keep every product's output (and optical stats).

        Give either ``dtype`` (a reference run) or ``config`` (an optical run).
        """
        engine = engine_for(dtype, config, seed, self.index, program_options=program_options,
                            matmul_options=matmul_options, calibration=calibration,
                            weights=self.weights, progress=progress)
        h3 = check_hidden(h, self.spec.hidden_size, dtype if config is None else None)
        self.spec.check_tokens(h3.shape[1])
        out = self._forward(h3, engine)
        return engine.trace(out.reshape(h.shape))

    def matmul_inputs(self, h: np.ndarray, dtype: str = "float32") -> LayerInputs:
        """The input rows of every weight matmul in a reference run in ``dtype``
        (what :meth:`trace` records as ``inputs``, bit for bit), without
        computing the last matmul or anything after it: the calibration run
        of :func:`optical.transformer.validate`. Refuses what :meth:`reference`
        refuses."""
        h3 = check_hidden(h, self.spec.hidden_size, dtype)
        self.spec.check_tokens(h3.shape[1])
        return matmul_inputs(lambda engine: self._forward(h3, engine),
                             weight_matmuls(self.weights), dtype, self.index)

    # -- the forward pass -------------------------------------------------- #

    @underflow_to_zero
    def _forward(self, h: np.ndarray, engine: ReferenceEngine) -> np.ndarray:
        spec, w, rnd = self.spec, self.weights, engine.round
        batch, tokens, hidden = h.shape
        heads, kv_heads, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        group = heads // kv_heads

        x = rnd(h)
        normed = _rms_norm(x, w["input_layernorm"], self.eps, engine).reshape(-1, hidden)

        def split_heads(y: np.ndarray, n: int) -> np.ndarray:  # (B*T, n*d) -> (B, n, T, d)
            return y.reshape(batch, tokens, n, d).transpose(0, 2, 1, 3)

        q = split_heads(engine.linear("q_proj", normed, w["q_proj"]), heads)
        k = split_heads(engine.linear("k_proj", normed, w["k_proj"]), kv_heads)
        v = split_heads(engine.linear("v_proj", normed, w["v_proj"]), kv_heads)
        cos, sin = rope_tables(np.arange(tokens), self.inv_freq)
        cos, sin = rnd(cos), rnd(sin)
        q = apply_rope(q, cos, sin, rnd)
        k = apply_rope(k, cos, sin, rnd)

        # Query heads j*group .. j*group + group - 1 share KV head j (HF's repeat_kv).
        q = q.reshape(batch, kv_heads, group * tokens, d)
        scores = engine.round(engine.scores(q, k) * np.float32(d ** -0.5))
        scores = scores.reshape(batch, kv_heads, group, tokens, tokens)
        causal = np.tril(np.ones((tokens, tokens), dtype=bool))
        engine.record("attention.scores", np.where(causal, scores, np.float32(0)))
        probs = rnd(softmax(np.where(causal, scores, -np.inf).astype(np.float32)))
        context = engine.values(probs.reshape(batch, kv_heads, group * tokens, tokens), v)
        context = context.reshape(batch, heads, tokens, d)
        engine.record("attention.values", context)
        context = context.transpose(0, 2, 1, 3).reshape(batch * tokens, heads * d)
        attn = engine.linear("o_proj", context, w["o_proj"]).reshape(batch, tokens, hidden)
        x = rnd(x + attn)

        normed = _rms_norm(x, w["post_attention_layernorm"], self.eps, engine).reshape(-1, hidden)
        gate = engine.linear("gate_proj", normed, w["gate_proj"])
        up = engine.linear("up_proj", normed, w["up_proj"])
        act = rnd(rnd(_silu(gate)) * up)
        down = engine.linear("down_proj", act, w["down_proj"]).reshape(batch, tokens, hidden)
        return rnd(x + down)
