"""The GPU baseline: the same prefill (and decode) on a GPU, by roofline.

FLOPs and bytes come from the same :class:`~optical.transformer.ModelSpec`
shapes and the same :mod:`optical.energy.counts` as the optical machine:
``2`` FLOPs per weight MAC, the attention products and the element-wise work
of :func:`~optical.energy.counts.layer_work`, the output head of
:func:`~optical.energy.counts.head_work`. Off-chip bytes are the bf16 weights
(read once per forward pass), the activations each kernel reads and writes
(the on-chip traffic of the counts is off-chip traffic on a GPU, except the
attention scores and probabilities, which fused attention keeps on chip; K
and V are read once per sequence and layer), and the KV cache written.

Time is the roofline ``max(FLOPs / (peak * compute_utilization), bytes /
(bandwidth * bandwidth_utilization))`` on the fewest GPUs whose memory holds
the weights and KV cache, with ideal tensor-parallel scaling; energy is the
board power times that time on every GPU (``power`` is the TDP: a GPU busy
with prefill draws close to it). Idle power is not charged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from optical._frozen import FrozenMapping
from optical._validation import check_nonnegative_int, check_positive_int
from optical.energy import counts
from optical.transformer.spec import ModelSpec

__all__ = ["GPUS", "GPUReport", "GPUSpec", "decode_step", "get_gpu", "kv_cache_bytes",
           "model_bytes", "prefill"]

#: Items whose traffic stays on chip on a GPU: fused attention (FlashAttention)
#: never writes the scores and probabilities to HBM.
_FUSED = ("softmax",)


@dataclasses.dataclass(frozen=True)
class GPUSpec:
    """A GPU, from its datasheet, and how well a workload uses it.

    Attributes
    ----------
    name : str
    peak_flops : float, FLOP/s
        Dense (no structured sparsity) BF16 tensor-core throughput.
    memory_bandwidth : float, byte/s
    power : float, W
        Board power under load (TDP).
    memory : float, byte
        The datasheet's "80 GB" read as 80e9 bytes: the board holds 80 GiB
        (85.9e9) and reports ~85.5e9, so ~6 % is left for the CUDA context,
        activations and fragmentation (a 70B bf16 model, 141.1e9 bytes,
        then takes two H200s: "141 GB", 150.8e9 reported).
    compute_utilization : float, dimensionless
        Achieved fraction of ``peak_flops`` (model FLOPs utilisation).
    bandwidth_utilization : float, dimensionless
        Achieved fraction of ``memory_bandwidth``.
    source : str
    """

    name: str
    peak_flops: float
    memory_bandwidth: float
    power: float
    memory: float
    compute_utilization: float = 0.5
    bandwidth_utilization: float = 0.8
    source: str = ""

    def __post_init__(self) -> None:
        for field in ("peak_flops", "memory_bandwidth", "power", "memory"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not 0 < value < math.inf:
                raise ValueError(f"gpu.{field}: {value!r} must be a positive finite number")
        for field in ("compute_utilization", "bandwidth_utilization"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                raise ValueError(f"gpu.{field}: {value!r} is out of range; valid: (0, 1]")

    def replace(self, **changes: Any) -> GPUSpec:
        """A copy with ``changes`` (field names as keywords): another board."""
        return dataclasses.replace(self, **changes)

    @property
    def energy_per_flop(self) -> float:
        """Board energy per FLOP at the achieved utilisation, J/FLOP."""
        return self.power / (self.peak_flops * self.compute_utilization)


#: Datasheet presets (SXM boards; dense BF16; sources in docs/energy.md), read-only
#: (another board: a GPUSpec of its own, or ``get_gpu(name).replace(...)``).
GPUS: Mapping[str, GPUSpec] = FrozenMapping({
    "h100": GPUSpec(
        name="H100 SXM", peak_flops=989e12, memory_bandwidth=3.35e12, power=700.0,
        memory=80e9,
        source="NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1979 TFLOP/s with "
               "sparsity, 989 dense; 3.35 TB/s HBM3; 80 GB; up to 700 W"),
    "h200": GPUSpec(
        name="H200 SXM", peak_flops=989e12, memory_bandwidth=4.8e12, power=700.0,
        memory=141e9,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1979 TFLOP/s with "
               "sparsity, 989 dense; 4.8 TB/s HBM3e; 141 GB; up to 700 W"),
})


def get_gpu(name: str) -> GPUSpec:
    """A preset GPU by name (``"h100"``, ``"h200"``); ValueError lists them."""
    key = name.lower() if isinstance(name, str) else None
    if key not in GPUS:
        raise ValueError(f"unknown gpu {name!r}; valid: {', '.join(GPUS)}")
    return GPUS[key]


@dataclasses.dataclass(frozen=True)
class GPUReport:
    """A prefill, or one decode step, on GPUs.

    Attributes
    ----------
    gpu : GPUSpec
    tokens, batch : int
        ``batch`` sequences of ``tokens`` new rows (1 for a decode step).
    flops : int, FLOP
    bytes : int, byte
        Off-chip traffic.
    gpus : int
        GPUs whose memory holds the model and KV cache (tensor parallel).
    time : float, s
        Time to first token of the batch (or of the decode step).
    energy : float, J
        Whole batch, all GPUs.
    """

    gpu: GPUSpec
    tokens: int
    batch: int
    flops: int
    bytes: int
    gpus: int
    time: float
    energy: float

    @property
    def compute_bound(self) -> bool:
        """Whether the prefill's FLOPs take longer than its bytes at the achieved
        utilisations (the roofline's compute side)."""
        g = self.gpu
        return (self.flops / (g.peak_flops * g.compute_utilization)
                >= self.bytes / (g.memory_bandwidth * g.bandwidth_utilization))

    @property
    def per_token(self) -> float:
        """Energy per new token, J."""
        return self.energy / (self.batch * self.tokens)

    @property
    def per_request(self) -> float:
        """Energy per prefill request, J."""
        return self.energy / self.batch

    @property
    def per_mac(self) -> float:
        """Energy per multiply-accumulate of all the GPU's work (``flops / 2``:
        attention and the rest included), J."""
        return self.energy / (self.flops / 2) if self.flops else math.inf

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready values (what ``optical energy --json`` writes
        under ``gpu``): the spec, energies in J, time to first token in s."""
        return {"name": self.gpu.name, "spec": dataclasses.asdict(self.gpu),
                "energy_j": {"total": self.energy, "per_token": self.per_token,
                             "per_request": self.per_request, "per_mac": self.per_mac},
                "ttft_s": self.time, "flops": self.flops, "bytes": self.bytes,
                "gpus": self.gpus, "compute_bound": self.compute_bound}


def kv_cache_bytes(spec: ModelSpec, tokens: int) -> int:
    """Bytes of one sequence's KV cache at ``tokens`` positions (bf16; 0 for
    an encoder, which keeps none)."""
    tokens = check_nonnegative_int(tokens, "tokens")
    if spec.architecture != "llama":
        return 0
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * tokens \
        * counts.ACTIVATION_BYTES


def model_bytes(spec: ModelSpec) -> int:
    """Bytes of the model's weights in bf16."""
    return sum(counts.weight_count(spec).values()) * counts.WEIGHT_BYTES


def _forward(spec: ModelSpec, gpu: GPUSpec, tokens: int, batch: int, context: int,
             kv_held: int, gpus: int | None = None) -> GPUReport:
    """``batch`` sequences of ``tokens`` new rows attending to ``context``
    positions; ``kv_held`` bytes of KV cache must fit beside the weights
    (unless ``gpus`` is given)."""
    rows = batch * tokens
    weights = counts.weight_count(spec)
    items = counts.layer_work(spec, tokens, batch=batch, attention="digital", context=context)
    layer = counts.sum_work(items)
    off_chip = layer.sram_bytes - sum(items[n].sram_bytes for n in _FUSED if n in items)
    head = counts.sum_work(counts.head_work(spec, tokens, batch=batch))
    linear_io = sum(s.in_features + s.out_features for s in spec.linear_shapes()) \
        * rows * counts.ACTIVATION_BYTES
    flops = 2 * rows * weights["linear"] + spec.num_layers * layer.ops + head.ops
    nbytes = (weights["linear"] * counts.WEIGHT_BYTES
              + spec.num_layers * (off_chip + linear_io)
              + head.dram_bytes + head.sram_bytes  # BERT's embedding LayerNorm
              + batch * kv_cache_bytes(spec, tokens))
    if gpus is None:
        gpus = max(1, math.ceil((model_bytes(spec) + kv_held) / gpu.memory))
    time = max(flops / (gpu.peak_flops * gpu.compute_utilization),
               nbytes / (gpu.memory_bandwidth * gpu.bandwidth_utilization)) / gpus
    return GPUReport(gpu=gpu, tokens=tokens, batch=batch, flops=flops, bytes=nbytes, gpus=gpus,
                     time=time, energy=gpus * gpu.power * time)


def _check_spec_gpu(spec: object, gpu: object) -> None:
    counts._check_spec(spec)
    if not isinstance(gpu, GPUSpec):
        raise TypeError(f"gpu: expected a GPUSpec (get_gpu(name)), got {type(gpu).__name__}")


def prefill(spec: ModelSpec, tokens: int, gpu: GPUSpec, *, batch: int = 1) -> GPUReport:
    """Prefill of ``batch`` prompts of ``tokens`` tokens on GPUs (up to the
    first token: the LM head runs on each prompt's last position).

    Parameters
    ----------
    spec : ModelSpec
    tokens, batch : int
    gpu : GPUSpec
        E.g. ``get_gpu("h100")``.
    """
    _check_spec_gpu(spec, gpu)
    tokens, batch = counts._check_counts(tokens, batch)
    spec.check_tokens(tokens)
    return _forward(spec, gpu, tokens, batch, tokens, batch * kv_cache_bytes(spec, tokens))


def decode_step(spec: ModelSpec, context: int, batch: int, gpu: GPUSpec, *,
                gpus: int | None = None) -> GPUReport:
    """One decode step: ``batch`` sequences each add one token, attending to
    ``context`` positions. Off-chip: every weight once per step, and each
    sequence's KV cache (read once per layer). ``gpus`` fixes the instance
    size (default: the fewest that hold the weights and these KV caches)."""
    _check_spec_gpu(spec, gpu)
    context, batch = counts._check_counts(context, batch, ("context", "batch"))
    if gpus is not None:
        gpus = check_positive_int(gpus, "gpus")
    return _forward(spec, gpu, 1, batch, context, batch * kv_cache_bytes(spec, context), gpus)
