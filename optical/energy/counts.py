"""Digital work and memory traffic of a prefill: the one place that counts them.

:class:`optical.Schedule` counts what the optics do (passes, weight loads,
conversions, readouts). Everything around the optics is counted here, from
the same :class:`~optical.transformer.ModelSpec` shapes and the same
schedules, so that the optical machine and the GPU baseline are charged for
the same model.

Counting conventions (``R`` rows = batch x tokens, ``T`` context positions,
``H`` hidden, ``I`` intermediate, ``q``/``kv`` query/key widths, ``V`` vocabulary):

- optical matmul, digital side (:func:`matmul_work`): 3 operations per ADC
  conversion (decoding gain, offset, adding into the partial sum), 1 per
  (row, K-tile, column) for the weight scale, 1 per output for the input
  scale, 2 per input element (abs-max, normalise). Memory: inputs read once
  per N-tile pass, an fp32 partial sum read and written per ADC conversion,
  outputs written once.
- mask data (:func:`mask_bytes`): every programmed pixel of every weight
  load (the matrix's K x N weights, so an edge tile counts only the pixels
  it uses), ``mask.bits`` per pixel per weight rail; from DRAM for weights,
  from SRAM for activations loaded as masks (optical attention).
- norms: RMSNorm 4 H operations per row (LayerNorm 8 H), two per layer;
  read and write H.
- rope (Llama): 3 operations per element of q and k; read and write them.
- attention products (when digital): 4 T q per row (``Q K^T`` and ``P V``,
  2 operations per MAC); Q read, O written, K and V read once per sequence.
- softmax: 6 operations per score (scale, max, subtract, exp, sum, divide);
  scores read and probabilities written, and with digital products also the
  scores written and the probabilities read.
- MLP activation: SiLU-gated 5 per intermediate element (read gate and up,
  write the product); GELU 8 (read and write).
- residual adds: 2 H per row; read two, write one, twice.
- biases (BERT): one add per output of every linear.
- embedding lookup: R H weight bytes from DRAM. BERT adds position and
  token-type rows (T H and H bytes from DRAM per batch: the same positions
  for every prompt; 2 H operations per row) and a LayerNorm (8 H per row,
  read and write H).
- LM head (Llama; each request's last position, which yields the first
  token): final norm 4 H + 2 V H per request; V H weight bytes from DRAM per
  batch. Pooling (BERT): H T + 3 H per request.

The attention products count the full ``T x T`` product, as
:func:`optical.transformer.layer_schedule` does (the causal mask is not
exploited). Activations are bf16 (2 bytes), partial sums fp32 (4 bytes),
weights in memory bf16 (2 bytes) except mask data, which is stored as the
mask's levels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from optical._validation import check_positive_int
from optical.config import OpticalConfig
from optical.core import Schedule
from optical.physics import encoding
from optical.quant import adc_rails
from optical.transformer.spec import ModelSpec

__all__ = [
    "ACCUMULATOR_BYTES",
    "ACTIVATION_BYTES",
    "ACTIVATION_MASKS",
    "WEIGHT_BYTES",
    "MatmulDims",
    "Work",
    "head_work",
    "layer_work",
    "mask_bytes",
    "matmul_dims",
    "matmul_work",
    "sum_work",
    "weight_count",
]

ACTIVATION_BYTES = 2  # bf16 activations, the checkpoints' dtype
ACCUMULATOR_BYTES = 4  # fp32 partial sums of the K-tiles
WEIGHT_BYTES = 2  # bf16 weights in memory

#: Schedules whose "weights" are activations (loaded from SRAM, per request).
ACTIVATION_MASKS = ("attention.scores", "attention.values")

# Operations per element, as documented in the module's table.
_OPS_PER_ADC_CONVERSION = 3
_OPS_PER_INPUT = 2
_NORM_OPS = {"llama": 4, "bert": 8}
_MLP_OPS = {"llama": 5, "bert": 8}
_ROPE_OPS = 3
_SOFTMAX_OPS = 6


@dataclasses.dataclass(frozen=True)
class Work:
    """Digital operations and memory traffic.

    Attributes
    ----------
    ops : int, operations
    sram_bytes : int, bytes
        On-chip traffic (activations, partial sums).
    dram_bytes : int, bytes
        Off-chip traffic (weights, embeddings).
    """

    ops: int = 0
    sram_bytes: int = 0
    dram_bytes: int = 0

    def __add__(self, other: Work) -> Work:
        return Work(self.ops + other.ops, self.sram_bytes + other.sram_bytes,
                    self.dram_bytes + other.dram_bytes)

    def __mul__(self, factor: int) -> Work:
        return Work(self.ops * factor, self.sram_bytes * factor, self.dram_bytes * factor)

    __rmul__ = __mul__

    def to_dict(self) -> dict[str, int]:
        """Every count by its field name."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class MatmulDims:
    """The logical product behind a schedule: ``matrices`` products of
    (rows / matrices, k) @ (k, n), as recovered from its counts."""

    rows: int
    k: int
    n: int
    matrices: int


def _exact(numerator: int, denominator: int, what: str) -> int:
    if denominator == 0 or numerator % denominator:
        raise ValueError(f"schedule: {what} is not consistent with this config (was it "
                         "counted under another core size or encoding?)")
    return numerator // denominator


def matmul_dims(s: Schedule, config: OpticalConfig) -> MatmulDims:
    """Recover rows, K, N and the number of distinct matrices from a schedule.

    Raises
    ------
    ValueError
        If the counts cannot come from ``config`` (another core size or encoding).
    """
    n_in = encoding.n_rails(config.encoding.inputs)
    n_adc = adc_rails(config).shape[0]
    if s.input_passes != n_in:
        raise ValueError(f"schedule: input_passes = {s.input_passes} but encoding.inputs "
                         f"= {config.encoding.inputs!r} makes {n_in}")
    if s.tokens == 0:
        return MatmulDims(0, 0, 0, 0)
    k = _exact(s.dac_conversions, s.tokens * n_in * s.n_tiles, "dac_conversions")
    n = _exact(s.adc_conversions, s.tokens * s.k_tiles * n_in * n_adc, "adc_conversions")
    matrices = _exact(s.weight_loads, s.k_tiles * s.n_tiles, "weight_loads")
    if -(-k // config.core.inputs) != s.k_tiles or -(-n // config.core.outputs) != s.n_tiles:
        raise ValueError(f"schedule: {s.k_tiles} x {s.n_tiles} tiles do not match a "
                         f"{k} x {n} product on a {config.core.inputs} x "
                         f"{config.core.outputs} core")
    return MatmulDims(s.tokens, k, n, matrices)


def matmul_work(s: Schedule, config: OpticalConfig) -> Work:
    """The digital side of one optical matmul: decoding every ADC conversion,
    rescaling and accumulating the K-tiles' partial sums, scaling the inputs."""
    d = matmul_dims(s, config)
    ops = (_OPS_PER_ADC_CONVERSION * s.adc_conversions + d.rows * s.k_tiles * d.n
           + d.rows * d.n + _OPS_PER_INPUT * d.rows * d.k)
    sram = (s.dac_conversions // s.input_passes * ACTIVATION_BYTES
            + s.adc_conversions * 2 * ACCUMULATOR_BYTES + d.rows * d.n * ACTIVATION_BYTES)
    return Work(ops=ops, sram_bytes=sram)


def mask_bytes(s: Schedule, config: OpticalConfig) -> int:
    """Bytes written to the mask over all of a schedule's weight loads.

    Raises
    ------
    ValueError
        If ``mask.bits`` is None: continuous levels have no finite size.
    """
    check_mask_bits(config)
    bits = config.mask.bits
    d = matmul_dims(s, config)
    pixels = d.matrices * d.k * d.n * encoding.n_rails(config.encoding.weights)
    return -(-pixels * bits // 8)


def check_mask_bits(config: OpticalConfig) -> None:
    """ValueError if ``mask.bits`` is None: continuous levels have no finite size."""
    if config.mask.bits is None:
        raise ValueError("mask.bits is None: continuous mask levels have no finite storage "
                         "cost; set mask.bits to count the weight memory traffic")


def _check_spec(spec: object) -> None:
    if not isinstance(spec, ModelSpec):
        raise TypeError(f"spec: expected a ModelSpec (optical.transformer.read_spec(path) or "
                        f"a loaded model's .spec), got {type(spec).__name__}")


def _check_counts(tokens: int, batch: int,
                  names: tuple[str, str] = ("tokens", "batch")) -> tuple[int, int]:
    """Both counts as Python ints (a numpy integer's fixed width would wrap
    the products of the counts: np.int32(512) tokens of a small model's
    FLOPs already pass 2**31), or ValueError naming the one that is not a
    positive integer."""
    return (check_positive_int(tokens, names[0]), check_positive_int(batch, names[1]))


def layer_work(spec: ModelSpec, tokens: int, *, batch: int = 1,
               attention: str = "digital", context: int | None = None) -> dict[str, Work]:
    """Digital work of one layer outside its weight matmuls.

    Parameters
    ----------
    spec : ModelSpec
    tokens, batch : int
        ``batch`` sequences of ``tokens`` new rows each.
    attention : {"digital", "optical"}
        With "optical" the attention products are optical matmuls (counted
        by their schedules and :func:`matmul_work`), so they are left out here.
    context : int, optional
        Positions each row attends to; default ``tokens`` (a prefill). A
        decode step is ``tokens=1, context=positions so far``.

    Returns
    -------
    dict of str to Work
        Keyed by the items of the module's table.
    """
    tokens, batch = _check_counts(tokens, batch)
    if attention not in ("digital", "optical"):
        raise ValueError(f"attention: {attention!r} is not valid; valid: 'digital', 'optical'")
    context = tokens if context is None else context
    context, _ = _check_counts(context, 1, ("context", "batch"))
    rows, arch = batch * tokens, spec.architecture
    h, inter = spec.hidden_size, spec.intermediate_size
    q = spec.num_heads * spec.head_dim
    kv = spec.num_kv_heads * spec.head_dim
    scores = rows * spec.num_heads * context
    act = ACTIVATION_BYTES
    work = {"norms": Work(ops=2 * _NORM_OPS[arch] * h * rows, sram_bytes=2 * 2 * h * rows * act)}
    if arch == "llama":
        work["rope"] = Work(ops=_ROPE_OPS * (q + kv) * rows, sram_bytes=2 * (q + kv) * rows * act)
    if attention == "digital":
        work["attention.products"] = Work(
            ops=2 * 2 * context * q * rows,
            sram_bytes=(2 * q * rows + 2 * kv * context * batch) * act)
    # Scores in and probabilities out; with digital products also their writing
    # of the scores and reading of the probabilities (the optical products'
    # outputs and inputs are counted by matmul_work).
    passes = 4 if attention == "digital" else 2
    work["softmax"] = Work(ops=_SOFTMAX_OPS * scores, sram_bytes=passes * scores * act)
    mlp_reads = 2 if arch == "llama" else 1
    work["mlp_activation"] = Work(ops=_MLP_OPS[arch] * inter * rows,
                                  sram_bytes=(mlp_reads + 1) * inter * rows * act)
    work["residual"] = Work(ops=2 * h * rows, sram_bytes=2 * 3 * h * rows * act)
    if arch == "bert":
        outputs = sum(s.out_features for s in spec.linear_shapes())
        work["bias"] = Work(ops=outputs * rows)
    return work


def head_work(spec: ModelSpec, tokens: int, *, batch: int = 1) -> dict[str, Work]:
    """Digital work of a prefill outside its layers: the embedding lookup
    (BERT: with position and token-type rows and the embedding LayerNorm) and
    the output head (Llama: final norm and LM head on each request's last
    position, which yields the first token; BERT: mean pooling)."""
    tokens, batch = _check_counts(tokens, batch)
    h, rows = spec.hidden_size, batch * tokens
    if spec.architecture == "llama":
        return {"embedding": Work(dram_bytes=rows * h * WEIGHT_BYTES),
                "lm_head": Work(ops=batch * (_NORM_OPS["llama"] * h + 2 * spec.vocab_size * h),
                                dram_bytes=spec.vocab_size * h * WEIGHT_BYTES)}
    # BERT: word + position + token type (two adds), then the embedding LayerNorm.
    return {"embedding": Work(ops=(2 + _NORM_OPS["bert"]) * h * rows,
                              sram_bytes=2 * h * rows * ACTIVATION_BYTES,
                              dram_bytes=(rows + tokens + 1) * h * WEIGHT_BYTES),
            "pooling": Work(ops=batch * (h * tokens + 3 * h))}


def weight_count(spec: ModelSpec) -> dict[str, int]:
    """Parameters of the model: ``"linear"`` (all layers' weight matmuls),
    ``"embedding"`` and ``"lm_head"`` (0 when tied to the embedding or absent)."""
    linear = spec.num_layers * spec.linear_macs_per_token()
    embedding = spec.vocab_size * spec.hidden_size
    tied = bool(spec.raw.get("tie_word_embeddings", spec.architecture == "bert"))
    head = 0 if tied or spec.architecture != "llama" else embedding
    return {"linear": linear, "embedding": embedding, "lm_head": head}


def sum_work(items: Mapping[str, Work]) -> Work:
    """The sum of several items of work."""
    total = Work()
    for w in items.values():
        total = total + w
    return total
