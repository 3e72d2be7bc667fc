"""How a sentence-transformers directory turns a BERT's hidden states into a sentence embedding.

A sentence-transformers model directory (all-MiniLM-L6-v2, BGE, ...) says
how its embeddings are made, beside the encoder's ``config.json``:
``modules.json`` lists the modules (the Transformer, a Pooling, and a
Normalize when the embeddings are unit vectors), ``1_Pooling/config.json``
(or wherever modules.json puts the Pooling) names the pooling, and
``sentence_bert_config.json`` gives ``max_seq_length`` (tokens kept,
[CLS] and [SEP] included; where it has none, ``tokenizer_config.json``'s
``model_max_length``, as sentence-transformers 6 writes it) and
``do_lower_case``, and ``config_sentence_transformers.json`` may name a
``default_prompt_name``, whose prompt is put before every sentence.
:func:`read_pipeline` reads them, in the layouts of sentence-transformers 2
to 6 (the Transformer's files beside ``modules.json`` or in its own
subdirectory, ``0_Transformer``; a Pooling's mode as one key per mode or as
``pooling_mode``), supports what sentence-transformers' own models use
(mean, CLS and max pooling; Normalize or not) and refuses any other module
or pooling by name rather than embed as another model would. A directory
without ``modules.json`` (nor one above it naming it) embeds by
all-MiniLM-L6-v2's recipe (mean, L2, 256 tokens).
"""

from __future__ import annotations

import dataclasses
import json
import os
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
#: A tokenizer_config.json's model_max_length at or above this is transformers'
#: "no limit" (int(1e30)), not a length.
_NO_LIMIT = 10**9
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
        The directory it was read from (the one holding ``modules.json``:
        the model directory as given, or the parent of a ``0_Transformer``
        given); None for the default recipe.
    prompt : str
        Text put before every sentence (sentence-transformers'
        ``default_prompt_name`` in ``config_sentence_transformers.json``, a
        retrieval model's "query: ", say); "" for none.
    """

    pooling: str = "mean"
    normalize: bool = True
    max_seq_length: int | None = 256
    lower_case: bool = False
    source: Path | None = None
    prompt: str = ""


#: all-MiniLM-L6-v2's recipe, for a directory without modules.json.
MINILM = SentencePipeline()


def read_pipeline(directories: Sequence[Path], hidden_size: int) -> SentencePipeline:
    """The pipeline of the first of ``directories`` holding ``modules.json``,
    or the first whose parent holds one naming it as the Transformer's
    subdirectory (``0_Transformer``); :data:`MINILM` when none does.

    Raises
    ------
    ValueError
        Naming the file and key: a module other than Transformer, Pooling and
        Normalize (a Dense projection, say), a Transformer in a subdirectory
        of the directory given (point at that subdirectory), a pooling other
        than mean, CLS or max (or several at once), a Pooling whose
        embedding dimension is not ``hidden_size``, a default prompt with
        ``include_prompt`` false, or a file that is not the JSON it should be.
    """
    found = _sentence_directory(directories)
    if found is None:
        return MINILM
    directory, transformer = found
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
    if (sub := _subdirectory(directory, modules[0])) is not None and transformer == directory:
        raise ValueError(f"{where}: the Transformer module is in {modules[0]['path']!r}; "
                         f"point the model directory at that subdirectory ({sub}), which "
                         "holds its config.json and weights")
    pooling_file = directory / str(modules[1].get("path", "")) / "config.json"
    pooling, include_prompt = _read_pooling(pooling_file, hidden_size)
    max_seq_length, lower_case = _read_settings(transformer)
    prompt = _read_prompt(directory)
    if prompt and not include_prompt:
        raise ValueError(f"{pooling_file}: include_prompt false (the prompt's tokens left out "
                         "of the pooling) is not supported; this library pools every token "
                         "of a sentence, its prompt's too")
    return SentencePipeline(pooling=pooling, normalize=kinds[-1] == "Normalize",
                            max_seq_length=max_seq_length, lower_case=lower_case,
                            source=directory, prompt=prompt)


def read_text_settings(directories: Sequence[Path]) -> tuple[int | None, bool]:
    """``(max_seq_length, do_lower_case)`` of the pipeline :func:`read_pipeline`
    would read, without its modules and pooling: what tokenising needs
    (all-MiniLM-L6-v2's 256 and False without ``modules.json``).

    Raises
    ------
    ValueError
        ``sentence_bert_config.json`` is not what it should be (naming the key).
    """
    found = _sentence_directory(directories)
    if found is None:
        return MINILM.max_seq_length, MINILM.lower_case
    return _read_settings(found[1])


def _subdirectory(root: Path, module: Any) -> Path | None:
    """Where a module of ``root/modules.json`` keeps its files when that is
    not ``root`` itself (``"path": "0_Transformer"``); None for no path, ""
    or "."."""
    path = module.get("path") if isinstance(module, dict) else None
    if path is None or (root / str(path)).resolve() == root.resolve():
        return None
    return root / str(path)


def transformer_subdirectory(root: Path) -> Path | None:
    """The subdirectory ``root/modules.json`` puts the Transformer's files in
    (sentence-transformers 2's ``0_Transformer``); None where it puts them
    in ``root``, or where there is no ``modules.json`` list to read."""
    try:
        modules = _read(root / "modules.json")
    except (ValueError, OSError):  # none, or not a model's: nothing to say
        return None
    return _subdirectory(root, modules[0]) if isinstance(modules, list) and modules else None


def _sentence_directory(directories: Sequence[Path]) -> tuple[Path, Path] | None:
    """``(root, transformer)``: the directory holding ``modules.json`` and the
    one holding the Transformer's files (sentence_bert_config.json): a
    directory given with ``modules.json`` is both; a directory given
    without it whose parent's ``modules.json`` puts the Transformer there
    (the older layout, ``0_Transformer/``) is the second."""
    for d in directories:
        if (d / "modules.json").is_file():
            return d, d
        # The parent as written (a symlinked 0_Transformer's), then its target's.
        for parent in dict.fromkeys((Path(os.path.abspath(d)).parent, d.resolve().parent)):
            sub = transformer_subdirectory(parent)  # (another's modules.json: not d's)
            if sub is not None and sub.resolve() == d.resolve():
                return parent, d
    return None


def _read_prompt(directory: Path) -> str:
    """The prompt ``config_sentence_transformers.json`` puts before every
    sentence (its ``default_prompt_name``'s in ``prompts``); "" for none."""
    path = directory / "config_sentence_transformers.json"
    if not path.is_file():
        return ""
    raw = _read(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    name = raw.get("default_prompt_name")
    if name is None:
        return ""
    prompts = raw.get("prompts") or {}
    if not isinstance(name, str) or not isinstance(prompts, dict):
        raise ValueError(f"{path}: default_prompt_name must be a prompt's name and prompts an "
                         f"object of them, got {name!r} and {prompts!r}")
    prompt = prompts.get(name)  # absent or null: no prompt, as sentence-transformers reads it
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"{path}: prompts[{name!r}] must be text, got {prompt!r}")
    return prompt or ""


def _read_settings(directory: Path) -> tuple[int | None, bool]:
    settings = directory / "sentence_bert_config.json"
    max_seq_length, lower_case = None, False
    if settings.is_file():
        raw = _read(settings)
        if not isinstance(raw, dict):
            raise ValueError(f"{settings}: expected a JSON object")
        if raw.get("max_seq_length") is not None:
            max_seq_length = raw["max_seq_length"]
        if max_seq_length is not None and (isinstance(max_seq_length, bool) or not isinstance(
                max_seq_length, int) or max_seq_length < 2):
            raise ValueError(f"{settings}: max_seq_length must be an integer >= 2 ([CLS] "
                             f"and [SEP]) or null, got {max_seq_length!r}")
        lower_case = raw.get("do_lower_case", False)
        if not isinstance(lower_case, bool):
            raise ValueError(f"{settings}: do_lower_case must be true or false, got "
                             f"{lower_case!r}")
    if max_seq_length is None:  # the tokenizer's, as sentence-transformers takes it
        max_seq_length = _model_max_length(directory)
    return max_seq_length, lower_case


def _model_max_length(directory: Path) -> int | None:
    """``tokenizer_config.json``'s ``model_max_length`` where it is a length
    (sentence-transformers 6 keeps ``max_seq_length`` there); None without
    one, or for transformers' "no limit"; ValueError naming it where it is
    no length (a string, a fraction, below 2)."""
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return None
    raw = _read(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    length = raw.get("model_max_length")
    if length is None:
        return None
    if isinstance(length, float) and length.is_integer():
        length = int(length)  # (transformers writes its "no limit" as 1e30)
    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise ValueError(f"{path}: model_max_length must be an integer >= 2 ([CLS] and [SEP]), "
                         f"got {raw['model_max_length']!r}")
    return None if length >= _NO_LIMIT else length


def _read(path: Path) -> Any:
    try:
        return parse_json(read_plain(path, MODEL_JSON_BYTES).decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None


def _read_pooling(path: Path, hidden_size: int) -> tuple[str, bool]:
    """``(pooling, include_prompt)`` of a Pooling's config.json, in either
    format: one boolean key per mode (sentence-transformers 2 to 5) or
    ``pooling_mode`` (6)."""
    if not path.is_file():
        raise ValueError(f"{path}: missing (modules.json puts the Pooling module there)")
    raw = _read(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object")
    for key in ("word_embedding_dimension", "embedding_dimension"):
        dimension = raw.get(key, hidden_size)
        if dimension != hidden_size:
            raise ValueError(f"{path}: {key} {dimension!r} is not config.json's hidden_size "
                             f"{hidden_size}")
    include_prompt = raw.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise ValueError(f"{path}: include_prompt must be true or false, got {include_prompt!r}")
    chosen = [key for key in (*_POOLING, *_UNSUPPORTED) if raw.get(key) is True]
    if "pooling_mode" in raw:  # over the per-mode keys, as sentence-transformers 6 reads it
        mode = raw["pooling_mode"]
        if not isinstance(mode, str) or mode not in _POOLING.values():
            raise ValueError(f"{path}: pooling pooling_mode {mode!r} is not supported; "
                             f"supported: pooling_mode "
                             f"{', '.join(map(repr, _POOLING.values()))}")
        return mode, include_prompt
    if len(chosen) != 1 or chosen[0] in _UNSUPPORTED:
        found = ", ".join(chosen) or "none"
        raise ValueError(f"{path}: pooling {found} is not supported; supported: exactly one "
                         f"of {', '.join(_POOLING)} set to true, or pooling_mode "
                         f"{', '.join(map(repr, _POOLING.values()))}")
    return _POOLING[chosen[0]], include_prompt


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
        with np.errstate(under="ignore"):  # squares of tiny components: zero, as they are
            norm = np.linalg.norm(pooled, axis=-1, keepdims=True)
        pooled = pooled / np.maximum(norm, 1e-12)
    return pooled
