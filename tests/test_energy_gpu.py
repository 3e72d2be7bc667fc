"""The GPU baseline and the disaggregated estimate against hand calculations."""

import functools
import math
import re

import pytest

import optical
from optical.energy import compare, counts, gpu, workload
from optical.transformer import ModelSpec, read_spec

#: pytest.approx with no absolute slack: its default abs=1e-12 would swallow
#: energies in joules (a laser term of 5.6e-13 J would pass for any value).
approx = functools.partial(pytest.approx, rel=1e-6, abs=0)

TINY_CONFIG = {
    "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 4, "vocab_size": 10, "tie_word_embeddings": False}
TINY = ModelSpec.from_config(TINY_CONFIG)

SLOW_GPU = gpu.GPUSpec(name="toy", peak_flops=1e4, memory_bandwidth=1e3, power=100.0,
                       memory=1e6, compute_utilization=0.5, bandwidth_utilization=0.8)


def test_datasheet_presets():
    h100, h200 = gpu.get_gpu("h100"), gpu.get_gpu("H200")
    assert (h100.peak_flops, h100.memory_bandwidth, h100.power, h100.memory) == (
        989e12, 3.35e12, 700.0, 80e9)
    assert (h200.peak_flops, h200.memory_bandwidth, h200.power, h200.memory) == (
        989e12, 4.8e12, 700.0, 141e9)
    assert h100.energy_per_flop == approx(700 / (989e12 * 0.5))
    with pytest.raises(ValueError, match="unknown gpu 'a100'; valid: h100, h200"):
        gpu.get_gpu("a100")


def test_prefill_flops_bytes_time_and_energy_by_hand():
    # 2 prompts x 3 tokens; linear weights per layer 576, 2 layers; embedding
    # and LM head 10 x 8 each. Element-wise and attention operations per layer
    # 1968 (see test_energy's hand count); LM head 2 x (4*8 + 2*10*8).
    rep = gpu.prefill(TINY, 3, SLOW_GPU, batch=2)
    assert counts.weight_count(TINY) == {"linear": 1152, "embedding": 80, "lm_head": 80}
    assert rep.flops == 2 * 6 * 1152 + 2 * 1968 + 2 * (32 + 160)
    # Weights 1152 x 2 B; per layer the unfused activations (2112 B without the
    # softmax's on-chip scores) and linear inputs/outputs (128 x 6 rows x 2 B);
    # embedding rows (96 B) and LM head (160 B); KV cache 2 x 96 B.
    assert rep.bytes == 1152 * 2 + 2 * (2112 + 1536) + 96 + 160 + 2 * 96
    assert rep.gpus == 1
    assert not rep.compute_bound
    assert rep.time == approx(rep.bytes / (1e3 * 0.8))
    assert rep.energy == approx(100.0 * rep.time)
    assert rep.per_token == approx(rep.energy / 6)


def test_bert_prefill_bytes_by_hand_include_the_embedding_layernorm():
    # 1 prompt x 4 tokens, H = 8, I = 16; weights 4 x 8 x 8 + 2 x 8 x 16 = 512,
    # x 2 B. The layer's unfused activations: two LayerNorms read and write H
    # (4 x 8 x 4 x 2 B = 256), Q read and O written, K and V read once (256),
    # GELU reads and writes I (256), residuals read two and write one, twice
    # (384); linear inputs and outputs 112 per row x 4 rows x 2 B. From DRAM:
    # 4 word, 4 position and 1 token-type rows (9 x 8 x 2 B). The embedding
    # LayerNorm reads and writes H per row (2 x 8 x 4 x 2 B), HBM traffic on a
    # GPU like every element-wise kernel's (it was left out). No KV cache.
    bert = ModelSpec.from_config({"model_type": "bert", "hidden_size": 8,
                                  "intermediate_size": 16, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "vocab_size": 10})
    rep = gpu.prefill(bert, 4, SLOW_GPU)
    layer = 256 + 256 + 256 + 384 + 112 * 4 * 2
    assert rep.bytes == 512 * 2 + layer + 9 * 8 * 2 + 2 * 8 * 4 * 2


def test_gpu_energy_per_mac_of_a_compute_bound_prefill_is_power_over_mac_rate(llama_8b):
    """Compute-bound, the GPU spends its power for flops / (peak x utilisation)
    seconds: per MAC (2 FLOP), 2 x power / (peak x utilisation), whatever the
    model: docs/energy.md's 700 / (989e12 x 0.5) x 2 = 2.83 pJ for the H100."""
    h100 = gpu.get_gpu("h100")
    rep = gpu.prefill(llama_8b, 2048, h100)
    assert rep.compute_bound
    expected = 2 * h100.power / (h100.peak_flops * h100.compute_utilization)
    assert rep.per_mac == approx(expected, rel=1e-12) and f"{expected * 1e12:.3g}" == "2.83"
    assert rep.to_dict()["energy_j"]["per_mac"] == rep.per_mac
    slow = gpu.prefill(TINY, 3, SLOW_GPU, batch=2)  # memory-bound: more per MAC
    assert not slow.compute_bound
    assert slow.per_mac > 2 * SLOW_GPU.power / (SLOW_GPU.peak_flops * 0.5)


def test_a_model_larger_than_one_gpu_is_split_with_the_same_energy():
    small = SLOW_GPU.replace(memory=1000.0)
    one, split = gpu.prefill(TINY, 3, SLOW_GPU, batch=2), gpu.prefill(TINY, 3, small, batch=2)
    # (1152 + 80 + 80) x 2 B of weights + 192 B of KV cache over 1000 B GPUs.
    assert split.gpus == math.ceil((2624 + 192) / 1000) == 3
    assert split.time == approx(one.time / 3)
    assert split.energy == approx(one.energy)


@pytest.mark.parametrize(("model", "published"), [
    ("llama-3.2-1b", 1_235_814_400), ("llama-3.1-8b", 8_030_261_248),
    ("llama-3.1-70b", 70_553_706_496)])
def test_weight_count_is_the_published_parameter_count_less_the_norms(model, published):
    """Meta's published parameter counts (the checkpoints' safetensors
    metadata) are the weight matmuls, the embedding, the LM head where it is
    not tied (Llama-3.2-1B ties it) and 2 RMSNorm weights per layer plus the
    final one; the GPU holds them all at 2 bytes (the norms aside)."""
    spec = read_spec(f"models/{model}")
    w = counts.weight_count(spec)
    norms = (2 * spec.num_layers + 1) * spec.hidden_size
    assert sum(w.values()) + norms == published
    assert (w["lm_head"] == 0) == (model == "llama-3.2-1b")
    assert gpu.model_bytes(spec) == 2 * (published - norms)


def test_the_kv_cache_counts_towards_the_gpus_needed():
    """2624 B of weights fit one 2700 B GPU, but not with the batch's 192 B of
    KV cache beside them: ceil(2816 / 2700) = 2 GPUs; 2816 B holds both."""
    assert gpu.model_bytes(TINY) == 2624 and 2 * gpu.kv_cache_bytes(TINY, 3) == 192
    assert gpu.prefill(TINY, 3, SLOW_GPU.replace(memory=2700.0), batch=2).gpus == 2
    assert gpu.prefill(TINY, 3, SLOW_GPU.replace(memory=2816.0), batch=2).gpus == 1
    # A decode step holds each sequence's cache at its full context, every one
    # of the batch's: 2624 + 96 B fit 2750 B, 2624 + 2 x 96 B do not.
    assert gpu.kv_cache_bytes(TINY, 3) == 96
    assert gpu.decode_step(TINY, 3, 2, SLOW_GPU.replace(memory=2700.0)).gpus == 2
    assert gpu.decode_step(TINY, 3, 1, SLOW_GPU.replace(memory=2750.0)).gpus == 1
    assert gpu.decode_step(TINY, 3, 2, SLOW_GPU.replace(memory=2750.0)).gpus == 2


def test_full_utilization_is_the_datasheet_peak():
    full = SLOW_GPU.replace(compute_utilization=1.0, bandwidth_utilization=1.0)
    assert full.energy_per_flop == approx(100.0 / 1e4)
    rep = gpu.prefill(TINY, 3, full, batch=2)
    assert rep.time == approx(max(rep.flops / 1e4, rep.bytes / 1e3))


def test_llama_70b_needs_two_gpus_and_is_compute_bound_at_2048_tokens():
    spec = read_spec("models/llama-3.1-70b")
    for name in ("h100", "h200"):
        rep = gpu.prefill(spec, 2048, gpu.get_gpu(name))
        assert rep.gpus == 2 and rep.compute_bound
        # About 2 x 70e9 x 2048 FLOPs at half of 989 TFLOP/s on 2 GPUs.
        assert rep.time == approx(2 * 70.6e9 * 2048 / (989e12 * 0.5) / 2, rel=0.1)


def test_decode_step_reads_the_weights_once_and_each_kv_cache():
    one = gpu.decode_step(TINY, 5, 1, SLOW_GPU)
    four = gpu.decode_step(TINY, 5, 4, SLOW_GPU)
    assert four.flops == 4 * one.flops
    per_sequence = four.bytes - one.bytes
    assert per_sequence % 3 == 0
    weights = (1152 + 80) * 2  # linear + LM head; embedding rows are per sequence
    assert one.bytes == weights + per_sequence // 3
    assert gpu.kv_cache_bytes(TINY, 5) == 2 * 2 * 4 * 5 * 2
    # Four more positions of context, per layer: QK^T and PV 2 x (2 heads x 4
    # x 2 FLOP) and softmax 6 x 2 heads per position; their K and V read
    # (1 KV head x 4 values x 2 B, twice). (A decode step that ignored its
    # context passed the checks above.)
    longer = gpu.decode_step(TINY, 9, 1, SLOW_GPU)
    assert longer.flops - one.flops == 2 * 4 * (2 * 2 * 4 * 2 + 6 * 2)
    assert longer.bytes - one.bytes == 2 * 4 * (1 * 4 * 2 * 2)


@pytest.mark.parametrize(("field", "value"), [("peak_flops", 0.0), ("power", math.inf),
                                              ("compute_utilization", 1.5),
                                              ("bandwidth_utilization", 0.0)])
def test_bad_gpu_specs_are_refused(field, value):
    with pytest.raises(ValueError, match=f"gpu.{field}"):
        SLOW_GPU.replace(**{field: value})


@pytest.fixture(scope="module")
def llama_8b():
    return read_spec("models/llama-3.1-8b")


@pytest.mark.parametrize("rate", [0.05, 1.0, 20.0, 400.0])
def test_decode_concurrency_obeys_littles_law(llama_8b, rate):
    work = workload.Workload(prompt_tokens=1024, output_tokens=256, requests_per_s=rate)
    h100 = gpu.get_gpu("h100")
    out = workload.disaggregated(llama_8b, work, optical.presets.get("iris-like"), h100)
    d = out["decode"]
    b = d["concurrent_sequences"]
    assert b == approx(rate / d["instances"] * 256 * d["step_time_s"], rel=1e-9)
    assert b <= d["max_sequences_per_instance"]
    assert d["energy_per_output_token_j"] == approx(
        d["gpus_per_instance"] * 700.0 * d["step_time_s"] / max(1.0, b), rel=1e-9)
    # The step is never faster than reading the linear and LM-head weights once.
    w = counts.weight_count(llama_8b)
    weights_time = (w["linear"] + w["lm_head"]) * 2 / (3.35e12 * 0.8) / d["gpus_per_instance"]
    assert d["step_time_s"] >= weights_time * 0.999


def test_more_load_needs_more_decode_instances(llama_8b):
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    instances = [workload.disaggregated(llama_8b, workload.Workload(1024, 256, r), cfg,
                                        h100)["decode"]["instances"]
                 for r in (1.0, 100.0, 2000.0)]
    assert instances[0] == 1 and instances[0] <= instances[1] < instances[2]


def test_disaggregated_energy_is_made_of_its_parts(llama_8b):
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    work = workload.Workload(2048, 128, 2.0)
    out = workload.disaggregated(llama_8b, work, cfg, h100, prefill_batch=2)
    per = out["energy_per_request_j"]
    opt = optical.energy.prefill(llama_8b, 2048, cfg, batch=2)
    ref = gpu.prefill(llama_8b, 2048, h100, batch=2)
    assert per["all_gpu"]["prefill"] == approx(ref.per_request)
    assert per["disaggregated"]["prefill"] == approx(opt.per_request)
    assert per["disaggregated"]["kv_transfer"] == approx(
        gpu.kv_cache_bytes(llama_8b, 2048) * cfg.energy.link_energy_per_byte)
    assert per["all_gpu"]["decode"] == per["disaggregated"]["decode"] == approx(
        128 * out["decode"]["energy_per_output_token_j"])
    for key in ("all_gpu", "disaggregated"):
        parts = {k: v for k, v in per[key].items() if k != "total"}
        assert per[key]["total"] == approx(sum(parts.values()))
        assert out["power_w"][key] == approx(2.0 * per[key]["total"])
    assert out["ratio"] == approx(per["all_gpu"]["total"] / per["disaggregated"]["total"])
    assert out["optical_machines"] == math.ceil(1.0 * opt.ttft)


def test_all_gpu_adds_whole_prefill_instances_for_batches_per_second(llama_8b):
    """docs/energy.md: all-GPU's GPUs are the decode instances' plus
    ceil(rate / prefill batch x prefill time) prefill instances."""
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    ref = gpu.prefill(llama_8b, 2048, h100, batch=2)
    rate = 2.5 / ref.time   # 1.25 prefill instances busy: 2; per request (x2) it would be 3
    out = workload.disaggregated(llama_8b, workload.Workload(2048, 128, rate), cfg, h100,
                                 prefill_batch=2)
    decode_gpus = out["decode"]["instances"] * out["decode"]["gpus_per_instance"]
    assert out["gpus"] == {"all_gpu": decode_gpus + 2 * ref.gpus, "disaggregated": decode_gpus}
    opt = optical.energy.prefill(llama_8b, 2048, cfg, batch=2)
    assert out["optical_machines"] == math.ceil(rate / 2 * opt.ttft)


@pytest.mark.parametrize(("args", "message"), [
    ((0, 10, 1.0), "prompt_tokens"), ((10, -1, 1.0), "output_tokens"),
    ((10, 10, 0.0), "requests_per_s"), ((10, 10, math.nan), "requests_per_s"),
    ((10, 10, True), "requests_per_s"),
])
def test_bad_workloads_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        workload.Workload(*args)


def test_a_request_longer_than_the_model_s_context_is_refused():
    """A request's decode runs at positions up to prompt + output tokens: past
    max_position_embeddings the model cannot hold it, so it is not priced."""
    spec = ModelSpec.from_config({**TINY_CONFIG, "max_position_embeddings": 10})
    cfg = optical.presets.get("iris-like")
    assert workload.disaggregated(spec, workload.Workload(6, 4, 0.01), cfg, SMALL_GPU)
    with pytest.raises(ValueError, match=r"output_tokens: 6 prompt \+ 5 output tokens exceed "
                                         "max_position_embeddings 10"):
        workload.disaggregated(spec, workload.Workload(6, 5, 0.01), cfg, SMALL_GPU)


def test_decode_instances_grow_in_proportion_to_a_huge_load(llama_8b):
    """Each instance decodes at most a fixed load, so a thousand times the
    requests need a thousand times the instances (to their rounding); past
    what a float counts (or past float range) the load is refused by name."""
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")

    def instances(rate):
        work = workload.Workload(2048, 256, rate)
        return workload.disaggregated(llama_8b, work, cfg, h100)["decode"]["instances"]

    assert instances(1e12) / instances(1e9) == approx(1000, rel=1e-6)
    for rate in (1e19, 1e308):
        with pytest.raises(ValueError, match=re.escape(f"requests_per_s: {rate:g} requests/s "
                                                       "of 256 output tokens need ")):
            instances(rate)


def test_break_even_photons_equalises_the_energies(llama_8b):
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    p = compare.break_even_photons(llama_8b, 512, cfg, h100)
    assert p is not None and p > cfg.source.photons_per_mac
    at = optical.energy.prefill(llama_8b, 512, cfg.replace({"source.photons_per_mac": p}))
    assert at.total == approx(gpu.prefill(llama_8b, 512, h100).energy, rel=1e-9)
    # Loading every mask at 1 J costs more than the whole GPU prefill: no photon
    # count breaks even.
    assert compare.break_even_photons(
        llama_8b, 512, cfg.replace({"energy.mask_load_energy": 1.0}), h100) is None


def test_compare_is_gpu_over_optical_at_the_batch_asked_for(llama_8b):
    """The ratios are GPU over optical (> 1: optics wins) of the two models'
    energies and times; the break-even photon count is that of the batch
    compared: at it, a batch of 4 costs the GPU's energy for a batch of 4."""
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    result = compare.compare(llama_8b, 512, cfg, h100, batch=4)
    opt = optical.energy.prefill(llama_8b, 512, cfg, batch=4)
    ref = gpu.prefill(llama_8b, 512, h100, batch=4)
    assert result["energy_ratio_gpu_over_optical"] == approx(ref.energy / opt.total)
    assert result["ttft_ratio_gpu_over_optical"] == approx(ref.time / opt.ttft)
    p = result["break_even_photons_per_mac"]
    at = optical.energy.prefill(llama_8b, 512, cfg.replace({"source.photons_per_mac": p}),
                                batch=4)
    assert at.total == approx(ref.energy, rel=1e-9)
    assert p != approx(compare.break_even_photons(llama_8b, 512, cfg, h100))  # batch 1's


def test_break_even_batch_is_the_first_batch_where_optics_wins(llama_8b):
    cfg = optical.presets.get("iris-like").replace({"energy.mask_load_energy": 20e-3})
    h100 = gpu.get_gpu("h100")
    b = compare.break_even_batch(llama_8b, 128, cfg, h100)
    assert b is not None and b > 1

    def ratio(batch):
        return (optical.energy.prefill(llama_8b, 128, cfg, batch=batch).per_token
                / gpu.prefill(llama_8b, 128, h100, batch=batch).per_token)

    assert ratio(b) <= 1 < ratio(b - 1)


#: TINY's 2624 B of weights with a KV cache of 32 B per position: 6 + 4 tokens
#: (320 B) do not fit two 1440 B GPUs (2944 B), 6 + 2 (2880 B) would.
SMALL_GPU = SLOW_GPU.replace(memory=1440.0)


@pytest.mark.parametrize("bound", ["memory", "compute"])
def test_decode_of_a_light_load_is_one_step_of_one_sequence_per_token(bound):
    """At 0.01 requests/s of 6 + 4 tokens, one instance decodes one sequence at
    a time: each output token costs one decode step of one sequence at the mean
    context 6 + 4 // 2 = 8, on the GPUs that hold the weights and the KV cache
    at the full context: ceil((2624 + 320) / 1440) = 3, with room for
    (3 x 1440 - 2624) // 320 = 5 sequences."""
    g = SMALL_GPU if bound == "memory" else SMALL_GPU.replace(memory_bandwidth=1e6)
    assert gpu.model_bytes(TINY) == 2624 and gpu.kv_cache_bytes(TINY, 10) == 320
    step = gpu.decode_step(TINY, 8, 1, g, gpus=3)
    assert step.compute_bound == (bound == "compute")
    out = workload.disaggregated(TINY, workload.Workload(6, 4, 0.01),
                                 optical.presets.get("iris-like"), g)
    d = out["decode"]
    assert (d["instances"], d["gpus_per_instance"], d["max_sequences_per_instance"]) == (1, 3, 5)
    assert d["step_time_s"] == approx(step.time)
    assert d["energy_per_output_token_j"] == approx(step.energy)  # 3 GPUs x power x time
    assert d["concurrent_sequences"] == approx(0.01 * 4 * step.time)
    # all-GPU: the same decode GPUs, plus ceil(prefills/s x TTFT) prefill
    # instances of the GPUs holding the 6-token prefill (2624 + 192 B: 2)
    pre = gpu.prefill(TINY, 6, g)
    assert pre.gpus == 2
    assert out["gpus"] == {"all_gpu": 3 + math.ceil(0.01 * pre.time) * 2, "disaggregated": 3}


def test_decode_step_of_a_fractional_batch_is_the_roofline_between_whole_batches():
    """A step's FLOPs and bytes grow linearly with the sequences decoding, so at
    b sequences (b between n and n + 1) they are interpolated between the
    decode steps of n and n + 1; the step time is their roofline, and b obeys
    Little's law with it. At 0.45 requests/s one instance would need more
    than its 5 sequences: two share the load."""
    out = workload.disaggregated(TINY, workload.Workload(6, 4, 0.45),
                                 optical.presets.get("iris-like"), SMALL_GPU)
    d = out["decode"]
    b = d["concurrent_sequences"]
    n = math.floor(b)
    assert d["instances"] == 2 and 1 <= n < b < d["max_sequences_per_instance"]
    low, high = (gpu.decode_step(TINY, 8, m, SMALL_GPU, gpus=3) for m in (n, n + 1))
    flops = low.flops + (b - n) * (high.flops - low.flops)
    nbytes = low.bytes + (b - n) * (high.bytes - low.bytes)
    time = max(flops / (1e4 * 0.5), nbytes / (1e3 * 0.8)) / 3
    assert d["step_time_s"] == approx(time)
    assert b == approx(0.45 / 2 * 4 * time)
    assert d["energy_per_output_token_j"] == approx(3 * 100.0 * time / b)


def test_break_even_batch_matches_the_documented_table(llama_8b):
    """docs/energy.md, iris-like on an H100: Llama 3.1 8B breaks even at batch
    1 for 2048-token prompts and batch 4 for 128-token prompts; a max_batch
    below the break-even finds none, and never a batch above max_batch."""
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    assert compare.break_even_batch(llama_8b, 2048, cfg, h100) == 1
    assert compare.break_even_batch(llama_8b, 128, cfg, h100) == 4
    assert compare.break_even_batch(llama_8b, 128, cfg, h100, max_batch=3) is None
    for max_batch in (4, 5, 6):
        assert compare.break_even_batch(llama_8b, 128, cfg, h100, max_batch=max_batch) == 4


def test_break_even_batch_never_exceeds_max_batch(llama_8b):
    # 256-token prompts (iris-like, H100) break even at batch 2: not reached by 1.
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    assert compare.break_even_batch(llama_8b, 256, cfg, h100) == 2
    assert compare.break_even_batch(llama_8b, 256, cfg, h100, max_batch=1) is None
    assert compare.break_even_batch(llama_8b, 256, cfg, h100, max_batch=2) == 2


@pytest.mark.parametrize("max_batch", [0, -4, True, 2.0])
def test_break_even_batch_refuses_a_max_batch_that_is_not_a_positive_integer(llama_8b,
                                                                             max_batch):
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    with pytest.raises(ValueError, match="max_batch"):
        compare.break_even_batch(llama_8b, 256, cfg, h100, max_batch=max_batch)


def test_break_even_tokens_is_the_shortest_prompt_where_optics_wins(llama_8b):
    """Every shorter prompt loses (each computed here from the two models),
    the break-even prompt wins; docs/energy.md's table: 419 tokens for the
    8B at batch 1 (between its 128 and 512 rows, which lose and win)."""
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")

    def ratio(tokens, batch=1):
        return (optical.energy.prefill(llama_8b, tokens, cfg, batch=batch).per_token
                / gpu.prefill(llama_8b, tokens, h100, batch=batch).per_token)

    t = compare.break_even_tokens(llama_8b, cfg, h100)
    assert t == 419
    assert ratio(t) <= 1 and all(ratio(tokens) > 1 for tokens in range(1, t))
    assert compare.break_even_tokens(llama_8b, cfg, h100, max_tokens=t - 1) is None
    assert compare.break_even_tokens(llama_8b, cfg, h100, max_tokens=t) == t


@pytest.mark.parametrize(("changes", "resident", "found"), [
    ({}, False, (419, 141)),  # fewer cores than weight tiles: reloaded every prefill
    ({"energy.cores": 100_000}, True, (1, 1)),  # resident: no loads, optics wins at once
    # Resident beside optical attention on the one core left (the 8B's 6,656
    # tiles under iris-like): the report also prices reloading, which is faster.
    ({"energy.cores": 6657, "mapping.attention": "optical", "energy.static_power": 1e-3},
     True, (235, 234)),
])
def test_break_even_tokens_prices_each_length_as_the_public_report_does(llama_8b, changes,
                                                                        resident, found):
    """break_even_tokens prices each length without building the report
    (model._total: a fifth to two fifths less time where nothing breaks
    even); its totals are the reports' to the bit, and its answer that of a
    scan of the public reports, at batch 1 and 3."""
    from optical.energy import model

    cfg, h100 = optical.presets.get("iris-like").replace(changes), gpu.get_gpu("h100")
    for batch, expected in zip((1, 3), found, strict=True):
        for tokens in (1, 2, 7, 64, 419, 1000):
            report = optical.energy.prefill(llama_8b, tokens, cfg, batch=batch)
            assert report.weights_resident == resident
            if "mapping.attention" in changes:
                assert report.faster_if_reloaded is not None
            assert model._total(llama_8b, tokens, cfg, batch) == report.total
        scan = next((t for t in range(1, 1025)
                     if optical.energy.prefill(llama_8b, t, cfg, batch=batch).per_token
                     <= gpu.prefill(llama_8b, t, h100, batch=batch).per_token), None)
        assert scan == expected
        assert compare.break_even_tokens(llama_8b, cfg, h100, batch=batch,
                                         max_tokens=1024) == scan


@pytest.mark.parametrize("batch", [2, 4, 8])
def test_break_even_tokens_is_set_by_rows_per_weight_load(llama_8b, batch):
    """The mask loads are amortised over batch x tokens rows: batching b
    prompts divides the break-even prompt by about b (the rows per load
    within 2 % of batch 1's 419: 422, 424, 424), and the prompt it gives wins
    at that batch while one token fewer loses."""
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    t = compare.break_even_tokens(llama_8b, cfg, h100, batch=batch)
    assert t is not None and 419 <= batch * t <= 1.02 * 419
    for tokens, wins in ((t, True), (t - 1, False)):
        opt = optical.energy.prefill(llama_8b, tokens, cfg, batch=batch).per_token
        assert (opt <= gpu.prefill(llama_8b, tokens, h100, batch=batch).per_token) == wins


def test_break_even_tokens_none_and_bad_limits(llama_8b):
    """At 1e6 photons per MAC (what a Llama layer needs to stay within 1.5 dB
    of its noise-free accuracy) optics loses at every prompt up to 1024; a
    limit must be a positive integer within the model's positions."""
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    bright = cfg.replace({"source.photons_per_mac": 1e6})
    assert compare.break_even_tokens(llama_8b, bright, h100, max_tokens=1024) is None
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match="max_tokens"):
            compare.break_even_tokens(llama_8b, cfg, h100, max_tokens=bad)
    with pytest.raises(ValueError, match="max_tokens: 200000 exceed max_position_embeddings"):
        compare.break_even_tokens(llama_8b, cfg, h100, max_tokens=200_000)
    with pytest.raises(ValueError, match="batch"):
        compare.break_even_tokens(llama_8b, cfg, h100, batch=0)


def test_compare_gives_the_break_even_prompt_of_its_batch_and_prompt(llama_8b):
    """compare() at batch 4 gives batch 4's break-even prompt (106 tokens,
    not batch 1's 419), tried up to 8192 or the prompt asked about when it is
    longer; where optics wins from the first token (every weight tile on its
    own core: no mask loads per prompt), the answer is 1."""
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    result = compare.compare(llama_8b, 512, cfg, h100, batch=4)
    assert (result["break_even_tokens"], result["break_even_tokens_tried"]) == (106, 8192)
    assert result["break_even_tokens"] == compare.break_even_tokens(llama_8b, cfg, h100, batch=4)
    bright = cfg.replace({"source.photons_per_mac": 1e6})
    long = compare.compare(llama_8b, 9000, bright.replace({"energy.cores": 64}), h100)
    assert long["break_even_tokens_tried"] == 9000
    resident = cfg.replace({"energy.cores": 6656})
    assert compare.break_even_tokens(llama_8b, resident, h100) == 1
