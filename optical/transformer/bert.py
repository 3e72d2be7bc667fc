"""The BERT encoder layer (all-MiniLM-L6-v2 and kin): reference and optical runs.

Post-LayerNorm encoder layer as Hugging Face's ``BertLayer``: q, k, v
projections with biases -> scaled dot-product attention over the unpadded
keys -> output projection -> LayerNorm(residual) -> intermediate projection ->
exact (erf) GELU -> output projection -> LayerNorm(residual). An encoder
pass is all prefill. The embeddings (word + token type + position, then
LayerNorm) and sentence-transformers' mean pooling are here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from optical._frozen import FrozenMapping
from optical._validation import as_plain_array, check_bool
from optical.config import OpticalConfig
from optical.core import MatmulStats
from optical.transformer import sentence
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
from optical.transformer.spec import ModelSpec

__all__ = ["BertLayer", "check_mask", "embeddings", "mean_pool"]

#: Short name -> tensor name under ``encoder.layer.N.`` (weights; biases add ``.bias``).
TENSORS = {
    "query": "attention.self.query", "key": "attention.self.key",
    "value": "attention.self.value", "attention.output": "attention.output.dense",
    "attention.output.LayerNorm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense", "output": "output.dense",
    "output.LayerNorm": "output.LayerNorm",
}
EMBEDDINGS = ("word_embeddings.weight", "position_embeddings.weight",
              "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias")



def weight_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Each weight of a layer (by short name, biases ``name + ".bias"``, the
    LayerNorms' ``".weight"`` and ``".bias"``) and its shape under
    config.json: projections (out_features, in_features) as HF stores them."""
    linear = {s.name: (s.out_features, s.in_features) for s in spec.linear_shapes()}
    shapes: dict[str, tuple[int, ...]] = {}
    for short in TENSORS:
        if short.endswith("LayerNorm"):
            shapes[short + ".weight"] = shapes[short + ".bias"] = (spec.hidden_size,)
        else:
            shapes[short] = linear[short]
            shapes[short + ".bias"] = (linear[short][0],)
    return shapes

def check_bert_config(spec: ModelSpec) -> None:
    """Raise ValueError naming the config.json key of an unsupported BERT variant."""
    act = spec.raw.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"config.json: hidden_act {act!r} is not supported; expected 'gelu'")
    kind = spec.raw.get("position_embedding_type", "absolute")
    if kind != "absolute":
        raise ValueError(f"config.json: position_embedding_type {kind!r} is not supported; "
                         "expected 'absolute'")
    if spec.raw.get("is_decoder"):  # false, 0 and null: an encoder, as Hugging Face reads them
        # Hugging Face's BertModel then masks attention causally; this encoder attends
        # both ways, so it would compute another model.
        raise ValueError(f"config.json: is_decoder {spec.raw['is_decoder']!r} is not supported; "
                         "expected false (a bidirectional encoder)")


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
               engine: ReferenceEngine) -> np.ndarray:
    """LayerNorm over the last axis in float32, rounded once (torch on the CPU),
    with ``gamma`` and ``beta`` in the engine's dtype (a model cast with
    ``.half()`` holds them in fp16)."""
    mean = np.mean(x, axis=-1, keepdims=True)
    centred = x - mean
    with np.errstate(over="ignore"):  # beyond sqrt(float32 max): as llama's _rms_norm
        variance = np.mean(np.square(centred), axis=-1, keepdims=True)
    y = centred / np.sqrt(variance + np.float32(eps)) * engine.round(gamma) \
        + engine.round(beta)
    return engine.round(y.astype(np.float32))


def _gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, as BERT's ``hidden_act = "gelu"``."""
    from scipy import special  # imported here: scipy.special is slow to import

    return (0.5 * x * (1.0 + special.erf(x / np.float32(np.sqrt(2.0))))).astype(np.float32)


def embeddings(ids: np.ndarray, tables: Mapping[str, np.ndarray], eps: float,
               engine: ReferenceEngine) -> np.ndarray:
    """(word + token type 0) + position embeddings, then LayerNorm: (B, T) -> (B, T, H)."""
    rnd = engine.round
    tokens = ids.shape[1]
    x = rnd(rnd(tables["word_embeddings.weight"])[ids]
            + rnd(tables["token_type_embeddings.weight"])[0])
    x = rnd(x + rnd(tables["position_embeddings.weight"])[:tokens])
    return layer_norm(x, tables["LayerNorm.weight"], tables["LayerNorm.bias"], eps, engine)


def mean_pool(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over each prompt's real tokens, then L2-normalised (sentence-transformers):
    :func:`optical.transformer.sentence.pool` with all-MiniLM-L6-v2's pipeline."""
    return sentence.pool(h, mask, sentence.MINILM)


class BertLayer:
    """Encoder layer ``index`` of a BERT model, with its weights.

    Obtain it from :meth:`optical.transformer.BertModel.layer`. Weights are
    keyed by the short names of ``TENSORS`` (``"query"``, ``"query.bias"``,
    ``"output.LayerNorm.weight"``, ...), projections (out, in) as HF stores them,
    float32 of config.json's shapes (:func:`weight_shapes`): a missing weight,
    or one of another dtype or shape, is refused (ValueError naming it).
    """

    def __init__(self, spec: ModelSpec, index: int, weights: Mapping[str, np.ndarray]) -> None:
        check_bert_config(spec)
        check_weights(weights, weight_shapes(spec), index)
        self.spec = spec
        self.index = index
        self.weights = FrozenMapping(weights)  # the model's cached layer is shared
        self.eps = float(spec.raw.get("layer_norm_eps", 1e-12))

    def __repr__(self) -> str:
        return f"BertLayer(index={self.index}, hidden={self.spec.hidden_size})"

    def reference(self, h: np.ndarray, dtype: str = "float32",
                  mask: np.ndarray | None = None) -> np.ndarray:
        """The layer's output with Hugging Face numerics in ``dtype``.

        Parameters
        ----------
        h : ndarray, float32, shape (tokens, hidden) or (batch, tokens, hidden)
        dtype : {"float32", "float16", "bfloat16"}
        mask : ndarray of bool, shape (batch, tokens), optional
            True for real tokens; padded keys get no attention. Default: all
            real. Padding reaches no product, and its rows of the output are
            its rows of ``h`` (rounded to ``dtype``), where Hugging Face
            computes them: nothing reads them.

        Raises
        ------
        TypeError, ValueError
            As :meth:`optical.transformer.LlamaLayer.reference` (but with no
            prompt length limit: positions enter BERT in its embeddings), and
            for a ``mask`` of the wrong shape or dtype, or one without a real
            token in a prompt.
        """
        return self.trace(h, dtype=dtype, mask=mask).output

    def optical(self, h: np.ndarray, config: OpticalConfig, *, seed: int,
                mask: np.ndarray | None = None, return_stats: bool = False,
                program_options: Mapping[str, Any] | None = None,
                matmul_options: Mapping[str, Any] | None = None,
                calibration: Mapping[str, np.ndarray] | None = None
                ) -> np.ndarray | tuple[np.ndarray, dict[str, MatmulStats]]:
        """The layer with every weight matmul on the optical core; see
        :meth:`optical.transformer.LlamaLayer.optical` for the parameters and
        what it returns (the products are named ``query`` ... ``output``).
        ``mask`` is that of :meth:`reference` (True for real tokens; padded
        keys get no attention; None: all real)."""
        return_stats = check_bool(return_stats, "return_stats")
        trace = self.trace(h, config=config, seed=seed, mask=mask,
                           program_options=program_options, matmul_options=matmul_options,
                           calibration=calibration)
        return (trace.output, trace.stats) if return_stats else trace.output

    def trace(self, h: np.ndarray, *, dtype: str | None = None,
              config: OpticalConfig | None = None, seed: int = 0,
              mask: np.ndarray | None = None,
              program_options: Mapping[str, Any] | None = None,
              matmul_options: Mapping[str, Any] | None = None,
              calibration: Mapping[str, np.ndarray] | None = None,
              progress: Callable[[str], None] | None = None) -> LayerTrace:
        """Run the layer, keeping every product's output; give ``dtype`` or ``config``."""
        engine = engine_for(dtype, config, seed, self.index, program_options=program_options,
                            matmul_options=matmul_options, calibration=calibration,
                            weights=self.weights, progress=progress)
        h3 = check_hidden(h, self.spec.hidden_size, dtype if config is None else None)
        mask = check_mask(mask, h3.shape[:2])
        out = self.forward(h3, mask, engine)
        return engine.trace(out.reshape(h.shape))

    def matmul_inputs(self, h: np.ndarray, dtype: str = "float32", *,
                      mask: np.ndarray | None = None) -> LayerInputs:
        """The input rows of every weight matmul in a reference run; see
        :meth:`optical.transformer.LlamaLayer.matmul_inputs`."""
        h3 = check_hidden(h, self.spec.hidden_size, dtype)
        mask = check_mask(mask, h3.shape[:2])
        return matmul_inputs(lambda engine: self.forward(h3, mask, engine),
                             weight_matmuls(self.weights), dtype, self.index)

    @underflow_to_zero
    def forward(self, h: np.ndarray, mask: np.ndarray, engine: ReferenceEngine) -> np.ndarray:
        """(B, T, H) -> (B, T, H) on ``engine``; ``mask`` (B, T) marks real tokens."""
        spec, w, rnd = self.spec, self.weights, engine.round
        batch, tokens, hidden = h.shape
        heads, d = spec.num_heads, spec.head_dim
        x = rnd(h)
        # A copy: x is h itself in float32, and the rows are recorded as the
        # query/key/value inputs, which a caller's later change of h would move.
        rows = x.reshape(-1, hidden).copy()
        real = mask.reshape(-1)
        padded = not real.all()

        def project(name: str, inputs: np.ndarray) -> np.ndarray:
            if not padded:
                return engine.linear(name, inputs, w[name], w[name + ".bias"])
            # Padding never reaches a product: on the optical core it would set
            # the calibration of the real tokens' conversions and bypass (and
            # be counted). Its rows stay 0; attention and pooling mask them.
            y = np.zeros((inputs.shape[0], w[name].shape[0]), dtype=np.float32)
            y[real] = engine.linear(name, inputs[real], w[name], w[name + ".bias"])
            return y

        def split_heads(y: np.ndarray) -> np.ndarray:
            return y.reshape(batch, tokens, heads, d).transpose(0, 2, 1, 3)

        q, k, v = (split_heads(project(n, rows)) for n in ("query", "key", "value"))
        if padded and engine.attention_by_length():
            context = _attention_by_length(q, k, v, mask, engine)
        else:
            # (B, heads, T, T) scores would take B * 3 MB per copy at 256 tokens:
            # a run that keeps no trace takes a few prompts at a time.
            step = engine.attention_prompts(batch, heads * tokens * tokens * 4)
            if step >= batch:
                context = _attention(q, k, v, mask, engine)
            else:
                context = np.empty((batch, heads, tokens, d), dtype=np.float32)
                for start in range(0, batch, step):
                    part = slice(start, start + step)
                    context[part] = _attention(q[part], k[part], v[part], mask[part], engine)
        context = context.transpose(0, 2, 1, 3).reshape(batch * tokens, hidden)
        # From here on every op is row by row: the real rows alone go on, and
        # the padding's rows leave the layer as they came (no product, sum or
        # LayerNorm of theirs is read; 94 % of the rows of a batch of short
        # sentences padded to one of 256 tokens).
        kept = rows[real] if padded else rows
        if padded:
            context = context[real]
        attn = engine.linear("attention.output", context, w["attention.output"],
                             w["attention.output.bias"])
        x = layer_norm(rnd(attn + kept), w["attention.output.LayerNorm.weight"],
                       w["attention.output.LayerNorm.bias"], self.eps, engine)
        inter = rnd(_gelu(engine.linear("intermediate", x, w["intermediate"],
                                        w["intermediate.bias"])))
        out = engine.linear("output", inter, w["output"], w["output.bias"])
        out = layer_norm(rnd(out + x), w["output.LayerNorm.weight"], w["output.LayerNorm.bias"],
                         self.eps, engine)
        if padded:
            rows[real] = out
            out = rows
        return out.reshape(batch, tokens, hidden)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
               engine: ReferenceEngine,
               record: Callable[[str, np.ndarray], None] | None = None) -> np.ndarray:
    """softmax(q k^T / sqrt(d)) v over each prompt's real keys: (B, heads, T, d).
    ``record``: where the products go (default ``engine.record``)."""
    rnd = engine.round
    record = engine.record if record is None else record
    scores = rnd(engine.scores(q, k, mask) * np.float32(q.shape[-1] ** -0.5))  # (B, heads, T, T)
    keys = mask[:, None, None, :]
    record("attention.scores", np.where(keys, scores, np.float32(0)))
    probs = rnd(softmax(np.where(keys, scores, -np.inf).astype(np.float32)))
    context = engine.values(probs, v, mask)
    # Padded queries' rows set to 0, as the optical core leaves them.
    record("attention.values", np.where(mask[:, None, :, None], context, np.float32(0)))
    return context


def _attention_by_length(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray,
                         engine: ReferenceEngine) -> np.ndarray:
    """:func:`_attention` of a padded batch, each prompt over its tokens up
    to its last real one (the padding after it, which no real query attends
    to, cut off), prompts of one such length together, a few at a time: a
    batch of short sentences and one long one no longer computes every
    sentence's scores at the long one's length (3.4 s for 100 short
    sentences through all-MiniLM-L6-v2 on iris-like, 19 s beside one of 256
    tokens). A prompt's products are then its own matrices at its own
    length, whatever the batch, traced or not (a trace's products are laid
    out at the padded length, 0 past each prompt's: the padded queries' rows
    are 0, their q being 0, and the padded keys' columns masked, as at the
    padded length). Rows past a prompt's length, padded queries whose
    context no product reads, are 0, as the optical core leaves them."""
    batch, heads, tokens, d = q.shape
    lengths = tokens - np.argmax(mask[:, ::-1], axis=1)  # past each prompt's last real token
    context = np.zeros((batch, heads, tokens, d), dtype=np.float32)
    traced = {"attention.scores": np.zeros((batch, heads, tokens, tokens), np.float32),
              "attention.values": np.zeros((batch, heads, tokens, d), np.float32)} \
        if engine.keep else {}
    for length in np.unique(lengths).tolist():
        prompts = np.flatnonzero(lengths == length)
        step = engine.attention_prompts(prompts.size, heads * length * length * 4)
        for start in range(0, prompts.size, step):
            part = prompts[start:start + step]

            def record(name: str, value: np.ndarray, part: np.ndarray = part,
                       length: int = length) -> None:
                if name in traced:  # its place in the whole batch's product
                    traced[name][part, :, :length, :value.shape[-1]] = value
                else:
                    engine.record(name, value)

            context[part, :, :length] = _attention(q[part, :, :length], k[part, :, :length],
                                                   v[part, :, :length], mask[part, :length],
                                                   engine, record)
    for name, value in traced.items():
        engine.record(name, value)
    return context


def check_mask(mask: np.ndarray | None, shape: tuple[int, int]) -> np.ndarray:
    """A (batch, tokens) bool mask of real tokens; all True when None."""
    if mask is None:
        return np.ones(shape, dtype=bool)
    mask = as_plain_array(mask, "mask")  # a masked array's mask is not dropped
    if mask.dtype != bool or mask.shape != shape:
        raise ValueError(f"mask: expected a bool array of shape {shape}, got "
                         f"{mask.dtype} {mask.shape}")
    if not mask.any(axis=1).all():
        raise ValueError("mask: every prompt needs at least one real token")
    return mask
