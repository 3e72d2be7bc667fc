"""Small model directories in Hugging Face layout, and an independent float64 Llama layer.

Nothing here imports the library's transformer code: the float64 layer is a
re-derivation from the published definitions (Llama 3 model card and Meta's
reference ``apply_scaling``; HF's rotate-half convention), so agreeing with
it is a check, not a tautology.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 3,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 131072,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}

TINY_BERT = {
    "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
    "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 120, "layer_norm_eps": 1e-12,
    "max_position_embeddings": 64, "type_vocab_size": 2, "pad_token_id": 0,
    "position_embedding_type": "absolute",
}

LLAMA_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                 "mlp.down_proj.weight", "input_layernorm.weight",
                 "post_attention_layernorm.weight")


def llama_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    h, i = config["hidden_size"], config["intermediate_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    return {"self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h),
            "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
            "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h),
            "mlp.down_proj.weight": (h, i), "input_layernorm.weight": (h,),
            "post_attention_layernorm.weight": (h,)}


def random_llama_tensors(config: dict, seed: int = 0, dtype=np.float32) -> dict[str, np.ndarray]:
    """Every layer's tensors under HF names, random (norm weights around 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(config["num_hidden_layers"]):
        for name, shape in llama_shapes(config).items():
            if len(shape) == 1:
                value = 1 + 0.2 * rng.standard_normal(shape)
            else:
                value = rng.standard_normal(shape) / math.sqrt(shape[1])
            out[f"model.layers.{layer}.{name}"] = value.astype(np.float32).astype(dtype)
    return out


def write_model(directory: Path, config: dict, tensors: dict[str, np.ndarray] | None = None,
                shards: int = 1) -> Path:
    """config.json (+ safetensors, sharded with an index when ``shards > 1``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    if tensors:
        from safetensors.numpy import save_file

        names = sorted(tensors)
        if shards == 1:
            save_file({n: tensors[n] for n in names}, str(directory / "model.safetensors"),
                      metadata={"format": "pt"})
        else:
            weight_map = {}
            for s in range(shards):
                file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
                part = names[s::shards]
                save_file({n: tensors[n] for n in part}, str(directory / file),
                          metadata={"format": "pt"})
                weight_map.update({n: file for n in part})
            (directory / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def drop_from_index(directory: Path, name: str) -> None:
    """Leave tensor ``name`` out of a sharded checkpoint's index (its shard
    still holds it), as a damaged or hand-edited index would."""
    index = directory / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    del data["weight_map"][name]
    index.write_text(json.dumps(data))


# --------------------------------------------------------------------------- #
# An independent float64 Llama decoder layer
# --------------------------------------------------------------------------- #

def llama3_inv_freq64(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """Meta's ``apply_scaling`` (llama-models, Llama 3.1), written as a loop in float64."""
    freqs = [1.0 / theta ** (i / head_dim) for i in range(0, head_dim, 2)]
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def llama_layer64(h: np.ndarray, w: dict[str, np.ndarray], config: dict) -> np.ndarray:
    """One decoder layer in float64; ``w`` keyed by HF tensor names without the layer prefix.

    ``h``: (tokens, hidden) at positions 0..tokens-1, causal attention.
    """
    h = h.astype(np.float64)
    w = {k: v.astype(np.float64) for k, v in w.items()}
    tokens, hidden = h.shape
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or hidden // heads
    eps = config["rms_norm_eps"]

    def rms(x, g):
        return g * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)

    x = rms(h, w["input_layernorm.weight"])
    q = (x @ w["self_attn.q_proj.weight"].T).reshape(tokens, heads, d)
    k = (x @ w["self_attn.k_proj.weight"].T).reshape(tokens, kv_heads, d)
    v = (x @ w["self_attn.v_proj.weight"].T).reshape(tokens, kv_heads, d)
    inv = llama3_inv_freq64(d, config["rope_theta"], config["rope_scaling"])
    angle = np.arange(tokens)[:, None] * inv[None, :]          # (T, d/2)
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]

    def rotate(t):  # pairs (i, i + d/2): the rotate-half convention of HF checkpoints
        a, b = t[..., : d // 2], t[..., d // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

    q, k = rotate(q), rotate(k)
    out = np.empty((tokens, heads, d))
    group = heads // kv_heads
    for head in range(heads):
        kv = head // group
        s = q[:, head] @ k[:, kv].T / math.sqrt(d)
        s[np.triu_indices(tokens, 1)] = -np.inf
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, head] = p @ v[:, kv]
    h = h + out.reshape(tokens, heads * d) @ w["self_attn.o_proj.weight"].T
    x = rms(h, w["post_attention_layernorm.weight"])
    gate, up = x @ w["mlp.gate_proj.weight"].T, x @ w["mlp.up_proj.weight"].T
    return h + (gate / (1 + np.exp(-gate)) * up) @ w["mlp.down_proj.weight"].T


# --------------------------------------------------------------------------- #
# An independent float64 BERT encoder with mean pooling
# --------------------------------------------------------------------------- #

def bert_embed64(ids: list[int], t: dict[str, np.ndarray], config: dict,
                 prefix: str = "", *, hidden: bool = False) -> np.ndarray:
    """Mean-pooled, L2-normalised float64 embedding of one unpadded sentence
    (sentence-transformers' all-MiniLM-L6-v2 recipe), from HF tensor names;
    with ``hidden``, the last layer's hidden states (tokens, hidden) instead."""
    from scipy.special import erf

    t = {k[len(prefix):]: np.asarray(v, dtype=np.float64) for k, v in t.items()
         if k.startswith(prefix)}
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]

    def norm(x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * t[name + ".weight"] + t[name + ".bias"]

    def dense(x, name):
        return x @ t[name + ".weight"].T + t[name + ".bias"]

    n = len(ids)
    x = (t["embeddings.word_embeddings.weight"][ids]
         + t["embeddings.token_type_embeddings.weight"][0]
         + t["embeddings.position_embeddings.weight"][:n])
    x = norm(x, "embeddings.LayerNorm")
    d = x.shape[1] // heads
    for layer in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{layer}."
        q, k, v = (dense(x, p + f"attention.self.{m}").reshape(n, heads, d)
                   for m in ("query", "key", "value"))
        ctx = np.empty_like(q)
        for head in range(heads):
            s = q[:, head] @ k[:, head].T / math.sqrt(d)
            e = np.exp(s - s.max(1, keepdims=True))
            ctx[:, head] = (e / e.sum(1, keepdims=True)) @ v[:, head]
        x = norm(dense(ctx.reshape(n, -1), p + "attention.output.dense") + x,
                 p + "attention.output.LayerNorm")
        inter = dense(x, p + "intermediate.dense")
        inter = 0.5 * inter * (1 + erf(inter / math.sqrt(2)))
        x = norm(dense(inter, p + "output.dense") + x, p + "output.LayerNorm")
    if hidden:
        return x
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)
