"""How a sentence-transformers directory turns a BERT's hidden states into a sentence embedding.

A sentence-transformers model directory (all-MiniLM-L6-v2, BGE, ...) says
how its embeddings are made, beside the encoder's ``config.json``:
``modules.json`` lists the modules (the Transformer, a Pooling, and a
Normalize when the embeddings are unit vectors), ``1_Pooling/config.json``
(or wherever modules.json puts the Pooling) names the pooling, and
``sentence_bert_config.json`` gives ``max_seq_length`` (tokens kept,
[CLS] and [SEP] included) and ``do_lower_case``. :func:`read_pipeline`
reads them, supports what sentence-transformers' own models use (mean, CLS
and max pooling; Normalize or not) and refuses any other module or pooling
by name rather than embed as another model would. A directory without
``modules.json`` embeds by all-MiniLM-L6-v2's recipe (mean, L2, 256 tokens).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optical._files import MODEL_JSON_BYTES, read_plain
from optical._validation import parse_json

__all__ = ["MINILM", "SentencePipeline", "pool", "read_pipeline", "read_text_settings"]

#: The pooling modes supported, by their sentence-transformers config key.
_POOLING = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls",
            "pooling_mode_max_tokens": "max"}
#: Pooling modes sentence-transformers has that this module does not run.
_UNSUPPORTED = ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                "pooling_mode_lasttoken")
_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclasses.dataclass(frozen=True)
class SentencePipeline:
    """What follows the encoder in a sentence embedding.

    Attributes
    ----------
    pooling : {"mean", "cls", "max"}
        Mean of the real tokens' hidden states, the first ([CLS]) token's, or
        their elementwise maximum.
    normalize : bool
        Scale each embedding to unit L2 norm.
    max_seq_length : int or None
        Tokens a sentence keeps, [CLS] and [SEP] included (None: as many as
        the model has positions).
    lower_case : bool
        Lower-case the text before tokenising (``do_lower_case``) with
        Python's ``str.lower``, as sentence-transformers 5 does; 6.3 lower-cases
        in the tokenizer, and some text then tokenises differently (Greek
        "ΣΊΣΥΦΟΣ": 8 tokens here and in 5.1, 9 in 6.3).
    source : Path or None
        The directory it was read from; None for the default recipe.
    """

    pooling: str = "mean"
    normalize: bool = True
    max_seq_length: int | None = 256
    lower_case: bool = False
    source: Path | None = None


#: all-MiniLM-L6-v2's recipe, for a directory without modules.json.
MINILM = SentencePipeline()


def read_pipeline(directories: Sequence[Path], hidden_size: int) -> SentencePipeline:
    """The pipeline of the first of ``directories`` holding ``modules.json``;
    :data:`MINILM` when none does.

    Raises
    ------
    ValueError
        Naming the file and key: a module other than Transformer, Pooling and
        Normalize (a Dense projection, say), a Transformer in a subdirectory,
        a pooling other than mean, CLS or max (or several at once), a Pooling
        whose ``word_embedding_dimension`` is not ``hidden_size``, or a file
        that is not the JSON it should be.
    """
    directory = _sentence_directory(directories)
    if directory is None:
        return MINILM
    modules = _read(directory / "modules.json")
    where = directory / "modules.json"
    if not isinstance(modules, list) or not all(
            isinstance(m, dict) and isinstance(m.get("type"), str) for m in modules):
        raise ValueError(f"{where}: expected a list of modules, each with a 'type'")
    kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
    for module, kind in zip(modules, kinds, strict=True):
        if kind not in _MODULES or not module["type"].startswith("sentence_transformers."):
            raise ValueError(f"{where}: module {module['type']!r} is not supported; "
                             "supported: Transformer, Pooling, Normalize (a model with "
                             "another module would embed differently)")
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(f"{where}: modules {kinds} are not supported; expected Transformer, "
                         "Pooling and optionally Normalize, in that order")
    if modules[0].get("path", "") not in ("", "."):
        raise ValueError(f"{where}: the Transformer module is in {modules[0]['path']!r}; "
                         "point the model directory at that subdirectory's config.json "
                         "and weights")
    pooling = _read_pooling(directory / str(modules[1].get("path", "")) / "config.json",
                            hidden_size)
    max_seq_length, lower_case = _read_settings(directory)
    return SentencePipeline(pooling=pooling, normalize=kinds[-1] == "Normalize",
                            max_seq_length=max_seq_length, lower_case=lower_case,
                            source=directory)


def read_text_settings(directories: Sequence[Path]) -> tuple[int | None, bool]:
    """``(max_seq_length, do_lower_case)`` of the pipeline :func:`read_pipeline`
    would read, without its modules and pooling: what tokenising needs
    (all-MiniLM-L6-v2's 256 and False without ``modules.json``).

    Raises
    ------
    ValueError
        ``sentence_bert_config.json`` is not what it should be (naming the key).
    """
    directory = _sentence_directory(directories)
    if directory is None:
        return MINILM.max_seq_length, MINILM.lower_case
    return _read_settings(directory)


def _sentence_directory(directories: Sequence[Path]) -> Path | None:
    return next((d for d in directories if (d / "modules.json").is_file()), None)


def _read_settings(directory: Path) -> tuple[int | None, bool]:
    settings = directory / "sentence_bert_config.json"
    max_seq_length, lower_case = None, False
    if settings.is_file():
        raw = _read(settings)
        if not isinstance(raw, dict):
            raise ValueError(f"{settings}: expected a JSON object")
        max_seq_length = raw.get("max_seq_length")
        if max_seq_length is not None and (isinstance(max_seq_length, bool) or not isinstance(
                max_seq_length, int) or max_seq_length < 2):
            raise ValueError(f"{settings}: max_seq_length must be an integer >= 2 ([CLS] "
                             f"and [SEP]) or null, got {max_seq_length!r}")
        lower_case = raw.get("do_lower_case", False)
        if not isinstance(lower_case, bool):
            raise ValueError(f"{settings}: do_lower_case must be true or false, got "
                             f"{lower_case!r}")
    return max_seq_length, lower_case


def _read(path: Path) -> Any:
    try:
        return parse_json(read_plain(path, MODEL_JSON_BYTES).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def _read_pooling(path: Path, hidden_size: int) -> str:
    if not path.is_file():
        raise ValueError(f"{path}: missing (modules.json puts the Pooling module there)")
    raw = _read(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    dimension = raw.get("word_embedding_dimension", hidden_size)
    if dimension != hidden_size:
        raise ValueError(f"{path}: word_embedding_dimension {dimension!r} is not config.json's "
                         f"hidden_size {hidden_size}")
    chosen = [key for key in (*_POOLING, *_UNSUPPORTED) if raw.get(key) is True]
    if len(chosen) != 1 or chosen[0] in _UNSUPPORTED:
        found = ", ".join(chosen) or "none"
        raise ValueError(f"{path}: pooling {found} is not supported; supported: exactly one "
                         f"of {', '.join(_POOLING)} set to true")
    return _POOLING[chosen[0]]


def pool(h: np.ndarray, mask: np.ndarray, pipeline: SentencePipeline) -> np.ndarray:
    """Sentence embeddings from hidden states ``h`` (batch, tokens, hidden)
    and the real tokens ``mask`` (batch, tokens), in ``h``'s dtype: pooled over each
    sentence's real tokens, then L2-normalised when the pipeline says so (a
    row without real tokens pools to zeros by mean or max)."""
    weights = mask.astype(np.float32)[..., None]
    if pipeline.pooling == "cls":
        pooled = h[:, 0].copy()  # (not a view keeping the hidden states alive)
    elif pipeline.pooling == "max":  # padding can never be the maximum
        pooled = np.where(mask[..., None], h, -np.inf).max(axis=1)
        pooled[~mask.any(axis=1)] = 0.0  # a row without tokens: zeros, as its mean is
    else:
        pooled = (h * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    if pipeline.normalize:
        pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
    return pooled
