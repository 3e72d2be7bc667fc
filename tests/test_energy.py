"""The optical energy model against hand calculations on tiny schedules and models."""

import dataclasses
import functools
import math

import pytest

import optical
from optical.energy import counts, model
from optical.transformer import ModelSpec, read_spec

#: pytest.approx with no absolute slack: its default abs=1e-12 would swallow
#: energies in joules (a laser term of 5.6e-13 J would pass for any value).
approx = functools.partial(pytest.approx, rel=1e-6, abs=0)

H_PLANCK = 6.62607015e-34
C_LIGHT = 299792458.0


def tiny_config(**changes):
    """A 4 x 4 core with every energy figure set to a round number."""
    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 4, "core.outputs": 4, "source.photons_per_mac": 1000.0,
        "detector.quantum_efficiency": 0.8, "dac.bits": 8, "adc.bits": 8, "adc.enob_loss": 1.5,
        "mask.bits": 8, "encoding.inputs": "offset", "encoding.weights": "split",
        "detector.balanced": True,
        "energy.laser_efficiency": 0.25, "energy.optical_efficiency": 0.5,
        "energy.source_mean_level": 1.0, "energy.walden_fom": 20e-15,
        "energy.detector_energy": 1e-12, "energy.mask_load_energy": 2e-3,
        "energy.dram_energy_per_byte": 30e-12, "energy.sram_energy_per_byte": 1e-12,
        "energy.digital_energy_per_op": 0.5e-12, "energy.input_rate": 1e9,
        "energy.mask_refresh_rate": 1e3, "energy.cores": 1, "energy.static_power": 0.0,
        "energy.dac_energy": None, "energy.adc_energy": None,
    })
    return cfg.replace(changes)


def test_each_term_of_a_tiny_matmul_matches_a_hand_count():
    # (3 x 5) @ (5 x 7) on a 4 x 4 core, offset inputs, split balanced weights:
    # 2 K-tiles x 2 N-tiles, one pass per tile per token.
    cfg = tiny_config()
    s = optical.schedule(3, 5, 7, cfg)
    assert (s.passes, s.weight_loads, s.dac_conversions, s.adc_conversions,
            s.detector_readouts) == (12, 4, 30, 42, 84)
    got = model.matmul_energy(s, cfg)
    photon = H_PLANCK * C_LIGHT / 850e-9
    # 30 source activations, each lighting 4 columns x 2 rails at 1000 detected
    # photons per pixel; detected -> emitted (0.8), optics (0.5), wall plug (0.25).
    assert got["laser"] == approx(30 * 4 * 2 * 1000 * photon / (0.8 * 0.5 * 0.25))
    assert got["dac"] == approx(30 * 20e-15 * 2**8)
    assert got["adc"] == approx(42 * 20e-15 * 2**6.5)
    assert got["detector"] == approx(84 * 1e-12)
    assert got["mask_load"] == approx(4 * 2e-3)
    # 5 x 7 weights x 2 rails x 8 bits.
    assert got["weight_memory"] == approx(70 * 30e-12)
    # Inputs read per N-tile (3 x 5 x 2 x 2 B) + fp32 partial sum read and
    # written per ADC conversion (42 x 8 B) + outputs written (3 x 7 x 2 B).
    assert got["activation_memory"] == approx((60 + 336 + 42) * 1e-12)
    # 3 per ADC conversion + weight scale per (row, K-tile, column) + input
    # scale per output + 2 per input element.
    assert got["digital"] == approx((3 * 42 + 3 * 2 * 7 + 3 * 7 + 2 * 3 * 5) * 0.5e-12)
    resident = model.matmul_energy(s, cfg, resident=True)
    assert resident["mask_load"] == resident["weight_memory"] == 0.0
    assert resident["laser"] == got["laser"]


def test_offset_weights_light_and_store_one_rail():
    """The hand count above with offset-encoded weights (wang-2022's mapping):
    one mask column per output, so each source activation lights 4 columns x
    1 rail, and a load writes 5 x 7 pixels x 1 rail x 8 bits = 35 B. Every
    other energy test has split weights, where an audit found a doubled
    fan-out or mask size for offset weights passing them all."""
    cfg = tiny_config(**{"encoding.weights": "offset", "detector.balanced": False})
    s = optical.schedule(3, 5, 7, cfg)
    assert (s.passes, s.weight_loads, s.dac_conversions) == (12, 4, 30)
    photon = H_PLANCK * C_LIGHT / 850e-9
    got = model.matmul_energy(s, cfg)
    assert got["laser"] == approx(30 * 4 * 1 * 1000 * photon / (0.8 * 0.5 * 0.25))
    assert counts.mask_bytes(s, cfg) == 35
    assert got["weight_memory"] == approx(35 * 30e-12)


def test_explicit_converter_energies_and_source_level_override_the_defaults():
    cfg = tiny_config(**{"energy.dac_energy": 3e-12, "energy.adc_energy": 5e-12,
                         "energy.source_mean_level": 0.5})
    s = optical.schedule(3, 5, 7, cfg)
    got, base = model.matmul_energy(s, cfg), model.matmul_energy(s, tiny_config())
    assert got["dac"] == approx(30 * 3e-12)
    assert got["adc"] == approx(42 * 5e-12)
    assert got["laser"] == approx(0.5 * base["laser"])


def test_per_rail_detection_doubles_the_adc_term():
    cfg = tiny_config(**{"detector.balanced": False})
    s = optical.schedule(3, 5, 7, cfg)
    assert s.adc_conversions == 84
    assert model.matmul_energy(s, cfg)["adc"] == approx(84 * 20e-15 * 2**6.5)


def test_photon_energy():
    assert model.photon_energy(850e-9) == approx(2.337e-19, rel=1e-3)
    assert model.photon_energy(1550e-9) == approx(1.2816e-19, rel=1e-3)
    with pytest.raises(ValueError, match="wavelength"):
        model.photon_energy(0.0)


@pytest.mark.parametrize("double_buffered", [False, True])
def test_matmul_work_and_span_by_hand(double_buffered):
    # 8 weight loads over 3 cores: 3 rounds; each load streams 100 passes at 1 GHz.
    cfg = tiny_config(**{"energy.double_buffered_mask": double_buffered})
    s = optical.schedule(100, 8, 16, cfg)
    assert (s.weight_loads, s.passes) == (8, 800)
    t = model.matmul_time(s, cfg, cores=3)
    per_tile = max(1e-3, 100e-9) if double_buffered else 1e-3 + 100e-9
    assert t["work"] == approx(8 * per_tile)
    assert t["span"] == t["streaming"] == approx(3 * 100e-9)
    # Activation masks are loaded on the span, round by round.
    assert model.matmul_time(s, cfg, cores=3, activation=True)["span"] == approx(
        3 * (1e-3 + 100e-9))
    resident = model.matmul_time(s, cfg, cores=8, resident=True)
    assert resident == {"work": approx(8 * 100e-9), "span": approx(100e-9),
                        "streaming": approx(100e-9)}
    with pytest.raises(ValueError, match="cores"):
        model.matmul_time(s, cfg, cores=0)


@pytest.mark.parametrize(("cores", "bound"), [(1, "work"), (64, "work"), (6655, "span")])
def test_prefill_time_is_the_larger_of_work_over_cores_and_span(cores, bound):
    # Llama 3.1 8B, 2048 tokens, 1024 x 1024 cores: 208 weight tiles per layer
    # in 7 matmuls of 16, 4, 4, 16, 56, 56, 56 tiles; each tile streams 2048
    # passes at 1 GHz and loads in 1 ms.
    spec = read_spec("models/llama-3.1-8b")
    rep = model.prefill(spec, 2048, optical.presets.get("iris-like").replace(
        {"energy.cores": cores}))
    assert rep.counts["weight_tiles"] == 32 * 208 and not rep.weights_resident
    stream = 2048e-9
    work = 32 * 208 * (1e-3 + stream) / cores
    rounds = sum(-(-tiles // cores) for tiles in (16, 4, 4, 16, 56, 56, 56))
    span = 1e-3 + 32 * rounds * stream
    assert rep.time["mask_load"] + rep.time["streaming"] == approx(max(work, span))
    assert (work >= span) == (bound == "work")
    assert rep.time["streaming"] == approx(32 * rounds * stream)


TINY = ModelSpec.from_config({
    "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
    "head_dim": 4, "vocab_size": 10, "tie_word_embeddings": False})


def test_layer_and_head_work_of_a_tiny_llama_match_a_hand_count():
    # H 8, I 16, q 8, kv 4, heads 2; 2 prompts of 3 tokens: 6 rows, context 3.
    work = counts.layer_work(TINY, 3, batch=2)
    ops = {k: w.ops for k, w in work.items()}
    assert ops == {"norms": 2 * 4 * 8 * 6, "rope": 3 * 12 * 6,
                   "attention.products": 4 * 3 * 8 * 6, "softmax": 6 * 36,
                   "mlp_activation": 5 * 16 * 6, "residual": 2 * 8 * 6}
    sram = {k: w.sram_bytes for k, w in work.items()}
    assert sram == {"norms": 2 * 2 * 8 * 6 * 2, "rope": 2 * 12 * 6 * 2,
                    "attention.products": (2 * 8 * 6 + 2 * 4 * 3 * 2) * 2,
                    "softmax": 4 * 36 * 2, "mlp_activation": 3 * 16 * 6 * 2,
                    "residual": 6 * 8 * 6 * 2}
    optical_attention = counts.layer_work(TINY, 3, batch=2, attention="optical")
    assert "attention.products" not in optical_attention
    assert optical_attention["softmax"].sram_bytes == 2 * 36 * 2
    head = counts.head_work(TINY, 3, batch=2)
    assert head["embedding"].dram_bytes == 6 * 8 * 2
    assert head["lm_head"].ops == 2 * (4 * 8 + 2 * 10 * 8)
    assert head["lm_head"].dram_bytes == 10 * 8 * 2
    # Heads wider than hidden / heads (head_dim 6: q 12, kv 6): the rotated and
    # attended widths are heads x head_dim, not the hidden size.
    wide = ModelSpec.from_config({**TINY.raw, "head_dim": 6})
    work = counts.layer_work(wide, 3, batch=2)
    assert work["rope"].ops == 3 * 18 * 6 and work["rope"].sram_bytes == 2 * 18 * 6 * 2
    assert work["attention.products"].ops == 4 * 3 * 12 * 6
    assert work["attention.products"].sram_bytes == (2 * 12 * 6 + 2 * 6 * 3 * 2) * 2
    assert work["norms"].ops == 2 * 4 * 8 * 6


TINY_BERT = ModelSpec.from_config({
    "model_type": "bert", "hidden_size": 8, "intermediate_size": 16,
    "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10,
    "max_position_embeddings": 16})


def test_layer_and_head_work_of_a_tiny_bert_match_a_hand_count():
    """A BERT layer: query, key, value (8 -> 8 each), attention output
    (8 -> 8), intermediate (8 -> 16), output (16 -> 8), each with a bias; two
    post-LayerNorms (attention and MLP blocks); GELU on the intermediate; no
    rotary embedding, no grouped heads (q = kv = 8). The head is mean pooling
    and no LM head (the embedding is tied). 2 prompts of 3 tokens: 6 rows,
    context 3, 2 heads -> 36 scores."""
    work = counts.layer_work(TINY_BERT, 3, batch=2)
    ops = {k: w.ops for k, w in work.items()}
    assert ops == {
        "norms": 2 * 8 * 8 * 6,  # two LayerNorms of 8 H operations per row
        "attention.products": 2 * 2 * 3 * 8 * 6,  # Q K^T and P V: 2 x context x q MACs
        "softmax": 6 * 36,
        "mlp_activation": 8 * 16 * 6,  # GELU: 8 operations per intermediate element
        "residual": 2 * 8 * 6,
        "bias": (8 + 8 + 8 + 8 + 16 + 8) * 6,  # one add per output of the six linears
    }
    sram = {k: w.sram_bytes for k, w in work.items()}
    assert sram == {
        "norms": 2 * (8 + 8) * 6 * 2,  # each norm reads and writes H, bf16
        "attention.products": (2 * 8 * 6 + 2 * 8 * 3 * 2) * 2,  # Q in, O out; K, V per prompt
        "softmax": 4 * 36 * 2,
        "mlp_activation": (16 + 16) * 6 * 2,  # GELU reads one input, writes one output
        "residual": 2 * 3 * 8 * 6 * 2,
        "bias": 0,
    }
    assert all(w.dram_bytes == 0 for w in work.values())
    optical_attention = counts.layer_work(TINY_BERT, 3, batch=2, attention="optical")
    assert "attention.products" not in optical_attention
    assert optical_attention["softmax"].sram_bytes == 2 * 36 * 2
    head = counts.head_work(TINY_BERT, 3, batch=2)
    assert set(head) == {"embedding", "pooling"}
    # Word + position + token-type rows added (2 H per row), then LayerNorm
    # (8 H per row, read and write H); DRAM: 6 word rows, 3 position rows (the
    # same for both prompts) and one token-type row of 8 bf16 values.
    assert head["embedding"] == counts.Work(ops=(2 + 8) * 8 * 6, sram_bytes=2 * 8 * 6 * 2,
                                            dram_bytes=(6 + 3 + 1) * 8 * 2)
    # Mean pooling sums 3 tokens of H per prompt, then 3 H (divide, normalise).
    assert head["pooling"] == counts.Work(ops=2 * (3 * 8 + 3 * 8))
    assert counts.weight_count(TINY_BERT) == {"linear": 2 * (4 * 8 * 8 + 2 * 8 * 16),
                                              "embedding": 10 * 8, "lm_head": 0}
    # prefill prices each item: operations, on-chip and off-chip bytes, every layer.
    rep = model.prefill(TINY_BERT, 3, tiny_config(), batch=2)
    for name in ops:
        assert rep.digital[name] == approx(
            2 * (ops[name] * 0.5e-12 + sram[name] * 1e-12), rel=1e-12), name
    assert rep.digital["pooling"] == approx(96 * 0.5e-12, rel=1e-12)
    assert rep.digital["embedding"] == approx(480 * 0.5e-12 + 192 * 1e-12 + 160 * 30e-12,
                                              rel=1e-12)
    assert "rope" not in rep.digital and "lm_head" not in rep.digital


def test_prefill_total_is_the_sum_of_independently_counted_parts():
    cfg = tiny_config()
    rep = model.prefill(TINY, 3, cfg, batch=2)
    e = cfg.energy
    matmuls = sum(sum(parts.values()) for parts in rep.by_matmul.values())
    others = {**{k: w * TINY.num_layers for k, w in counts.layer_work(TINY, 3, batch=2).items()},
              **counts.head_work(TINY, 3, batch=2)}
    digital = sum(w.ops * e.digital_energy_per_op + w.sram_bytes * e.sram_energy_per_byte
                  + w.dram_bytes * e.dram_energy_per_byte for w in others.values())
    assert rep.total == approx(matmuls + digital + rep.components["static"], rel=1e-12)
    assert rep.total == approx(sum(rep.components.values()), rel=1e-12)
    assert rep.ttft == approx(sum(rep.time.values()))
    assert rep.per_token == approx(rep.total / 6)
    assert rep.per_request == approx(rep.total / 2)
    # Per optical MAC: the layers' weight MACs (attention digital), 6 rows each.
    assert cfg.mapping.attention == "digital"
    macs = TINY.num_layers * TINY.linear_macs_per_token() * 6
    assert rep.counts["macs"] == macs and rep.per_mac == approx(rep.total / macs, rel=1e-12)
    assert rep.to_dict()["energy_j"]["per_mac"] == rep.per_mac
    # 7 linear matmuls per layer, each loaded once per prefill on the one core.
    layer = optical.transformer.layer_schedule(TINY, 3, cfg, batch=2)
    assert rep.counts["weight_loads"] == 2 * sum(s.weight_loads for s in layer.values())
    assert rep.components["mask_load"] == approx(rep.counts["weight_loads"] * 2e-3)
    assert rep.time["mask_load"] == approx(rep.counts["weight_loads"] * 1e-3)


def test_static_power_is_charged_over_the_ttft_on_every_core():
    cfg = tiny_config(**{"energy.static_power": 2.0, "energy.cores": 3})
    rep = model.prefill(TINY, 3, cfg)
    assert rep.components["static"] == approx(2.0 * 3 * rep.ttft)


def test_weights_stay_resident_when_the_cores_hold_every_tile():
    cfg = tiny_config()
    tiles = model.prefill(TINY, 3, cfg).counts["weight_tiles"]
    assert tiles == 2 * sum(s.weight_loads for s in
                            optical.transformer.layer_schedule(TINY, 3, cfg).values())
    below = model.prefill(TINY, 3, cfg.replace({"energy.cores": tiles - 1}))
    at = model.prefill(TINY, 3, cfg.replace({"energy.cores": tiles}))
    assert not below.weights_resident and at.weights_resident
    assert below.components["mask_load"] > 0 and at.components["mask_load"] == 0
    assert at.time["mask_load"] == 0 and at.counts["mask_bytes"] == 0
    # Every tile streams at once: the streaming time is one tile's per matmul.
    assert at.time["streaming"] == approx(2 * 7 * 3 / 1e9)


def test_optical_attention_loads_activation_masks_from_sram():
    # Two prompts of 3 tokens on a 4 x 4 core: each prompt's K^T (4 x 3) and V
    # (3 x 4) of its one KV head fill one tile, loaded once per prompt and KV
    # head in each of the 2 layers, at 2 mJ a load; their bytes come from SRAM.
    cfg = tiny_config(**{"mapping.attention": "optical"})
    rep = model.prefill(TINY, 3, cfg, batch=2)
    loads = TINY.num_layers * 2 * TINY.num_kv_heads
    for name in ("attention.scores", "attention.values"):
        assert rep.by_matmul[name]["weight_memory"] == 0.0
        assert rep.by_matmul[name]["mask_load"] == approx(loads * 2e-3, rel=1e-12)
    assert rep.components["mask_load"] == approx(rep.counts["weight_loads"] * 2e-3, rel=1e-12)
    assert "attention.products" not in rep.digital


@pytest.fixture(scope="module")
def llama_8b():
    return read_spec("models/llama-3.1-8b")


def test_doubling_the_prompt_doubles_the_linear_layer_terms(llama_8b):
    cfg = optical.presets.get("iris-like")
    one, two = (model.prefill(llama_8b, t, cfg) for t in (256, 512))
    linear = [s.name for s in llama_8b.linear_shapes()]
    for name in linear:
        for part in ("laser", "dac", "adc", "detector", "activation_memory", "digital"):
            assert two.by_matmul[name][part] == approx(2 * one.by_matmul[name][part],
                                                              rel=1e-12), (name, part)
        # The weights are loaded once per prefill whatever its length.
        for part in ("mask_load", "weight_memory"):
            assert two.by_matmul[name][part] == one.by_matmul[name][part]
    # Digital attention operations grow with the square of the prompt.
    assert (counts.layer_work(llama_8b, 512)["attention.products"].ops
            == 4 * counts.layer_work(llama_8b, 256)["attention.products"].ops)


def test_70b_over_8b_energy_per_token_is_the_linear_mac_ratio_when_optics_dominates(llama_8b):
    # Bright sources and resident weights: the laser term dominates.
    cfg = optical.presets.get("iris-like").replace({"source.photons_per_mac": 1e7,
                                                    "energy.cores": 1 << 20})
    big = read_spec("models/llama-3.1-70b")
    small_rep, big_rep = (model.prefill(s, 512, cfg) for s in (llama_8b, big))
    for rep in (small_rep, big_rep):
        assert rep.weights_resident
        assert rep.components["laser"] / rep.total > 0.9
    mac_ratio = (big.num_layers * big.linear_macs_per_token()
                 / (llama_8b.num_layers * llama_8b.linear_macs_per_token()))
    assert mac_ratio == approx(9.81, abs=0.01)
    assert big_rep.per_token / small_rep.per_token == approx(mac_ratio, rel=0.10)


@pytest.mark.parametrize(("changes", "message"), [
    ({"source.photons_per_mac": math.inf}, "source.photons_per_mac is inf"),
    ({"dac.bits": None}, "dac.bits is None"),
    ({"adc.bits": None}, "adc.bits is None"),
    ({"mask.bits": None}, "mask.bits is None"),
])
def test_unpriceable_configs_are_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        model.prefill(TINY, 3, tiny_config(**changes))


def test_every_unpriceable_field_is_named_at_once():
    """The ideal preset's four (source, DAC, ADC, mask) took four tries of
    `optical energy --preset ideal`, each naming the next; one refusal
    names them all, and setting them prices it."""
    cfg = optical.presets.get("ideal")
    with pytest.raises(ValueError) as info:
        model.prefill(TINY, 3, cfg)
    named = [part.split(" is ")[0] for part in str(info.value).split("; ")
             if " is " in part.split(":")[0]]
    assert named == ["source.photons_per_mac", "dac.bits", "adc.bits", "mask.bits"]
    priced = cfg.replace({"source.photons_per_mac": 1e4, "dac.bits": 8, "adc.bits": 8,
                          "mask.bits": 8})
    assert model.prefill(TINY, 3, priced).total > 0


def test_ideal_converters_with_explicit_energies_are_priced():
    cfg = tiny_config(**{"dac.bits": None, "adc.bits": None, "energy.dac_energy": 1e-12,
                         "energy.adc_energy": 2e-12})
    assert model.conversion_energies(cfg) == (1e-12, 2e-12)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tokens": 0}, "tokens: 0 must be a positive integer"),
    ({"tokens": 2.5}, "tokens"),
    ({"batch": 0}, "batch: 0 must be a positive integer"),
])
def test_bad_counts_are_refused(kwargs, message):
    args = {"tokens": 3, "batch": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        model.prefill(TINY, args["tokens"], tiny_config(), batch=args["batch"])



def test_numpy_integer_counts_price_as_python_ints(llama_8b):
    """numpy integers pass the count checks (np.int32 is numpy's default
    integer on Windows; ``np.arange`` is how one sweeps prompt lengths), but
    the counts were then multiplied at their fixed width: all-MiniLM-L6-v2's
    GPU FLOPs at np.int32(512) wrapped to 5.9e8 (its linear layers alone
    pass 2**31 there), an 8B optical prefill at np.int32(2048) raised
    OverflowError, an np.int64 batch of 2**20 at 8192 tokens gave negative
    FLOPs. Each is now priced as the Python int is, and what is handed back
    counts in Python ints (JSON writes them)."""
    import numpy as np

    from optical.energy import compare
    from optical.energy import gpu as gpu_model

    bert = read_spec("models/all-minilm-l6-v2")
    h100, cfg = gpu_model.get_gpu("h100"), optical.presets.get("iris-like")
    i32, i64 = np.int32, np.int64
    assert 2 * 512 * counts.weight_count(bert)["linear"] > 2**31
    pairs = [
        (lambda n: gpu_model.prefill(bert, n(512), h100).flops, i32),
        (lambda n: gpu_model.prefill(bert, n(512), h100, batch=n(10000)).energy, i32),
        (lambda n: model.prefill(llama_8b, n(2048), cfg).to_dict(), i32),
        (lambda n: gpu_model.prefill(llama_8b, n(8192), h100, batch=n(2**20)).flops, i64),
        (lambda n: gpu_model.decode_step(llama_8b, n(100000), n(64), h100).energy, i32),
        (lambda n: gpu_model.kv_cache_bytes(llama_8b, n(100000)), i32),
        (lambda n: counts.layer_work(llama_8b, n(8192), batch=n(64)), i32),
        (lambda n: counts.head_work(llama_8b, n(8192), batch=n(2**20)), i32),
        (lambda n: compare.compare(llama_8b, n(2048), cfg, h100, batch=n(3)), i32),
        (lambda n: compare.break_even_batch(llama_8b, n(64), cfg, h100,
                                            max_batch=n(2**20)), i32),
    ]
    for i, (call, fixed) in enumerate(pairs):
        assert call(fixed) == call(int), f"case {i}"
    assert gpu_model.prefill(llama_8b, i64(8192), h100, batch=i64(2**20)).flops > 0
    got = compare.compare(llama_8b, i32(2048), cfg, h100, batch=i32(3))
    assert type(got["break_even_tokens_tried"]) is int
    assert type(compare.break_even_batch(llama_8b, i32(64), cfg, h100,
                                         max_batch=i32(2**20))) is int

def test_prefill_takes_a_spec():
    with pytest.raises(TypeError, match="spec: expected a ModelSpec .*got str"):
        model.prefill("models/llama-3.2-1b", 3, tiny_config())


def test_a_schedule_from_another_config_is_refused():
    s = optical.schedule(3, 5, 7, tiny_config())
    with pytest.raises(ValueError, match="not consistent with this config|do not match"):
        model.matmul_energy(s, tiny_config(**{"core.inputs": 2}))
    with pytest.raises(ValueError, match="input_passes"):
        model.matmul_energy(s, tiny_config(**{"encoding.inputs": "split"}))
    with pytest.raises(ValueError, match="mask_source"):
        model.matmul_energy(s, tiny_config(), mask_source="hbm")
    with pytest.raises(TypeError, match="OpticalConfig"):
        model.prefill(TINY, 3, {"core.inputs": 4})


@pytest.mark.parametrize(("path", "value"), [
    ("energy.laser_efficiency", 0.0), ("energy.laser_efficiency", 1.5),
    ("energy.optical_efficiency", -0.1), ("energy.cores", 0), ("energy.input_rate", 0.0),
    ("energy.mask_refresh_rate", math.inf), ("energy.walden_fom", -1e-15),
    ("energy.dac_energy", -1.0), ("energy.double_buffered_mask", 1),
])
def test_energy_fields_are_validated(path, value):
    with pytest.raises(ValueError, match=path.replace(".", r"\.")):
        optical.presets.get("iris-like").replace({path: value})


def test_bert_is_priced_too():
    spec = read_spec("models/all-minilm-l6-v2")
    rep = model.prefill(spec, 128, optical.presets.get("iris-like"))
    assert "pooling" in rep.digital and "bias" in rep.digital and "rope" not in rep.digital
    assert rep.total > 0 and rep.ttft > 0


def test_laser_term_by_hand_to_full_precision():
    # pytest.approx's default abs=1e-12 J swallows the laser term (5.6e-13 J).
    cfg = tiny_config()
    s = optical.schedule(3, 5, 7, cfg)
    photon = 6.62607015e-34 * 299792458.0 / 850e-9
    expect = 30 * 4 * 2 * 1000 * photon / (0.8 * 0.5 * 0.25)
    assert model.matmul_energy(s, cfg)["laser"] == approx(expect, rel=1e-12, abs=0)


def test_photon_energy_to_full_precision():
    # hc = 1.98644586e-25 J m (exact SI constants); the existing rel=1e-3 check
    # of 2.337e-19 J passes for anything, as approx's default abs is 1e-12.
    assert model.photon_energy(850e-9) == approx(1.98644586e-25 / 850e-9,
                                                        rel=1e-8, abs=0)


def test_mask_bytes_round_up_to_whole_bytes():
    cfg = tiny_config(**{"mask.bits": 6})
    s = optical.schedule(3, 5, 7, cfg)  # one load: 5 x 7 pixels x 2 rails x 6 bits = 52.5 B
    assert counts.mask_bytes(s, cfg) == 53


def test_decode_step_counts_the_context_not_the_new_tokens():
    # One new token per prompt, 2 prompts, 5 positions of context; 2 heads, q 8, kv 4.
    work = counts.layer_work(TINY, 1, batch=2, context=5)
    assert work["softmax"].ops == 6 * (2 * 2 * 5)
    assert work["softmax"].sram_bytes == 4 * (2 * 2 * 5) * 2
    assert work["attention.products"].ops == 4 * 5 * 8 * 2
    assert work["attention.products"].sram_bytes == (2 * 8 * 2 + 2 * 4 * 5 * 2) * 2


def test_llama_without_a_tie_key_has_its_own_lm_head():
    # Hugging Face's LlamaConfig defaults tie_word_embeddings to False.
    spec = ModelSpec.from_config({
        "model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 4, "vocab_size": 10})
    assert counts.weight_count(spec)["lm_head"] == 10 * 8


@pytest.mark.parametrize("spare, faster_reloading", [(1, True), (2, False), (40, False)])
def test_activation_masks_get_only_the_spare_cores_when_weights_are_resident(
        spare, faster_reloading):
    """Resident weights hold `tiles` cores; optical attention's activation masks
    run on the others: with `spare` of them, each activation matmul takes
    ceil(loads / spare) rounds of a load and a stream. Reloading the weights
    instead spreads every mask over all the cores (one initial load, then the
    span or the work over the cores). Hand count of both: the report is the
    resident one (the lower energy), with the reload's TTFT beside it where
    faster (with one spare core: 2 K tiles in turn on it cost more than one
    more initial load)."""
    cfg = tiny_config(**{"mapping.attention": "optical"})
    layer = optical.transformer.layer_schedule(TINY, 3, cfg, batch=2)
    assert layer["attention.scores"].weight_loads == 2  # one K per prompt
    linear = {n: s for n, s in layer.items() if n not in counts.ACTIVATION_MASKS}
    tiles = TINY.num_layers * sum(s.weight_loads for s in linear.values())
    cores = tiles + spare
    rep = model.prefill(TINY, 3, cfg.replace({"energy.cores": cores}), batch=2)
    load, rate = 1e-3, 1e9
    kept = work = reloaded = 0.0
    for name, s in layer.items():
        stream = s.passes / s.weight_loads / rate
        work += s.weight_loads * (load + stream)
        if name in counts.ACTIVATION_MASKS:
            kept += -(-s.weight_loads // spare) * (load + stream)
            reloaded += -(-s.weight_loads // cores) * (load + stream)
        else:
            kept += stream  # every tile on its own core
            reloaded += stream
    layers = TINY.num_layers
    kept, reloaded = layers * kept, max(layers * work / cores, load + layers * reloaded)
    assert (reloaded < kept) == faster_reloading  # the cases cover both outcomes
    assert rep.weights_resident
    assert rep.ttft - rep.time["digital"] == approx(kept, rel=1e-12, abs=0)
    activation = sum(s.weight_loads for n, s in layer.items() if n in counts.ACTIVATION_MASKS)
    assert rep.components["mask_load"] == approx(layers * activation * 2e-3, rel=1e-12, abs=0)
    if not faster_reloading:
        assert rep.faster_if_reloaded is None
        return
    alt = rep.faster_if_reloaded
    assert alt["ttft_s"] - rep.time["digital"] == approx(reloaded, rel=1e-12, abs=0)
    # Reloading adds each weight tile's load (2 mJ) and its mask bytes read
    # from DRAM (30 pJ each): the energy of the same prefill on too few cores.
    weight_bytes = sum(counts.mask_bytes(s, cfg) for s in linear.values())
    assert alt["energy_j"] - rep.total == approx(
        layers * (tiles // layers * 2e-3 + weight_bytes * 30e-12), rel=1e-9)
    assert alt["energy_j"] == approx(model.prefill(
        TINY, 3, cfg.replace({"energy.cores": tiles - 1}), batch=2).total, rel=1e-12)


def test_one_more_core_never_slows_the_faster_schedule():
    """An audit found Llama-3.2-1B with optical attention 8x slower on 960
    cores (its weight tiles, one left for attention's masks) than on 959: a
    machine with one more core can always run the smaller one's schedule.
    The report keeps the resident weights (less energy) and gives the faster
    reload beside them; the faster of the two never lengthens."""
    spec = read_spec("models/llama-3.2-1b")
    cfg = optical.presets.get("iris-like").replace({"mapping.attention": "optical"})
    best, energy = [], []
    for c in (1, 64, 958, 959, 960, 961, 970, 1100, 4000):
        rep = model.prefill(spec, 128, cfg.replace({"energy.cores": c}))
        alt = rep.faster_if_reloaded
        best.append(rep.ttft if alt is None else min(rep.ttft, alt["ttft_s"]))
        energy.append(rep.total)
        assert rep.weights_resident == (c >= 960)
    assert all(b <= a for a, b in zip(best, best[1:], strict=False)), best
    assert all(b <= a for a, b in zip(energy, energy[1:], strict=False)), energy


def test_a_matmul_without_tokens_is_charged_no_mask_load():
    """Nothing streams through a matmul of zero rows, so nothing is loaded:
    its mask load is charged no energy, as it is charged no time, no bytes."""
    cfg = tiny_config()
    s = optical.core.schedule(0, 10, 6, cfg)
    energy = model.matmul_energy(s, cfg)
    assert energy["mask_load"] == energy["weight_memory"] == 0.0
    assert model.matmul_time(s, cfg, cores=1)["work"] == 0.0


@pytest.mark.parametrize("cores", [32, 64])  # below the 72 weight tiles
def test_activation_masks_share_every_core_when_weights_are_not_resident(cores):
    """Weights reloaded every prefill: the activation masks of optical
    attention are spread over all the cores, as the weights are (the
    resident case leaves them the spare ones). Hand count: each matmul's
    rounds of `cores` tiles, activation loads on the span, and the optics'
    time the larger of the work over the cores and the span after the first
    load. (Timed on one core, a 64-core Llama-3.2-1B prefill took 7.8x longer.)"""
    cfg = tiny_config(**{"mapping.attention": "optical", "energy.cores": cores})
    layer = optical.transformer.layer_schedule(TINY, 3, cfg, batch=2)
    tiles = TINY.num_layers * sum(s.weight_loads for n, s in layer.items()
                                  if n not in counts.ACTIVATION_MASKS)
    assert cores < tiles and not cfg.energy.double_buffered_mask
    rep = model.prefill(TINY, 3, cfg, batch=2)
    assert not rep.weights_resident
    load, rate = 1e-3, 1e9
    work = span = 0.0
    for name, s in layer.items():
        stream = s.passes / s.weight_loads / rate
        rounds = -(-s.weight_loads // cores)
        work += s.weight_loads * (load + stream)
        span += rounds * stream + (rounds * load if name in counts.ACTIVATION_MASKS else 0.0)
    optics = max(TINY.num_layers * work / cores, load + TINY.num_layers * span)
    assert optics == load + TINY.num_layers * span  # the span decides: the masks' cores count
    assert rep.ttft - rep.time["digital"] == approx(optics, rel=1e-12, abs=0)


@pytest.mark.parametrize("inputs", ["offset", "split"])
@pytest.mark.parametrize("cores", [1, 64])
def test_laser_power_is_every_source_lit_at_the_input_rate(cores, inputs):
    """While streaming, each busy core's sources are lit once per input
    period: Llama-3.1-8B's widths fill whole 1024-row tiles, so one core's
    lasers draw 1024 x (energy per activation) x input_rate (docs/energy.md:
    0.40 W a source, 407 W for one iris-like core); 64 cores draw that times
    the cores busy on average (a matmul's last round of tiles may leave some
    idle). Split inputs stream two passes per row, each lighting the sources
    once: the power is the same, the streaming twice as long."""
    cfg = optical.presets.get("iris-like").replace({"energy.cores": cores,
                                                    "encoding.inputs": inputs})
    spec = optical.transformer.read_spec("models/llama-3.1-8b")
    rep = model.prefill(spec, 2048, cfg)
    per_core = cfg.core.inputs * model.laser_energy_per_activation(cfg) * cfg.energy.input_rate
    layer = optical.transformer.layer_schedule(spec, 2048, cfg)
    tile_time = sum(s.passes for s in layer.values())  # core-periods of streaming
    span = sum(-(-s.weight_loads // cores) * s.passes / s.weight_loads for s in layer.values())
    assert rep.laser_power == approx(per_core * tile_time / span, rel=1e-9)
    assert rep.to_dict()["laser_power_w"] == rep.laser_power
    if cores == 1:
        assert f"{per_core / 1024:.2f} W" == "0.40 W" and f"{rep.laser_power:.0f}" == "407"
        # One core streams every pass of every layer, one per input period.
        passes = spec.num_layers * tile_time
        assert passes == spec.num_layers * 2048 * {"offset": 1, "split": 2}[inputs] * sum(
            s.k_tiles * s.n_tiles for s in layer.values())
        assert rep.time["streaming"] == approx(passes / cfg.energy.input_rate, rel=1e-12)
    else:
        assert 16 * per_core < rep.laser_power < 64 * per_core  # k_proj: 4 tiles, 4 cores


def test_laser_lights_every_output_column_of_a_non_square_core():
    # A 4-input x 6-output core: each source lights its row of 6 columns x 2
    # weight rails (not 4 inputs x 2), even on the N-tile holding 1 of 7 columns.
    cfg = tiny_config(**{"core.outputs": 6})
    s = optical.schedule(3, 5, 7, cfg)
    assert (s.k_tiles, s.n_tiles, s.dac_conversions) == (2, 2, 30)
    photon = H_PLANCK * C_LIGHT / 850e-9
    per_activation = 6 * 2 * 1000 * photon / (0.8 * 0.5 * 0.25)
    assert model.laser_energy_per_activation(cfg) == approx(per_activation, rel=1e-12)
    assert model.matmul_energy(s, cfg)["laser"] == approx(30 * per_activation, rel=1e-12)


def test_split_inputs_read_each_input_once_per_n_tile():
    # Split inputs: 2 passes per tile, but each input element is read once per
    # N-tile (both rails come from one read). (3 x 5) @ (5 x 7), 2 x 2 tiles:
    # 60 DAC conversions, 3 x 2 x 7 x 2 = 84 ADC conversions.
    cfg = tiny_config(**{"encoding.inputs": "split"})
    s = optical.schedule(3, 5, 7, cfg)
    assert (s.input_passes, s.dac_conversions, s.adc_conversions) == (2, 60, 84)
    work = counts.matmul_work(s, cfg)
    # inputs 3 x 5 x 2 N-tiles x 2 B + 84 partial sums x (4 B read + 4 B written)
    # + outputs 3 x 7 x 2 B.
    assert work.sram_bytes == 60 + 672 + 42
    assert work.ops == 3 * 84 + 3 * 2 * 7 + 3 * 7 + 2 * 3 * 5
    got = model.matmul_energy(s, cfg)
    assert got["activation_memory"] == approx((60 + 672 + 42) * 1e-12)
    assert got["laser"] == approx(60 * 4 * 2 * 1000 * H_PLANCK * C_LIGHT / 850e-9
                                  / (0.8 * 0.5 * 0.25))


def test_activation_mask_bytes_count_every_prompts_matrix():
    # Optical attention on TINY, 2 prompts of 3 tokens, 1 KV head: K^T (4 x 3)
    # and V (3 x 4) are loaded once per prompt: 2 matrices of 12 pixels x 2
    # weight rails x 8 bits = 48 B each, read from SRAM.
    cfg = tiny_config(**{"mapping.attention": "optical"})
    layer = optical.transformer.layer_schedule(TINY, 3, cfg, batch=2)
    for name in counts.ACTIVATION_MASKS:
        assert counts.matmul_dims(layer[name], cfg).matrices == 2
        assert counts.mask_bytes(layer[name], cfg) == 2 * 4 * 3 * 2
        # The mask bytes are charged as on-chip traffic, on top of the matmul's own.
        own = counts.matmul_work(layer[name], cfg).sram_bytes
        assert model.matmul_energy(layer[name], cfg, mask_source="sram")[
            "activation_memory"] == approx((own + 48) * 1e-12)


def test_a_schedule_whose_counts_do_not_divide_is_refused():
    # 31 source activations cannot come from 3 tokens x 2 N-tiles x 1 pass.
    s = optical.schedule(3, 5, 7, tiny_config())
    bad = dataclasses.replace(s, dac_conversions=31)
    with pytest.raises(ValueError, match="dac_conversions is not consistent"):
        counts.matmul_dims(bad, tiny_config())
    with pytest.raises(ValueError, match="not consistent"):
        counts.matmul_dims(dataclasses.replace(s, adc_conversions=43), tiny_config())


def test_digital_time_covers_every_digital_operation():
    # The digital engine runs every operation priced in the digital component
    # (the optical matmuls' decoding included) at digital_ops_per_s.
    cfg = tiny_config(**{"energy.digital_ops_per_s": 1e12})
    rep = model.prefill(TINY, 3, cfg, batch=2)
    ops = rep.components["digital"] / 0.5e-12
    assert rep.time["digital"] == approx(ops / 1e12, rel=1e-9)
    decode = TINY.num_layers * sum(counts.matmul_work(s, cfg).ops for s in
                                   optical.transformer.layer_schedule(TINY, 3, cfg,
                                                                      batch=2).values())
    others = (TINY.num_layers * sum(w.ops for w in counts.layer_work(TINY, 3, batch=2).values())
              + sum(w.ops for w in counts.head_work(TINY, 3, batch=2).values()))
    assert rep.time["digital"] == approx((decode + others) / 1e12, rel=1e-12)


def test_throughput_counts_every_prompt_of_the_batch():
    rep = model.prefill(TINY, 3, tiny_config(), batch=2)
    assert rep.throughput == approx(2 * 3 / rep.ttft, rel=1e-12)
    assert rep.to_dict()["throughput_tokens_per_s"] == rep.throughput


def test_optical_attention_with_no_spare_core_is_still_priced():
    # Every core holds a weight tile; the activation masks still run (prefill
    # refuses only the documented configs) and cannot be faster than with a
    # spare core.
    cfg = tiny_config(**{"mapping.attention": "optical"})
    tiles = model.prefill(TINY, 3, cfg, batch=2).counts["weight_tiles"]
    at = model.prefill(TINY, 3, cfg.replace({"energy.cores": tiles}), batch=2)
    spare = model.prefill(TINY, 3, cfg.replace({"energy.cores": tiles + 1}), batch=2)
    assert at.weights_resident and math.isfinite(at.ttft)
    assert at.ttft >= spare.ttft


@pytest.mark.parametrize(("call", "message"), [
    (lambda: counts.layer_work(TINY, 0), "tokens"),
    (lambda: counts.layer_work(TINY, 3, batch=0), "batch"),
    (lambda: counts.layer_work(TINY, 1, context=0), "context"),
    (lambda: counts.layer_work(TINY, 3, attention="gpu"), "attention: 'gpu' is not valid"),
    (lambda: counts.head_work(TINY, 0), "tokens"),
    (lambda: counts.head_work(TINY, 3, batch=0), "batch"),
])
def test_counts_refuse_bad_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
