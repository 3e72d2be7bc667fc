"""Rotary position embeddings as Hugging Face Llama checkpoints need them.

HF checkpoints hold q/k projections whose rows the conversion script
permuted so that RoPE rotates the pair (i, i + d/2) of each head ("rotate
half"), not the interleaved pair (2i, 2i + 1) of Meta's original code.
Linear scaling (position interpolation, "linear" rope type) divides every
frequency by ``factor``. Dynamic NTK scaling ("dynamic") changes the
frequencies only for prompts longer than ``max_position_embeddings``, which
are refused (``ModelSpec.check_tokens``): within it, the default rotation,
as transformers computes it. Llama 3.1 and 3.2 scale the frequencies
("llama3" rope type): wavelengths shorter than
``original_max_position_embeddings / high_freq_factor`` are kept, those
longer than ``original_max_position_embeddings / low_freq_factor`` are
divided by ``factor``, and those between are blended.
Tables are computed in float32, as Hugging Face does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from optical.transformer.spec import FLOAT32_MAX, is_positive_number

__all__ = ["apply_rope", "inverse_frequencies", "rope_settings", "rope_tables", "rotate_half"]

_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")


def rope_settings(config: Mapping[str, Any]) -> tuple[float, Mapping[str, Any] | None, str]:
    """(theta, scaling, key) from a ``config.json``, as transformers reads it:
    transformers < 5 reads ``rope_scaling`` and the top-level ``rope_theta``;
    transformers >= 5 writes both in ``rope_parameters`` and reads
    ``rope_scaling`` in its place when that is a non-empty object, taking
    ``rope_theta`` from the object read, else from the top level (10000 when
    neither has one). ``key`` names the object read, for error messages.

    A config that transformers versions, or its two RoPE keys, would read as
    different rotations is refused, naming what differs: ``rope_parameters``
    and ``rope_scaling`` that disagree (a null ``rope_scaling`` beside a
    scaled ``rope_parameters``, or a ``rope_theta`` in one object only,
    included), a ``rope_theta`` inside ``rope_scaling`` other than the top
    level's, or a top-level ``original_max_position_embeddings`` other than
    the llama3 scaling's (transformers >= 5 reads the top-level one)."""
    params = config.get("rope_parameters")
    legacy = config.get("rope_scaling")
    for name, value in (("rope_parameters", params), ("rope_scaling", legacy)):
        if value is not None and not isinstance(value, Mapping):
            raise ValueError(f"{name}: must be an object (or null), got {value!r}")
        if isinstance(value, Mapping) and "type" in value and "rope_type" in value \
                and value["type"] != value["rope_type"]:  # 4 reads "type", 5 "rope_type"
            _refuse_disagreement(f"{name}.type = {value['type']!r} but {name}.rope_type = "
                                 f"{value['rope_type']!r}")
    if params is not None and "rope_scaling" in config and legacy is None \
            and (kind := _rope_field(params, "rope_type")) != "default":
        _refuse_disagreement(f"rope_parameters.rope_type = {kind!r} but rope_scaling = null")
    if params is not None and legacy is not None:
        for field in ("rope_type", *_LLAMA3_KEYS):
            ours, theirs = _rope_field(params, field), _rope_field(legacy, field)
            if ours is not None and theirs is not None and ours != theirs:
                _refuse_disagreement(f"rope_parameters.{field} = {ours!r} but "
                                     f"rope_scaling.{field} = {theirs!r}")
    if params is not None and is_positive_number(params.get("rope_theta")) \
            and is_positive_number(config.get("rope_theta")) \
            and params["rope_theta"] != config["rope_theta"]:
        _refuse_disagreement(f"rope_parameters.rope_theta = {params['rope_theta']!r} but "
                             f"rope_theta = {config['rope_theta']!r}")
    top_theta = config.get("rope_theta", 10000.0)
    # Each reading: (what it is, theta, where theta came from, scaling, its key).
    readings = []
    if params is not None and "rope_scaling" in config:
        readings.append(("rope_parameters", *_theta_of(params, "rope_parameters", top_theta),
                         params, "rope_parameters"))
    if legacy:
        newest = ("transformers >= 5", *_theta_of(legacy, "rope_scaling", top_theta), legacy,
                  "rope_scaling")
    elif params is not None:
        newest = ("transformers >= 5", *_theta_of(params, "rope_parameters", top_theta), params,
                  "rope_parameters")
    else:
        newest = ("transformers >= 5", top_theta, "config.json", legacy, "rope_scaling")
    readings.append(newest)
    if params is None or "rope_scaling" in config:  # a config transformers < 5 reads
        readings.append(("transformers < 5", top_theta, "config.json", legacy, "rope_scaling"))
    for _, theta, where, _, _ in readings:
        _check_theta(theta, where)
    signatures = [_signature(theta, scaling) for _, theta, _, scaling, _ in readings]
    if any(s != signatures[0] for s in signatures[1:]):
        differ = [name for name in signatures[0]
                  if len({repr(s.get(name)) for s in signatures}) > 1]
        said = "; ".join(f"{name} reads " + ", ".join(f"{f} {sig.get(f)!r}" for f in differ)
                         for (name, *_), sig in zip(readings, signatures, strict=True))
        raise ValueError(f"config.json: the RoPE settings are read differently: {said}; keep "
                         "one RoPE object (rope_scaling or rope_parameters), with rope_theta "
                         "at the top level or beside the same values in it")
    _, theta, _, scaling, key = newest
    if _rope_field(scaling or {}, "rope_type") == "llama3" \
            and "original_max_position_embeddings" in config \
            and config["original_max_position_embeddings"] \
            != scaling.get("original_max_position_embeddings"):
        _refuse_disagreement(
            f"original_max_position_embeddings = {config['original_max_position_embeddings']!r}"
            f" but {key}.original_max_position_embeddings = "
            f"{scaling.get('original_max_position_embeddings')!r} (transformers >= 5 reads "
            "the top-level one, transformers < 5 the other)")
    return float(theta), scaling, key


def _theta_of(scaling: Mapping[str, Any], key: str, top_theta: Any) -> tuple[Any, str]:
    """A RoPE object's theta and where it came from: its own, else the top level's."""
    return (scaling["rope_theta"], key) if "rope_theta" in scaling else (top_theta, "config.json")


def _check_theta(theta: Any, where: str) -> None:
    if not is_positive_number(theta):
        raise ValueError(f"{where}: rope_theta must be a positive number, got {theta!r}")
    if not 1 < theta <= FLOAT32_MAX:  # else the wavelengths do not grow, or overflow
        raise ValueError(f"{where}: rope_theta must exceed 1 (RoPE's wavelengths grow as "
                         f"its powers) and be within float32's range, got {theta!r}")


def _signature(theta: float, scaling: Mapping[str, Any] | None) -> dict[str, Any]:
    """What decides the rotation: the rope type, theta and the type's fields
    (those of a type this module does not implement, all of them)."""
    scaling = scaling or {}
    kind = _rope_field(scaling, "rope_type")
    if kind == "default":
        fields: tuple = ()
    elif kind in ("linear", "dynamic"):
        fields = ("factor",)
    elif kind == "llama3":
        fields = _LLAMA3_KEYS
    else:
        fields = tuple(sorted(k for k in scaling if k not in ("rope_type", "type", "rope_theta")))
    return {"rope_type": kind, "rope_theta": float(theta),
            **{f: scaling.get(f) for f in fields}}


def _refuse_disagreement(what: str) -> None:
    raise ValueError(f"config.json: {what}; transformers versions read different ones, "
                     "so keep one of the two keys")


def _rope_field(scaling: Mapping[str, Any], field: str) -> Any:
    """A scaling's field; its type under either name, "default" when unnamed."""
    if field == "rope_type":
        return scaling.get("rope_type", scaling.get("type", "default"))
    return scaling.get(field)


def inverse_frequencies(head_dim: int, theta: float,
                        scaling: Mapping[str, Any] | None = None, *,
                        key: str = "rope_scaling") -> np.ndarray:
    """Inverse frequencies ``theta ** (-2i / head_dim)``, i < head_dim / 2, float32,
    with linear or llama3 scaling applied when ``scaling`` (the config's
    ``rope_scaling``) says so. A "dynamic" scaling gives the default
    frequencies: transformers' for positions below ``max_position_embeddings``
    (the caller keeps prompts within it; longer ones rescale theta).

    Raises
    ------
    ValueError
        For an odd head_dim, a rope type other than "default", "linear" (every
        frequency divided by ``factor``), "dynamic" or "llama3", or a missing
        or bad scaling key (named as ``<key>.<field>``).
    """
    if head_dim % 2:
        raise ValueError(f"head_dim: {head_dim} must be even for rotary embeddings")
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    # The power in float64, rounded once (correctly rounded): numpy's float32
    # power is off by up to 0.9 ulp, and a frequency's error grows with the
    # position it multiplies (5e-4 rad at 8k tokens). torch's float32 power
    # is nearly always correctly rounded too: bit for bit at Llama's thetas
    # and head sizes, an ulp apart in a rare frequency elsewhere.
    powers = (np.float64(np.float32(theta)) ** exponents.astype(np.float64)).astype(np.float32)
    inv_freq = (np.float32(1.0) / powers).astype(np.float32)
    rope_type = _rope_field(scaling or {}, "rope_type")
    if scaling is None or rope_type == "default":
        return inv_freq
    if rope_type in ("linear", "dynamic"):
        factor = scaling.get("factor")
        if factor is None:
            raise ValueError(f"{key}.factor: missing for rope_type {rope_type!r}")
        if not is_positive_number(factor) or factor > FLOAT32_MAX:
            raise ValueError(f"{key}.factor: must be a positive number within float32's "
                             f"range, got {factor!r}")
        if rope_type == "dynamic":  # unscaled within max_position_embeddings
            return inv_freq
        return (inv_freq / np.float32(factor)).astype(np.float32)  # position interpolation
    if rope_type != "llama3":
        named = "rope_type" if "rope_type" in scaling else "type"  # as the file names it
        raise ValueError(f"{key}.{named}: {rope_type!r} is not supported; "
                         "supported: 'default', 'linear', 'dynamic', 'llama3'")
    for field in _LLAMA3_KEYS:
        if field not in scaling:
            raise ValueError(f"{key}.{field}: missing for rope_type 'llama3'")
    for field in _LLAMA3_KEYS:
        if not is_positive_number(scaling[field]):
            raise ValueError(f"{key}.{field}: must be a positive number, got "
                             f"{scaling[field]!r}")
        if scaling[field] > FLOAT32_MAX:  # (an int past float range has no float value)
            raise ValueError(f"{key}.{field}: must be within float32's range (the tables "
                             f"are float32), got {scaling[field]!r}")
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    if not high > low:
        raise ValueError(f"{key}.high_freq_factor: {high} must exceed "
                         f"low_freq_factor {low}")
    # torch evaluates a scalar over a tensor as the tensor's reciprocal times
    # the scalar (last bits apart from a division): so do these.
    wavelength = (np.float32(1.0) / inv_freq) * np.float32(2 * math.pi)
    scaled = np.where(wavelength > old_context / low, inv_freq / np.float32(factor), inv_freq)
    smooth = ((np.float32(1.0) / wavelength) * np.float32(old_context) - low) / (high - low)
    blended = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelength < old_context / high) & ~(wavelength > old_context / low)
    return np.where(medium, blended, scaled).astype(np.float32)


def rope_tables(positions: np.ndarray, inv_freq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin) tables of shape (len(positions), head_dim), float32.

    Each frequency appears twice (``cat(freqs, freqs)``), for the rotate-half
    pairing.
    """
    freqs = positions.astype(np.float32)[:, None] * inv_freq[None, :]
    angles = np.concatenate([freqs, freqs], axis=-1)
    return np.cos(angles), np.sin(angles)


def rotate_half(x: np.ndarray) -> np.ndarray:
    """``cat(-x2, x1)`` over the last axis, where ``x = cat(x1, x2)``."""
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray,
               rnd: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """``x * cos + rotate_half(x) * sin``; ``rnd`` rounds each op's result.

    Parameters
    ----------
    x : ndarray, shape (..., tokens, head_dim)
    cos, sin : ndarray, shape (tokens, head_dim)
    rnd : callable, optional
        Rounding to the model dtype after each op (identity if omitted).
    """
    if rnd is None:
        return x * cos + rotate_half(x) * sin
    return rnd(rnd(x * cos) + rnd(rotate_half(x) * sin))
