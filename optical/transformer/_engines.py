"""Where a layer's products run: the digital reference, or the optical core.

A layer's forward pass is written once (``llama.py``, ``bert.py``) against an
engine that supplies the products and the rounding of the digital ops:

- :class:`ReferenceEngine` rounds every op's result to the model dtype
  (float32 GEMMs on dtype-representable operands, as torch does on the CPU
  for half types), its GEMMs cut into fixed pieces on one BLAS thread each
  (:func:`optical._gemm.cols_matmul`, :func:`~optical._gemm.stack_matmul`),
  so that its bits do not depend on the number of threads;
- :class:`OpticalEngine` runs each weight matmul through :func:`optical.matmul`
  (each weight programmed once per call, then freed) and the digital ops in
  float32; with ``mapping.attention == "optical"`` it also runs ``Q K^T`` and
  ``P V`` optically, programming ``K^T`` and ``V`` of every prompt and KV head
  as masks (dynamic operands, calibrated on their own values: each takes
  its tiles' mask loads).

Both record each product's output (for validation) and the optical engine
each product's :class:`optical.MatmulStats`. Both run each weight product
inside :func:`optical._memory.recycling`, so its large arrays (the fp16
reference's rounded weights; the normalised weights, transmissions and rail
differences of every programmed mask) reuse the previous product's memory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np

from optical._gemm import cols_matmul, stack_matmul
from optical._memory import empty_like, recycling
from optical._validation import check_plain_array, check_seed
from optical.config import OpticalConfig, check_config
from optical.core import MatmulStats, matmul
from optical.quant import calibration_needs, program
from optical.transformer.numerics import check_dtype, largest, range_problem, round_to

__all__ = ["InputsComplete", "InputsEngine", "LayerInputs", "LayerTrace", "OpticalEngine",
           "ReferenceEngine", "check_hidden", "check_weights", "derive_seed", "engine_for",
           "matmul_inputs", "sum_stats", "weight_matmuls"]


#: Bytes of attention scores a run that keeps no trace holds at once.
ATTENTION_BYTES = 64 * 2**20


def derive_seed(seed: int, *labels: object, bits: int = 63) -> int:
    """A seed in [0, 2**bits) that depends only on ``seed`` and ``labels``:
    every product of every layer gets its own noise. ``bits=32`` for the JAX
    backend, whose keys are 32-bit (the top 32 of the 63 bits)."""
    text = "/".join(str(v) for v in (seed, *labels)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> (64 - bits)


def check_hidden(h: object, hidden: int, dtype: str | None = None, name: str = "h") -> np.ndarray:
    """A layer input as (batch, tokens, hidden): float32, finite, right width,
    within the range of the reference ``dtype`` if one is given (fp16 rounds
    65520 and up to inf, and the reference would be inf and NaN),
    C-contiguous (a reduction along a strided axis sums in another order, so
    the layout alone would move the last bits). Errors call it ``name``."""
    if not isinstance(h, np.ndarray):
        raise TypeError(f"{name}: expected a numpy.ndarray, got {type(h).__name__}")
    check_plain_array(h, name)
    if h.dtype != np.float32:
        raise TypeError(f"{name}: dtype {h.dtype} is not supported; pass float32 hidden states "
                        "(nothing is cast silently)")
    if h.ndim not in (2, 3) or h.shape[-1] != hidden or 0 in h.shape:
        raise ValueError(f"{name}: expected shape (tokens, {hidden}) or (batch, tokens, "
                         f"{hidden}), got {h.shape}")
    if not np.isfinite(h).all():
        raise ValueError(f"{name}: contains NaN or infinite values")
    problem = None if dtype is None else range_problem(h, dtype, name)
    if problem is not None:
        raise ValueError(problem)
    h = np.ascontiguousarray(h)
    return h if h.ndim == 3 else h[None]



def check_weights(weights: object, shapes: Mapping[str, tuple[int, ...]],
                  index: int) -> None:
    """Raise naming the weight if ``weights`` (a layer built by hand: the
    public layer classes take any mapping) lacks one of ``shapes``' names or
    holds one that is not a float32 ndarray of its shape under config.json
    (TypeError if it is no mapping at all). A checkpoint's were checked as
    they were read; a caller's may not be."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"weights: expected a mapping of names to arrays, got "
                        f"{type(weights).__name__}")
    missing = [name for name in shapes if name not in weights]
    if missing:
        raise ValueError(f"layer {index}: missing weights {', '.join(missing)}")
    for name, shape in shapes.items():
        w = weights[name]
        if not isinstance(w, np.ndarray) or w.dtype != np.float32 or w.shape != shape:
            got = f"{w.dtype} {w.shape}" if isinstance(w, np.ndarray) else type(w).__name__
            raise ValueError(f"layer {index}: weight {name}: expected float32 of shape "
                             f"{shape} (config.json's), got {got}")

def sum_stats(parts: list[MatmulStats]) -> MatmulStats:
    """Stats of several matmuls of one kind run back to back (e.g. one per head):
    counts add; tile counts are those of the first matmul (of parts of
    different shapes, such as the prompts of a padded BERT batch, they
    describe none exactly); photons and clipping are pooled over all
    readouts and conversions (DAC clipping over the DAC conversions)."""
    first = parts[0]
    counts = {f.name: sum(getattr(p, f.name) for p in parts)
              for f in dataclasses.fields(MatmulStats)}
    for name in ("k_tiles", "n_tiles", "input_passes"):
        counts[name] = getattr(first, name)
    readouts, adc = counts["detector_readouts"], counts["adc_conversions"]
    counts["mean_photoelectrons"] = counts["detected_photons"] / readouts if readouts else 0.0
    clipped = sum(p.clipped_fraction * p.adc_conversions for p in parts)
    counts["clipped_fraction"] = clipped / adc if adc else 0.0
    dac = counts["dac_conversions"]
    dac_clipped = sum(p.dac_clipped_fraction * p.dac_conversions for p in parts)
    counts["dac_clipped_fraction"] = dac_clipped / dac if dac else 0.0
    # Digital share of the logical MACs (tokens * K * N), pooled over the parts.
    logical = sum(p.digital_macs / p.digital_mac_fraction if p.digital_mac_fraction else p.macs
                  for p in parts)
    counts["digital_mac_fraction"] = counts["digital_macs"] / logical if logical else 0.0
    return MatmulStats(**counts)


class LayerInputs(dict):
    """The input rows of a layer's weight matmuls by name (a dict), with the
    index of the layer they were taken from (``layer``): what
    :meth:`~optical.transformer.LlamaLayer.matmul_inputs` and a trace's
    ``inputs`` give, and what a layer's ``calibration=`` refuses from another
    layer (whose inputs have the same widths: layer 0's held-out rows took
    layer 1's down_proj from 17.9 to 1.5 dB, silently). Its ``copy()``, a
    ``copy.copy`` and a pickle keep the layer; a plain dict of the same rows
    (``dict(inputs)``, ``{**inputs}``, ``inputs | other``) is taken as the
    caller's own choice."""

    def __init__(self, rows: Mapping[str, np.ndarray], *, layer: int | None) -> None:
        super().__init__(rows)
        self.layer = layer

    def copy(self) -> LayerInputs:
        """A shallow copy naming the same layer (``dict.copy`` gives a dict)."""
        return LayerInputs(self, layer=self.layer)


@dataclasses.dataclass(frozen=True)
class LayerTrace:
    """One run of a layer.

    Attributes
    ----------
    output : ndarray, float32
        The layer's output, shaped like its input.
    products : dict of str to ndarray
        The output of every product, in execution order (weight matmuls as
        (rows, out_features), the real tokens' rows only when a padding mask
        leaves some out; ``attention.scores`` after scaling, with masked
        entries set to 0; ``attention.values`` as (batch, heads, tokens, head_dim)).
    stats : dict of str to MatmulStats
        What each optical product did on the hardware (empty for a reference run).
    inputs : LayerInputs (a dict of str to ndarray)
        The input rows of every weight matmul, as it received them (the real
        tokens' only: padding never reaches a product), naming the layer.
    operands : dict of str to (ndarray, ndarray, ndarray)
        For each attention product run on the optical core: its operands
        ``a`` (batch, kv_heads, M, k) and ``b`` (batch, kv_heads, k, n) as it
        received them, and its raw output ``a @ b`` (before the scores'
        scaling, rounding and masking): its own error, as ``inputs`` gives
        the weight matmuls'.
    program_s : float, s
        Wall time spent programming weights onto the mask (optical runs; 0
        for a reference run), part of the run's time.
    """

    output: np.ndarray
    products: dict[str, np.ndarray]
    stats: dict[str, MatmulStats]
    inputs: LayerInputs = dataclasses.field(
        default_factory=lambda: LayerInputs({}, layer=None))
    operands: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = dataclasses.field(
        default_factory=dict)
    program_s: float = 0.0


class InputsComplete(Exception):
    """Raised by a :class:`ReferenceEngine` given ``stop_after`` once every
    one of those weight matmuls has received its input."""


#: The products whose rows a norm of the layer takes next (with the residual
#: stream, far smaller in any case that overflows): Llama's o_proj (the
#: post-attention RMSNorm), BERT's attention.output and output (its two
#: LayerNorms).
NORMED = ("o_proj", "attention.output", "output")


def largest_row_square_sum(value: np.ndarray) -> float:
    """The largest sum of squares over a row (the last axis) of ``value``, in
    float64; inf where one is not finite. A norm sums these in float32: past
    float32's largest it overflows, and the row comes out as zeros (RMSNorm)
    or as the bias (LayerNorm)."""
    rows = np.asarray(value)
    rows = rows.reshape(-1, rows.shape[-1])
    worst = 0.0
    for start in range(0, rows.shape[0], 1024):  # float64 a block of rows at a time
        block = rows[start:start + 1024].astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            sums = np.einsum("ij,ij->i", block, block)
        if not np.all(np.isfinite(sums)):
            return math.inf
        worst = max(worst, float(np.max(sums, initial=0.0)))
    return worst


def norm_overflows(row_sums: Mapping[str, float]) -> dict[str, float]:
    """Of ``{product: largest row square sum}``, those past float32's largest."""
    return {name: worst for name, worst in row_sums.items() if not worst <= largest("float32")}


class ReferenceEngine:
    """Digital products, every op's result rounded to ``dtype``.

    ``stop_after``: names of weight matmuls; once the last of them has
    received its input, :meth:`linear` raises :class:`InputsComplete`
    instead of computing it (see :func:`matmul_inputs`).

    ``keep`` (an attribute, True by default): whether :meth:`record` keeps
    each product, and the engine its inputs and operands, for a
    :meth:`trace`. A run that reads no trace (BERT's ``encode``) sets it
    False: only each product's peak is kept, and a
    padded batch's attention runs prompts of one length a few at a time
    (:meth:`attention_prompts`): a fraction of the memory. (Traced or not,
    each prompt's digital attention runs up to its last real token:
    :meth:`attention_by_length`.)
    """

    def __init__(self, dtype: str, stop_after: Collection[str] = ()) -> None:
        self.dtype = dtype
        self.products: dict[str, np.ndarray] = {}
        self.stats: dict[str, MatmulStats] = {}
        self.inputs: dict[str, np.ndarray] = {}
        self.operands: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self.pending = set(stop_after)
        self.layer: int | None = None  # the layer's index, where engine_for knows it
        self.program_s = 0.0  # time spent programming masks (OpticalEngine)
        self.keep = True
        self.peaks: dict[str, float] = {}  # max |product| where not kept (NaN propagates)
        self.row_sums: dict[str, float] = {}  # NORMED products' largest, where not kept

    def round(self, x: np.ndarray) -> np.ndarray:
        return round_to(x, self.dtype)

    def record(self, name: str, value: np.ndarray) -> None:
        if self.keep:
            self.products[name] = value
        else:
            peak = np.max(np.abs(value), initial=0.0)
            self.peaks[name] = float(np.maximum(peak, self.peaks.get(name, 0.0)))
            if name in NORMED:
                self.row_sums[name] = max(largest_row_square_sum(value),
                                          self.row_sums.get(name, 0.0))

    def norm_row_sums(self) -> dict[str, float]:
        """The largest row square sum of each product a norm takes next."""
        return {name: largest_row_square_sum(value) for name, value in self.products.items()
                if name in NORMED} | self.row_sums

    def attention_by_length(self) -> bool:
        """Whether a padded batch's attention runs each prompt over its own
        tokens, its padded tail cut (BERT's ``_attention_by_length``): with
        digital products (each entry its own dot product; the softmax gives
        the cut keys no weight), traced or not, so a trace (and
        ``matmul_inputs``, a held-out calibration's recipe) has the bits of
        an untraced run."""
        return True

    def attention_prompts(self, batch: int, prompt_bytes: int) -> int:
        """How many of a batch's prompts to run attention on at once, one
        prompt's score matrices taking ``prompt_bytes``: the whole batch where
        a trace keeps its products, else as many as fit
        :data:`ATTENTION_BYTES` (at least one). Each prompt's products are
        their own matrices, so the bits do not depend on it."""
        if self.keep:
            return batch
        return max(1, min(batch, ATTENTION_BYTES // max(1, prompt_bytes)))

    def trace(self, output: np.ndarray) -> LayerTrace:
        return LayerTrace(output, self.products, self.stats,
                          LayerInputs(self.inputs, layer=self.layer), self.operands,
                          self.program_s)

    def linear(self, name: str, x: np.ndarray, w: np.ndarray,
               bias: np.ndarray | None = None) -> np.ndarray:
        """``x @ w.T (+ bias)``, rounded once (torch's addmm)."""
        if self.keep:
            self.inputs[name] = x
        if self.pending:
            self.pending.discard(name)
            if not self.pending:
                raise InputsComplete
        with recycling():  # open until the GEMM is done with the rounded weight, so the
            y = cols_matmul(x, self._round_weight(w).T)  # pool's hold timer starts after
        if bias is not None:
            y += self.round(bias)
        y = self.round(y)
        self.record(name, y)
        return y

    def _round_weight(self, w: np.ndarray) -> np.ndarray:
        """``round(w)`` into a recycled buffer (the weights themselves in float32)."""
        if self.dtype == "float32" or not (w.flags.c_contiguous or w.flags.f_contiguous):
            return self.round(w)
        with recycling():
            out = empty_like(w)
        return round_to(w, self.dtype, out=out)

    def scores(self, q: np.ndarray, k: np.ndarray,
               mask: np.ndarray | None = None) -> np.ndarray:
        """``q @ k^T`` per (prompt, KV head): (B, KV, G*T, d) x (B, KV, T, d) -> (B, KV, G*T, T).

        ``mask`` (B, T): the real tokens of a padded batch (G = 1), the only
        ones an optical engine sends to the core (digital products do not
        mix rows: each entry is its own dot product)."""
        return self.round(stack_matmul(q, k.swapaxes(-1, -2)))

    def values(self, p: np.ndarray, v: np.ndarray,
               mask: np.ndarray | None = None) -> np.ndarray:
        """``p @ v`` per (prompt, KV head): (B, KV, G*T, T) x (B, KV, T, d) -> (B, KV, G*T, d);
        ``mask`` as in :meth:`scores`."""
        return self.round(stack_matmul(p, v))


# What the layer passes each product itself, so an option may not set it.
_SET_BY_LAYER = {
    "x": "the layer gives each product its input",
    "w": "the layer gives each product its weights",
    "config": "the layer's config is every product's",
    "seed": "each product's seed derives from the call's",
    "return_stats": "the layer keeps every product's stats",
    "oracle": "the layer says which products calibrate on their own inputs",
}


# The keywords of optical.program and optical.matmul, read once from the
# functions themselves (not at each call: tests wrap those names here).
_KEYWORDS = {f.__name__: tuple(inspect.signature(f).parameters) for f in (program, matmul)}


def _options(options: Any, name: str, callee: str) -> dict[str, Any]:
    """A copy of an optional mapping of keyword arguments for ``callee``
    (``"program"`` or ``"matmul"``, optical's): TypeError names the argument
    when it is not a mapping of str keys or a key is none of ``callee``'s
    keywords (naming those it takes), ValueError when it sets a key the
    layer sets itself."""
    if options is None:
        return {}
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise TypeError(f"{name}: expected a mapping of str keys (a dict), got "
                        f"{type(options).__name__}")
    params = _KEYWORDS[callee]
    taken = [k for k in options if k in _SET_BY_LAYER and k in params]
    if taken:
        why = "; ".join(_SET_BY_LAYER[k] for k in taken)
        raise ValueError(f"{name}: {', '.join(map(repr, taken))} "
                         f"{'is' if len(taken) == 1 else 'are'} set by the layer itself "
                         f"({why}); remove {'it' if len(taken) == 1 else 'them'}")
    valid = [k for k in params if k not in _SET_BY_LAYER]
    unknown = [k for k in options if k not in params]
    if unknown:
        raise TypeError(f"{name}: {', '.join(map(repr, unknown))} "
                        f"{'is not an option' if len(unknown) == 1 else 'are not options'} of "
                        f"optical.{callee}; valid: {', '.join(valid)}")
    return dict(options)


def check_options(program_options: Any, matmul_options: Any, *,
                  calibrated_by: str | None = None) -> None:
    """Refuse options the optical layer cannot pass on, before any work:
    what :class:`OpticalEngine` checks when it is made. ``calibrated_by``
    names what else calibrates the weight matmuls in the call (a layer's
    ``calibration=``, BERT's ``calibration_ids``, validate's held-out
    tokens): a ``program_options["calibration"]`` beside it, which would
    calibrate every product in its place, is refused naming both."""
    program_options = _options(program_options, "program_options", "program")
    _options(matmul_options, "matmul_options", "matmul")
    if calibrated_by is not None and "calibration" in program_options:
        raise ValueError(f"program_options: 'calibration' given beside {calibrated_by}, which "
                         "calibrates every weight matmul itself; remove it from "
                         "program_options")


class OpticalEngine(ReferenceEngine):
    """Products on the optical core, digital ops in float32.

    Parameters
    ----------
    config : OpticalConfig
    seed : int
        The call's seed; each product gets ``derive_seed(seed, layer, name, ...)``
        (32 bits of it with ``matmul_options={"backend": "jax"}``).
    layer : int
        Layer index, part of every derived seed.
    program_options, matmul_options : mapping, optional
        Passed to every :func:`optical.program` / :func:`optical.matmul` call:
        the place where engine options (e.g. a backend) reach the layer's matmuls.
    calibration : mapping of str to ndarray, optional
        Held-out input rows of each weight matmul (by product name), used when
        the config needs calibration (:func:`optical.quant.calibration_needs`).
        A product without them (the attention products, whose operands are
        activations) is calibrated on its own inputs: an oracle.
    progress : callable, optional
        Called with a product's name as it starts on the core, once per
        product (a progress bar's hook: the bar names what is running).
    """

    def __init__(self, config: OpticalConfig, seed: int, layer: int, *,
                 program_options: Mapping[str, Any] | None = None,
                 matmul_options: Mapping[str, Any] | None = None,
                 calibration: Mapping[str, np.ndarray] | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        super().__init__("float32")
        check_config(config)
        self.config = config
        self.seed = seed
        self.layer = layer
        self.program_options = _options(program_options, "program_options", "program")
        self.matmul_options = _options(matmul_options, "matmul_options", "matmul")
        self.calibration = dict(calibration or {})  # checked by engine_for
        self.progress = progress

    def _starting(self, name: str) -> None:
        if self.progress is not None:
            self.progress(name)

    def _overflow_note(self) -> str:
        """Why a product's own input may be all zero: the rows of a product a
        norm takes next sum their squares past float32's largest, and the
        norm gives zeros there."""
        over = norm_overflows(self.norm_row_sums())
        if not over:
            return ""
        name, worst = next(iter(over.items()))
        return (f" (an earlier product overflowed: {name}'s rows' squares sum to {worst:.3g}, "
                f"past float32's largest, {largest('float32'):.3g}, so the norm "
                "after it gives zeros; lower the noise, e.g. detector.read_noise_electrons, "
                "or check the input)")

    def _non_finite_note(self) -> str:
        """Where a product's input that is not finite came from: the first
        earlier product that gave inf or NaN (its output overflowed float32,
        on the core or, fed such values, in the digital attention), with what
        to change."""
        peaks = {name: float(np.max(np.abs(value), initial=0.0))
                 for name, value in self.products.items()} | self.peaks
        first = next((name for name, peak in peaks.items() if not math.isfinite(peak)), None)
        where = f"{first} gave inf or NaN" if first else "an earlier step gave inf or NaN"
        return (f": {where} (its output overflowed float32); lower the noise (e.g. "
                "detector.read_noise_electrons) or check the input")

    def _matmul(self, x: np.ndarray, w_in_out: np.ndarray, *labels: object) -> tuple:
        options = dict(self.program_options)
        source = None  # what calibrates this product, named in its errors
        name = str(labels[0])
        if "calibration" not in options and name in self.calibration:
            # Given, it is checked even where the config does not read it.
            source = f"calibration[{name!r}]"
            options["calibration"] = self.calibration[name]
        elif "calibration" not in options and calibration_needs(self.config):
            source = f"{name}'s own input (the oracle: no calibration= entry for it)"
            options["calibration"], options["oracle"] = x, True
        elif "calibration" in options:
            source = (f"program_options['calibration'] (given to every product; {name} "
                      f"takes inputs of {w_in_out.shape[0]} features)")
        with recycling():
            # No copy of a transposed weight: program() reads it in place.
            start = time.perf_counter()
            try:
                programmed = program(w_in_out, self.config, **options)
            except (ValueError, TypeError) as err:
                text = str(err)
                if source is None or not text.startswith("calibration: "):
                    raise
                text = f"{source}: {text.removeprefix('calibration: ')}"
                if options["calibration"] is x and not np.any(x):
                    text += self._overflow_note()
                elif options["calibration"] is x and "NaN or infinite" in text:
                    text += self._non_finite_note()
                raise type(err)(text) from None
            self.program_s += time.perf_counter() - start
            bits = 32 if self.matmul_options.get("backend") == "jax" else 63
            try:
                y, stats = matmul(x, programmed, self.config,
                                  seed=derive_seed(self.seed, self.layer, *labels, bits=bits),
                                  return_stats=True, **self.matmul_options)
            except ValueError as err:  # "x: contains 512 NaN or infinite value(s)"
                if not str(err).startswith("x: contains"):
                    raise
                raise ValueError(f"{name}: its input {str(err).removeprefix('x: ')}"
                                 f"{self._non_finite_note()}") from None
            # The JAX backend answers with a JAX array: the layer runs on numpy
            # (a writable copy: its output is added to in place).
            return (y if isinstance(y, np.ndarray) else np.array(y)), stats

    def linear(self, name: str, x: np.ndarray, w: np.ndarray,
               bias: np.ndarray | None = None) -> np.ndarray:
        self._starting(name)
        if self.keep:
            self.inputs[name] = x
        y, stats = self._matmul(x, w.T, name)  # HF stores [out, in]: program W.T
        if bias is not None:
            y += bias
        self.stats[name] = stats
        self.record(name, y)
        return y

    def _per_head(self, name: str, a: np.ndarray, b: np.ndarray, transpose_b: bool,
                  mask: np.ndarray | None) -> np.ndarray:
        """``a @ b`` (``b^T``) of every (prompt, KV head) on the core. With a
        padding ``mask`` (one query row per token), only a prompt's real
        tokens go: rows of ``a``, and the rows of ``b`` (keys, values) and
        columns of ``a`` (the scores' keys) they meet; the rest stays 0."""
        self._starting(name)
        batch, kv_heads = a.shape[:2]
        out = np.zeros((batch, kv_heads, a.shape[2], b.shape[2] if transpose_b else b.shape[3]),
                       dtype=np.float32)
        if mask is not None:  # what each prompt sent to the core, for the local SQNR
            rows = mask[:, None, :, None]
            a = np.where(rows, a, np.float32(0))
            if not transpose_b:  # the scores' padded key columns (probabilities 0 already)
                a = np.where(mask[:, None, None, :], a, np.float32(0))
            b = np.where(rows, b, np.float32(0))
        parts = []
        for i in range(batch):
            real = slice(None) if mask is None else np.flatnonzero(mask[i])
            for j in range(kv_heads):
                a_ij = a[i, j][real]
                if not transpose_b and mask is not None:
                    a_ij = a_ij[:, real]
                operand = (b[i, j][real].T if transpose_b else b[i, j][real])
                y, stats = self._matmul(np.ascontiguousarray(a_ij), operand, name, i, j)
                if mask is None:
                    out[i, j] = y
                elif transpose_b:
                    out[i, j][np.ix_(real, real)] = y
                else:
                    out[i, j][real] = y
                parts.append(stats)
        self.stats[name] = sum_stats(parts)
        if self.keep:  # for a trace's local SQNR
            self.operands[name] = (a, b.swapaxes(-1, -2) if transpose_b else b, out)
        return out

    def attention_by_length(self) -> bool:
        """Never with optical attention: its products' seeds and stats are
        keyed by each prompt's place in the batch and the batch's shape."""
        return self.config.mapping.attention == "digital"

    def attention_prompts(self, batch: int, prompt_bytes: int) -> int:
        """The whole batch with optical attention (its products' seeds and
        stats are keyed by each prompt's place in it)."""
        if self.config.mapping.attention == "optical":
            return batch
        return super().attention_prompts(batch, prompt_bytes)

    def scores(self, q: np.ndarray, k: np.ndarray,
               mask: np.ndarray | None = None) -> np.ndarray:
        if self.config.mapping.attention == "digital":
            return stack_matmul(q, k.swapaxes(-1, -2))
        return self._per_head("attention.scores", q, k, transpose_b=True, mask=_padding(mask))

    def values(self, p: np.ndarray, v: np.ndarray,
               mask: np.ndarray | None = None) -> np.ndarray:
        if self.config.mapping.attention == "digital":
            return stack_matmul(p, v)
        return self._per_head("attention.values", p, v, transpose_b=False, mask=_padding(mask))


def _padding(mask: np.ndarray | None) -> np.ndarray | None:
    """``mask`` when it leaves out a token (None: every token is real)."""
    return None if mask is None or mask.all() else mask


def weight_matmuls(weights: Mapping[str, np.ndarray]) -> list[str]:
    """Names of a layer's weight matmuls: its 2-D weights (the engines'
    ``linear`` products), in the layer's order."""
    return [name for name, w in weights.items() if w.ndim == 2]


class InputsEngine(ReferenceEngine):
    """The float32 reference keeping each weight matmul's input rows and no
    product: a held-out calibration run through every layer (BERT's
    ``encode``), attention a few prompts at a time as an untraced run takes
    it. (:func:`matmul_inputs` keeps a whole trace's, for one layer, and
    stops before its last product.)"""

    def __init__(self) -> None:
        super().__init__("float32")
        self.keep = False

    def linear(self, name: str, x: np.ndarray, w: np.ndarray,
               bias: np.ndarray | None = None) -> np.ndarray:
        self.inputs[name] = x
        return super().linear(name, x, w, bias)


def matmul_inputs(forward: Callable[[ReferenceEngine], object], names: Collection[str],
                  dtype: str, layer: int) -> LayerInputs:
    """The input rows of the weight matmuls ``names`` in a reference run in
    ``dtype``: ``forward(engine)`` runs the layer and is stopped once the
    last of them has its input (that product, and what follows it, is not
    computed). The inputs equal a full ``trace()``'s (a layer's), bit for bit,
    and name the layer (index ``layer``) they came from."""
    engine = ReferenceEngine(check_dtype(dtype), stop_after=names)
    if not engine.pending:
        raise ValueError("names: no weight matmul named")
    try:
        forward(engine)
    except InputsComplete:
        return LayerInputs(engine.inputs, layer=layer)
    missing = ", ".join(sorted(engine.pending))
    raise ValueError(f"names: the layer has no weight matmul {missing}")


def engine_for(dtype: str | None, config: OpticalConfig | None, seed: int, layer: int, *,
               program_options: Mapping[str, Any] | None = None,
               matmul_options: Mapping[str, Any] | None = None,
               calibration: Mapping[str, np.ndarray] | None = None,
               weights: Mapping[str, np.ndarray] | None = None,
               progress: Callable[[str], None] | None = None) -> ReferenceEngine:
    """The engine of a layer's ``trace``: the reference in ``dtype``, or the
    optical core under ``config`` (exactly one of the two is given); the
    options go to :class:`OpticalEngine`. ``calibration`` is checked against
    the layer's ``weights``: a name that is not one of its weight matmuls
    would otherwise leave that product calibrated on its own inputs, and so
    would a weight matmul missing from it under a config that calibrates
    (both refused, as is a ``program_options["calibration"]`` beside it:
    :func:`check_options`)."""
    if (dtype is None) == (config is None):
        raise ValueError("give exactly one of dtype (reference) or config (optical)")
    if calibration is not None:
        if not isinstance(calibration, Mapping):
            raise TypeError("calibration: expected a mapping of weight-matmul names to input "
                            f"rows, got {type(calibration).__name__}")
        names = weight_matmuls(weights or {})
        unknown = [repr(k) for k in calibration if k not in names]
        if unknown:
            raise ValueError(f"calibration: no weight matmul {', '.join(unknown)}; "
                             f"the layer's are {', '.join(names)}")
        if isinstance(calibration, LayerInputs) and calibration.layer not in (None, layer):
            raise ValueError(f"calibration: the inputs of layer {calibration.layer}, given to "
                             f"layer {layer}; each layer calibrates on its own "
                             f"(layer({layer}).matmul_inputs(held_out)). To use them anyway, "
                             "pass them as a plain dict")
        check_options(program_options, matmul_options,
                      calibrated_by="calibration= (each weight matmul's held-out rows)")
        missing = [k for k in names if k not in calibration]
        if missing and isinstance(config, OpticalConfig) and calibration_needs(config):
            raise ValueError(f"calibration: no entry for {', '.join(missing)}, which the "
                             "config calibrates: each would be calibrated on its own input "
                             "(the oracle) beside held-out ones. Give every weight matmul's "
                             "rows (layer.matmul_inputs(held_out)), or no calibration= for "
                             "the oracle throughout")
    if config is None:
        engine = ReferenceEngine(check_dtype(dtype))
        engine.layer = layer
        return engine
    return OpticalEngine(config, check_seed(seed), layer, program_options=program_options,
                         matmul_options=matmul_options, calibration=calibration,
                         progress=progress)
