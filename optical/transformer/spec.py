"""Model shapes from a Hugging Face ``config.json``: what every layer multiplies.

The energy model and the layer implementations both read the matmul shapes
from here, so a schedule is counted from the same shapes that are emulated.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optical._files import MODEL_JSON_BYTES, read_plain
from optical._frozen import frozen
from optical._validation import parse_json

__all__ = ["LinearShape", "ModelSpec", "read_spec"]

_ARCHITECTURES = {"llama": "llama", "bert": "bert"}


#: float32's largest value: a config number beyond it is inf in the layers.
FLOAT32_MAX = 3.4028234663852886e38


def is_positive_number(value: Any) -> bool:
    """Whether a config.json value is a finite number above zero (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    # (an int past float range has no float value: compared as it is)
    return value > 0 if isinstance(value, int) else math.isfinite(value) and value > 0


@dataclasses.dataclass(frozen=True)
class LinearShape:
    """One weight matmul of a layer: ``y (T, out) = x (T, in) @ W.T``."""

    name: str
    in_features: int
    out_features: int


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The architecture facts of a model directory's ``config.json``.

    Attributes
    ----------
    architecture : {"llama", "bert"}
    hidden_size, intermediate_size, num_layers, num_heads, num_kv_heads, head_dim,
    vocab_size : int
    raw : Mapping
        The whole ``config.json``, for the architecture-specific keys (RoPE
        scaling, norm epsilons, ...): a read-only dict, nested objects
        too (``optical._frozen.FrozenMapping``; lists as tuples), compared
        and hashed with the rest, since the layers read it.
    """

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    raw: Mapping[str, Any] = dataclasses.field(repr=False)

    def __post_init__(self) -> None:
        if self.architecture not in _ARCHITECTURES.values():
            raise ValueError(f"architecture {self.architecture!r} is not supported; one of "
                             f"{', '.join(sorted(set(_ARCHITECTURES.values())))}")
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.raw, Mapping):
            raise TypeError(f"raw must be a mapping (the parsed config.json), got "
                            f"{type(self.raw).__name__}")
        frozen(self, "raw")

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, source: str = "config.json") -> ModelSpec:
        """Build from a parsed ``config.json``; ValueError names a missing or bad key."""
        model_type = config.get("model_type")
        if "model_type" not in config:
            raise ValueError(f"{source}: missing key 'model_type' (supported: "
                             f"{', '.join(_ARCHITECTURES)})")
        if not isinstance(model_type, str) or model_type not in _ARCHITECTURES:
            raise ValueError(f"{source}: unknown architecture model_type={model_type!r}; "
                             f"supported: {', '.join(_ARCHITECTURES)}")

        def need(key: str) -> int:
            if key not in config:
                raise ValueError(f"{source}: missing key {key!r} for model_type {model_type!r}")
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{source}: key {key!r} must be a positive integer, got {value!r}")
            return value

        def positive(key: str, *, null: bool) -> None:  # optional keys read as numbers
            value = config.get(key)
            if value is None and key in config and not null:  # no default for an explicit null
                raise ValueError(f"{source}: key {key!r} must be a positive number, got null "
                                 "(leave the key out for the architecture's default)")
            if value is not None and not is_positive_number(value):
                raise ValueError(f"{source}: key {key!r} must be a positive number, "
                                 f"got {value!r}")
            if value is not None and value > FLOAT32_MAX:  # would be inf in the layers
                raise ValueError(f"{source}: key {key!r} must be within float32's range "
                                 f"(the layers compute in float32), got {value!r}")

        positive("rms_norm_eps", null=False)
        positive("layer_norm_eps", null=False)
        positive("rope_theta", null=True)  # rope_settings names a null one
        if "max_position_embeddings" in config:
            need("max_position_embeddings")
        for key in ("rope_scaling", "rope_parameters"):
            if config.get(key) is not None and not isinstance(config[key], Mapping):
                raise ValueError(f"{source}: key {key!r} must be an object (or null), got "
                                 f"{config[key]!r}")
        hidden, heads = need("hidden_size"), need("num_attention_heads")
        kv_heads = (need("num_key_value_heads") if config.get("num_key_value_heads") is not None
                    else heads)  # absent or null: as many as the heads (Hugging Face)
        if model_type == "bert":
            # Hugging Face's BertSelfAttention derives the head size from
            # hidden_size alone and ignores a head_dim key: so do we.
            if hidden % heads:
                raise ValueError(f"{source}: hidden_size {hidden} is not divisible by "
                                 f"num_attention_heads {heads}")
            if kv_heads != heads:
                raise ValueError(f"{source}: num_key_value_heads {kv_heads} differs from "
                                 f"num_attention_heads {heads}; BERT has no grouped-query "
                                 "attention")
            head_dim = hidden // heads
            if "type_vocab_size" in config:
                need("type_vocab_size")
            pad = config.get("pad_token_id")
            if pad is not None and (isinstance(pad, bool) or not isinstance(pad, int)
                                    or not 0 <= pad < need("vocab_size")):
                raise ValueError(f"{source}: key 'pad_token_id' must be null or a token id "
                                 f"in [0, vocab_size {config['vocab_size']}), got {pad!r}")
        else:
            head_dim = (need("head_dim") if config.get("head_dim") is not None
                        else hidden // heads)  # Hugging Face's LlamaAttention likewise
            if head_dim < 1:
                raise ValueError(f"{source}: hidden_size {hidden} // num_attention_heads "
                                 f"{heads} is a head of 0 features; set head_dim")
        if heads % kv_heads:
            raise ValueError(f"{source}: num_attention_heads {heads} is not a multiple of "
                             f"num_key_value_heads {kv_heads}")
        return cls(architecture=_ARCHITECTURES[model_type], hidden_size=hidden,
                   intermediate_size=need("intermediate_size"),
                   num_layers=need("num_hidden_layers"), num_heads=heads, num_kv_heads=kv_heads,
                   head_dim=head_dim, vocab_size=need("vocab_size"), raw=dict(config))

    @property
    def max_positions(self) -> int | None:
        """The longest prompt the config allows: ``max_position_embeddings``
        (BERT's default 512; None for a Llama config without the key)."""
        return self.raw.get("max_position_embeddings", 512 if self.architecture == "bert"
                            else None)

    def check_tokens(self, tokens: int, name: str = "tokens") -> None:
        """ValueError, naming the argument ``name``, when a prompt of ``tokens``
        tokens (positions 0..tokens-1) exceeds :attr:`max_positions`."""
        limit = self.max_positions
        if limit is not None and tokens > limit:
            raise ValueError(f"{name}: {tokens} exceed max_position_embeddings {limit} of "
                             "config.json (positions run 0..tokens-1)")

    def linear_shapes(self) -> list[LinearShape]:
        """The weight matmuls of one layer, in execution order."""
        h, i = self.hidden_size, self.intermediate_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.architecture == "llama":
            return [LinearShape("q_proj", h, q), LinearShape("k_proj", h, kv),
                    LinearShape("v_proj", h, kv), LinearShape("o_proj", q, h),
                    LinearShape("gate_proj", h, i), LinearShape("up_proj", h, i),
                    LinearShape("down_proj", i, h)]
        return [LinearShape("query", h, q), LinearShape("key", h, kv),
                LinearShape("value", h, kv), LinearShape("attention.output", q, h),
                LinearShape("intermediate", h, i), LinearShape("output", i, h)]

    def linear_macs_per_token(self) -> int:
        """Multiply-accumulates of the weight matmuls of one layer, per token."""
        return sum(s.in_features * s.out_features for s in self.linear_shapes())


def missing_model_directory(model_dir: str | os.PathLike) -> FileNotFoundError:
    """The error for a model directory that is not there (or is a file,
    named so); ``models/...`` given relative says where the bundled ones are."""
    path = Path(model_dir)
    if path.is_file():  # config.json, a safetensors file: the directory was meant
        return FileNotFoundError(f"{model_dir}: a file, not a model directory (give the "
                                 f"directory that holds config.json: {path.parent})")
    hint = ""
    if not path.is_absolute() and path.parts[:1] == ("models",):
        hint = (f" in {Path.cwd()} (the bundled models/ directories come with optical's "
                "source checkout: run from there, or give a full path)")
    return FileNotFoundError(f"{model_dir}: no such model directory{hint}")


def _transformer_hint(model_dir: Path) -> str:
    """Where a sentence-transformers directory of the older layout keeps its
    encoder (``modules.json``'s first module in ``0_Transformer/``, say)."""
    from optical.transformer.sentence import transformer_subdirectory

    sub = transformer_subdirectory(model_dir)
    if sub is None or not (sub / "config.json").is_file():
        return ""
    return (f" (its modules.json puts the Transformer in {str(sub.relative_to(model_dir))!r}: "
            f"give the model directory {sub})")


def read_spec(model_dir: str | Path) -> ModelSpec:
    """Read ``model_dir/config.json``.

    Raises
    ------
    FileNotFoundError
        If the directory or its config.json does not exist.
    ValueError
        If the JSON is malformed or names an unsupported architecture.
    """
    if not Path(model_dir).is_dir():  # (a relative path run from elsewhere, say)
        raise missing_model_directory(model_dir)
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json in model directory {model_dir}"
                                f"{_transformer_hint(Path(model_dir))}")
    try:
        config = parse_json(read_plain(path, MODEL_JSON_BYTES).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return ModelSpec.from_config(config, source=str(path))
