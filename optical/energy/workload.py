"""Disaggregated serving: optical prefill + GPU decode, against all-GPU.

A workload is a stream of requests (``requests_per_s``), each with
``prompt_tokens`` to prefill and ``output_tokens`` to generate. Both
deployments decode on the same GPUs; they differ in who prefills:

- all-GPU: the GPUs prefill each batch of ``prefill_batch`` prompts
  (:func:`optical.energy.gpu.prefill`) and then decode;
- disaggregated: the optical machine prefills (:func:`optical.energy.model.prefill`),
  the KV cache crosses a link (``energy.link_energy_per_byte``), the GPUs decode.

Decode: an instance is the fewest GPUs that hold the model. At ``lambda``
requests/s per instance, the number of sequences decoding at once ``b`` obeys
Little's law, ``b = lambda * output_tokens * t_step(b)``, with ``t_step`` the
roofline step time at the mean context ``prompt + output / 2`` (its least
fixed point has a closed form, see ``_decode``). Instances are added until it
exists and the KV caches fit. A step of ``b < 1`` sequences is charged as a
step of one (idle power is not charged).

GPUs: both deployments count the decode instances' GPUs; all-GPU adds
whole prefill instances, ``ceil(rate / prefill_batch * prefill time)`` of
them, so a prefill busy 1 % of the time still adds one instance (a
deployment that keeps its prefill off the decode GPUs' step time).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from optical._validation import check_positive_int
from optical.config import OpticalConfig
from optical.energy import gpu as gpu_model
from optical.energy import model as optical_model
from optical.transformer.spec import ModelSpec

__all__ = ["MAX_INSTANCES", "Workload", "check_context", "check_load", "disaggregated"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """A serving workload.

    Attributes
    ----------
    prompt_tokens, output_tokens : int
    requests_per_s : float, 1/s
    """

    prompt_tokens: int
    output_tokens: int
    requests_per_s: float

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens"):
            object.__setattr__(self, name, check_positive_int(getattr(self, name), name))
        rate = self.requests_per_s
        if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 < rate < math.inf:
            raise ValueError(f"requests_per_s: {rate!r} must be a positive finite number")
        object.__setattr__(self, "requests_per_s", float(rate))  # a plain float in JSON


def check_context(spec: ModelSpec, prompt_tokens: int, output_tokens: int,
                  name: str = "output_tokens") -> None:
    """ValueError, naming ``name``, when a request's context (its prompt and
    the tokens it generates) exceeds the model's ``max_position_embeddings``."""
    limit = spec.max_positions
    if limit is not None and prompt_tokens + output_tokens > limit:
        raise ValueError(f"{name}: {prompt_tokens} prompt + {output_tokens} output tokens "
                         f"exceed max_position_embeddings {limit} of config.json (a "
                         "request's context holds both)")


#: Most decode instances counted: past 2**53 a float no longer counts them.
MAX_INSTANCES = 2**53


def check_load(spec: ModelSpec, work: Workload, gpu: gpu_model.GPUSpec,
               name: str = "requests_per_s") -> None:
    """ValueError, naming ``name``, when the workload's decode needs more than
    :data:`MAX_INSTANCES` instances (or a load past float range)."""
    _decode_terms(spec, work, gpu, name)


def _decode_terms(spec: ModelSpec, work: Workload, gpu: gpu_model.GPUSpec,
                  name: str = "requests_per_s") -> tuple[Any, ...]:
    """``(gpus, max_sequences, a, b0, c, load, first)`` of :func:`_decode`:
    ``first`` is a lower bound of the instances it needs."""
    context = work.prompt_tokens + max(1, work.output_tokens // 2)
    kv_full = gpu_model.kv_cache_bytes(spec, work.prompt_tokens + work.output_tokens)
    gpus = max(1, math.ceil((gpu_model.model_bytes(spec) + kv_full) / gpu.memory))
    max_sequences = (gpus * gpu.memory - gpu_model.model_bytes(spec)) // max(kv_full, 1)
    one = gpu_model.decode_step(spec, context, 1, gpu, gpus=gpus)
    two = gpu_model.decode_step(spec, context, 2, gpu, gpus=gpus)
    scale = gpus * gpu.memory_bandwidth * gpu.bandwidth_utilization
    a = one.flops / (gpus * gpu.peak_flops * gpu.compute_utilization)
    c = (two.bytes - one.bytes) / scale
    b0 = (2 * one.bytes - two.bytes) / scale
    load = work.requests_per_s * work.output_tokens
    # A fixed point needs r max(a, c) < 1, and b <= max_sequences needs
    # r (b0 + max_sequences c) <= max_sequences, with r = load / instances.
    need = max(load * max(a, c), load * (b0 + max_sequences * c) / max_sequences)
    if not need <= MAX_INSTANCES:
        raise ValueError(f"{name}: {work.requests_per_s:g} requests/s of "
                         f"{work.output_tokens} output tokens need {need:.3g} decode "
                         f"instances, more than are counted ({MAX_INSTANCES:.3g})")
    # (less a few ulps: need is rounded, and the search only ever steps up)
    return gpus, max_sequences, a, b0, c, load, max(1, math.floor(need * (1 - 1e-15)))


def _decode(spec: ModelSpec, work: Workload, gpu: gpu_model.GPUSpec) -> dict[str, Any]:
    """Decode instances, concurrency and energy per output token.

    With step time ``t(b) = max(A b, B0 + C b)`` (compute; weights + KV
    reads) and per-instance load ``r = rate * output_tokens``, the least
    fixed point of ``b = r t(b)`` is ``b = r B0 / (1 - r C)``; it exists
    when ``r A < 1`` and ``r C < 1``.
    """
    gpus, max_sequences, a, b0, c, load, instances = _decode_terms(spec, work, gpu)
    # Fewest instances for which the fixed point exists and its KV caches fit
    # (from a lower bound: a step or two at most).
    while True:
        r = load / instances
        if r * max(a, c) < 1:
            b = r * b0 / (1 - r * c)
            if b <= max_sequences:
                break
        instances += 1
    if b < 1:  # mostly one sequence at a time: each occupies output_tokens steps of one
        b = r * max(a, b0 + c)
    batch = max(1.0, b)
    step = max(a * batch, b0 + c * batch)
    return {"instances": instances, "gpus_per_instance": gpus, "concurrent_sequences": b,
            "max_sequences_per_instance": int(max_sequences), "step_time_s": step,
            "energy_per_output_token_j": gpus * gpu.power * step / batch}


def disaggregated(spec: ModelSpec, work: Workload, config: OpticalConfig,
                  gpu: gpu_model.GPUSpec, *, prefill_batch: int = 1) -> dict[str, Any]:
    """Energy per request and hardware needed, optical prefill + GPU decode
    against all-GPU.

    Returns
    -------
    dict
        ``energy_per_request_j`` for both deployments and their parts,
        ``ratio`` (all-GPU over disaggregated), ``power_w`` at the workload's
        rate, the GPUs each deployment needs and the optical machines needed
        to keep up with the prefill rate.

    Raises
    ------
    ValueError
        ``spec`` is an encoder (BERT): it generates no tokens, so there is no
        decode to disaggregate; a request's prompt and output tokens exceed
        the model's ``max_position_embeddings`` (:func:`check_context`); the
        decode needs more than :data:`MAX_INSTANCES` instances
        (:func:`check_load`).
    """
    if not isinstance(work, Workload):
        raise TypeError(f"work: expected a Workload, got {type(work).__name__}")
    gpu_model._check_spec_gpu(spec, gpu)
    spec.check_tokens(work.prompt_tokens, "prompt_tokens")
    if spec.architecture != "llama":
        raise ValueError(f"spec: a {spec.architecture} model is an encoder and generates no "
                         "tokens; the disaggregated estimate (optical prefill + GPU decode) "
                         "needs a decoder (llama)")
    check_context(spec, work.prompt_tokens, work.output_tokens)
    decode = _decode(spec, work, gpu)
    decode_energy = work.output_tokens * decode["energy_per_output_token_j"]
    opt = optical_model.prefill(spec, work.prompt_tokens, config, batch=prefill_batch)
    gpu_pre = gpu_model.prefill(spec, work.prompt_tokens, gpu, batch=prefill_batch)
    kv_link = gpu_model.kv_cache_bytes(spec, work.prompt_tokens) \
        * config.energy.link_energy_per_byte
    all_gpu = gpu_pre.per_request + decode_energy
    split = opt.per_request + kv_link + decode_energy
    decode_gpus = decode["instances"] * decode["gpus_per_instance"]
    batches_per_s = work.requests_per_s / prefill_batch
    return {
        "workload": dataclasses.asdict(work),
        "prefill_batch": prefill_batch,
        "energy_per_request_j": {
            "all_gpu": {"total": all_gpu, "prefill": gpu_pre.per_request,
                        "decode": decode_energy},
            "disaggregated": {"total": split, "prefill": opt.per_request,
                              "kv_transfer": kv_link, "decode": decode_energy},
        },
        "ratio": all_gpu / split,
        "power_w": {"all_gpu": all_gpu * work.requests_per_s,
                    "disaggregated": split * work.requests_per_s},
        "decode": decode,
        "gpus": {"all_gpu": decode_gpus + math.ceil(batches_per_s * gpu_pre.time)
                 * gpu_pre.gpus,
                 "disaggregated": decode_gpus},
        "optical_machines": math.ceil(batches_per_s * opt.ttft),
        "ttft_s": {"all_gpu": gpu_pre.time, "disaggregated": opt.ttft},
    }
