"""Synthetic weights and hidden states with the statistics that make real Llamas hard.

No weights ship with the library; a model directory without ``*.safetensors``
gets synthetic weights at the real shapes. They are seeded per (seed, layer,
tensor name), so layer 40 of a 70B model is built without building layers
0-39, and they carry the features that decide how well a layer survives
low-precision hardware:

- heavy tails: each matrix is ``std * tukey_h(z)`` with ``z`` standard normal and
  Tukey's h transform ``z exp(h z^2 / 2)`` (h = 0.1, kurtosis 5.5 instead of
  3), scaled so the standard deviation is ``0.02 * sqrt(4096 / fan_in)``
  (0.02 for a 4096-wide Llama projection), then rounded to bfloat16 like a
  released checkpoint;
- outlier channels: a few input channels of every matrix carry 4x larger
  weights, and a few residual channels carry 8x larger activations on every
  token (the systematic outlier features of Dettmers et al., LLM.int8(), 2022);
- a super weight (Yu et al., "The Super Weight in Large Language Models",
  2024): in ``down_proj`` of layer 1 (Llama-3-8B's, at its intermediate
  channel 2427, here scaled to the intermediate size) a few entries are ~100x
  the typical weight. The first token's hidden state points along a "BOS
  direction"; that layer's gate and up rows of the super channel are aligned
  with it, so the first token alone drives the super channel to a few hundred
  (the "super activation"), and the super weights turn that into massive
  activations of 1e2-1e3 in a few residual dimensions (Sun et al., "Massive
  Activations in Large Language Models", 2024).

Hidden states (:func:`llama_hidden_states`) are synthetic residual-stream
inputs for layer ``i``, not the output of layers ``< i``: Gaussian, with the
outlier channels, a per-element RMS growing linearly with depth (``0.05 +
0.3 i``: small embeddings at layer 0; one layer with these weights adds an
update of RMS ~1.6, so the cosine between a non-BOS token's input and output
is ~0.4 at layer 2, ~0.86 at layer 8, ~0.95 at layer 15), the BOS direction
(8x the RMS per element) on the first token, and, from the layer after the
super layer on, the massive activations on the first token -- the structure
Sun et al. measured, at the cost of not being the exact output of the
earlier layers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math

import numpy as np

from optical._validation import check_positive_int
from optical.transformer.numerics import round_to
from optical.transformer.spec import ModelSpec

__all__ = ["SyntheticLlama", "bert_embedding_weights", "bert_layer_weights",
           "llama_hidden_states", "llama_layer_weights"]


def _digest(seed: int, *labels: object) -> bytes:
    return hashlib.sha256("/".join(str(v) for v in (seed, *labels)).encode()).digest()


def _rng(seed: int, *labels: object) -> np.random.Generator:
    """A generator keyed by (seed, labels): independent of every other key."""
    return np.random.default_rng(np.frombuffer(_digest(seed, *labels), dtype=np.uint32))


def _key(seed: int, *labels: object) -> np.uint64:
    """A counter-RNG key for (seed, labels), from the same digest as :func:`_rng`'s."""
    return np.frombuffer(_digest(seed, *labels)[:8], dtype=np.uint64)[0]


def _tukey_h(key: np.uint64, shape: tuple[int, ...], h: float, std: float = 1.0) -> np.ndarray:
    """Tukey-h samples of standard deviation ``std`` (heavy tails for h > 0),
    float32: ``z exp(h z**2 / 2)`` of standard normals ``z``, normalised by
    ``E[(z e^{h z^2 / 2})^2] = (1 - 2 h)^(-3/2)``. The normals are the counter
    generator's fast pairs (``optical.kernels._rng_numba``; a whole 8B
    layer's 218M in ~0.3 s warm, where numpy took ~7 s), so the values do not
    depend on the thread count."""
    from optical.kernels import _rng_numba

    out = np.empty(shape, dtype=np.float32)
    scale = std / math.sqrt((1 - 2 * h) ** -1.5)
    _rng_numba.tukey_h_range(key, float(h), float(scale), out.reshape(-1))
    return out


@dataclasses.dataclass(frozen=True)
class SyntheticLlama:
    """The statistics of synthetic Llama weights and hidden states (see the module doc).

    Attributes
    ----------
    weight_std : float
        Standard deviation of a 4096-fan-in matrix; scales as ``1/sqrt(fan_in)``.
    tail_h : float
        Tukey h of the weight distribution (0: Gaussian).
    weight_outlier_channels, weight_outlier_scale : int, float
        Input channels per matrix with larger weights, and by how much.
    residual_outlier_channels, residual_outlier_scale : int, float
        Residual-stream channels with larger activations on every token.
    super_layer : int
        Layer whose down_proj holds the super weight (clipped to the last layer).
    super_channel : int
        Its intermediate channel in an 14336-wide MLP (Llama-3-8B), scaled to
        the model's intermediate size.
    massive_dims : int
        Residual dimensions that carry massive activations.
    massive_range : (float, float)
        Range of their magnitudes on the first token.
    super_activation : float
        The super channel's activation on the first token that the gate and up
        rows are sized for, assuming its normalised MLP input is all BOS
        direction; the attention output dilutes that, so ~150-300 results.
    """

    weight_std: float = 0.02
    tail_h: float = 0.1
    weight_outlier_channels: int = 4
    weight_outlier_scale: float = 4.0
    residual_outlier_channels: int = 6
    residual_outlier_scale: float = 8.0
    super_layer: int = 1
    super_channel: int = 2427
    massive_dims: int = 2
    massive_range: tuple[float, float] = (300.0, 1000.0)
    super_activation: float = 300.0

    def super_index(self, spec: ModelSpec) -> tuple[int, int]:
        """(layer, intermediate channel) of the super weight in this model."""
        layer = min(self.super_layer, spec.num_layers - 1)
        channel = int(self.super_channel * spec.intermediate_size // 14336)
        return layer, min(channel, spec.intermediate_size - 1)

    def massive(self, spec: ModelSpec, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(dims, signed values) of the massive activations of the first token."""
        rng = _rng(seed, "massive")
        dims = np.sort(rng.choice(spec.hidden_size, size=min(self.massive_dims, spec.hidden_size),
                                  replace=False))
        lo, hi = self.massive_range
        values = np.exp(rng.uniform(math.log(lo), math.log(hi), size=dims.size))
        values *= rng.choice([-1.0, 1.0], size=dims.size)
        return dims, values.astype(np.float32)

    def bos_direction(self, spec: ModelSpec, seed: int) -> np.ndarray:
        """Unit vector of the first token's distinctive hidden-state direction."""
        u = _rng(seed, "bos").standard_normal(spec.hidden_size)
        return (u / np.linalg.norm(u)).astype(np.float32)

    def residual_outliers(self, spec: ModelSpec, seed: int) -> np.ndarray:
        """Residual channels with outlier features."""
        count = min(self.residual_outlier_channels, spec.hidden_size)
        return np.sort(_rng(seed, "residual-outliers").choice(spec.hidden_size, size=count,
                                                              replace=False))


DEFAULT = SyntheticLlama()


def _matrix(seed: int, layer: int, name: str, out_features: int, in_features: int,
            stats: SyntheticLlama) -> np.ndarray:
    rng = _rng(seed, "layer", layer, name)
    std = stats.weight_std * math.sqrt(4096 / in_features)
    w = _tukey_h(_key(seed, "layer", layer, name), (out_features, in_features), stats.tail_h,
                 std)
    count = min(stats.weight_outlier_channels, in_features)
    outliers = rng.choice(in_features, size=count, replace=False)
    w[:, outliers] *= np.float32(stats.weight_outlier_scale)
    return w


def _norm_weight(seed: int, layer: int, name: str, size: int) -> np.ndarray:
    gamma = 1.0 + 0.1 * _rng(seed, "layer", layer, name).standard_normal(size)
    return np.abs(gamma).astype(np.float32)


def llama_layer_weights(spec: ModelSpec, layer: int, seed: int,
                        stats: SyntheticLlama = DEFAULT) -> dict[str, np.ndarray]:
    """Synthetic weights of one Llama layer, keyed by short name.

    Matrices are (out_features, in_features) as Hugging Face stores them, float32
    holding bfloat16 values; ``input_layernorm`` and ``post_attention_layernorm``
    are (hidden,).
    """
    weights = {s.name: _matrix(seed, layer, s.name, s.out_features, s.in_features, stats)
               for s in spec.linear_shapes()}
    for name in ("input_layernorm", "post_attention_layernorm"):
        weights[name] = _norm_weight(seed, layer, name, spec.hidden_size)
    super_layer, channel = stats.super_index(spec)
    if layer == super_layer and stats.massive_dims > 0:
        _plant_super_weight(weights, spec, seed, stats, channel)
    return {name: round_to(w, "bfloat16", out=w) for name, w in weights.items()}


def _plant_super_weight(weights: dict[str, np.ndarray], spec: ModelSpec, seed: int,
                        stats: SyntheticLlama, channel: int) -> None:
    """Align the super channel's gate and up rows with the BOS direction and
    write the super weights into down_proj."""
    u = stats.bos_direction(spec, seed)
    gamma = weights["post_attention_layernorm"]
    # The first token's normalised MLP input is ~ sqrt(hidden) * u (its hidden
    # state is dominated by the BOS direction), scaled by gamma.
    along = math.sqrt(spec.hidden_size) * float(np.dot(u, gamma * u))
    gate_target = 12.0
    up_target = stats.super_activation / (gate_target / (1 + math.exp(-gate_target)))
    weights["gate_proj"][channel] += u * np.float32(gate_target / along)
    weights["up_proj"][channel] += u * np.float32(up_target / along)
    dims, values = stats.massive(spec, seed)
    weights["down_proj"][dims, channel] = values / np.float32(stats.super_activation)


def llama_hidden_states(spec: ModelSpec, layer: int, tokens: int, seed: int, *,
                        model_seed: int | None = None, batch: int | None = None,
                        stats: SyntheticLlama = DEFAULT) -> np.ndarray:
    """A synthetic residual-stream input of layer ``layer`` (see the module doc).

    ``model_seed`` (default ``seed``) is the seed of the synthetic weights: the
    BOS direction, the outlier channels and the massive dimensions belong to
    the model and come from it; the token noise comes from ``seed``, ``layer``
    and ``tokens`` (inputs of different lengths are separate draws, not
    prefixes of one another) and ``batch`` (a batch of one is the unbatched
    call's prompt, a larger batch draws other prompts).

    Returns
    -------
    ndarray, float32, shape (tokens, hidden) or (batch, tokens, hidden)
        Token 0 of every prompt is the BOS token: it carries the BOS direction
        and, after the super layer, the massive activations.
    """
    tokens = check_positive_int(tokens, "tokens")
    if batch is not None:
        batch = check_positive_int(batch, "batch")
    if not 0 <= layer < spec.num_layers:
        raise ValueError(f"layer: {layer} is out of range; the model has {spec.num_layers} "
                         f"layers (0..{spec.num_layers - 1})")
    hidden = spec.hidden_size
    rms = 0.05 + 0.3 * layer
    structure = seed if model_seed is None else model_seed
    # The unbatched call draws what a batch of one does (same key), as for BERT.
    rng = _rng(seed, "hidden", layer, tokens, batch or 1)
    shape = (batch or 1, tokens, hidden)
    h = rng.standard_normal(shape, dtype=np.float32)
    scale = np.full(hidden, rms, dtype=np.float32)
    scale[stats.residual_outliers(spec, structure)] *= np.float32(stats.residual_outlier_scale)
    h *= scale
    u = stats.bos_direction(spec, structure)
    h[:, 0] += np.float32(8 * rms * math.sqrt(hidden)) * u
    super_layer, _ = stats.super_index(spec)
    if layer > super_layer and stats.massive_dims > 0:
        dims, values = stats.massive(spec, structure)
        h[:, 0, dims] = values
    return h if batch is not None else h[0]


def bert_layer_weights(spec: ModelSpec, layer: int, seed: int) -> dict[str, np.ndarray]:
    """Synthetic weights of one BERT encoder layer (Gaussian, std 0.02; biases
    and LayerNorm offsets small), keyed by the short names of ``bert.py``."""
    out: dict[str, np.ndarray] = {}
    for s in spec.linear_shapes():
        rng = _rng(seed, "bert", layer, s.name)
        out[s.name] = (0.02 * rng.standard_normal((s.out_features, s.in_features))
                       ).astype(np.float32)
        out[s.name + ".bias"] = (0.02 * rng.standard_normal(s.out_features)).astype(np.float32)
    for name in ("attention.output.LayerNorm", "output.LayerNorm"):
        rng = _rng(seed, "bert", layer, name)
        out[name + ".weight"] = (1 + 0.1 * rng.standard_normal(spec.hidden_size)
                                 ).astype(np.float32)
        out[name + ".bias"] = (0.02 * rng.standard_normal(spec.hidden_size)).astype(np.float32)
    return out


def bert_embedding_weights(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    """Synthetic BERT embedding tables and their LayerNorm."""
    raw = spec.raw
    shapes = {"word_embeddings.weight": (spec.vocab_size, spec.hidden_size),
              "position_embeddings.weight": (raw.get("max_position_embeddings", 512),
                                             spec.hidden_size),
              "token_type_embeddings.weight": (raw.get("type_vocab_size", 2), spec.hidden_size)}
    out = {name: (0.02 * _rng(seed, "bert-embeddings", name).standard_normal(shape)
                  ).astype(np.float32) for name, shape in shapes.items()}
    out["LayerNorm.weight"] = np.ones(spec.hidden_size, dtype=np.float32)
    out["LayerNorm.bias"] = np.zeros(spec.hidden_size, dtype=np.float32)
    return out
