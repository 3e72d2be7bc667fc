"""Layers on the optical core: exact in the ideal limit, counted as layer_schedule
counts, reproducible, and hurt by massive activations where the physics says so."""

import dataclasses
import functools
from pathlib import Path

import numpy as np
import pytest

import optical
from optical import transformer
from optical.quant import calibration_needs
from optical.transformer import LlamaLayer, SyntheticLlama, _engines, layer_schedule
from optical.transformer._engines import OpticalEngine
from optical.transformer.model import LlamaModel
from optical.transformer.spec import ModelSpec
from optical.transformer.synthetic import llama_layer_weights
from tests.conftest import EXACT_RTOL
from tests.transformer_helpers import TINY_LLAMA

IDEAL = optical.presets.get("ideal")
IRIS = optical.presets.get("iris-like")
# Small tiles, so even the tiny layer is cut into several K- and N-tiles.
SMALL_CORE = {"core.inputs": 48, "core.outputs": 40}


@pytest.fixture(scope="module")
def tiny():
    return LlamaModel(Path("tiny"), ModelSpec.from_config(TINY_LLAMA), None, seed=0)


@pytest.mark.parametrize("attention", ["digital", "optical"])
def test_ideal_preset_reproduces_the_float32_reference(tiny, attention):
    cfg = IDEAL.replace({**SMALL_CORE, "mapping.attention": attention})
    h = tiny.hidden_states(2, 24, batch=2)  # carries massive activations
    layer = tiny.layer(2)
    reference = layer.trace(h, dtype="float32")
    run = layer.trace(h, config=cfg, seed=0)
    for name, value in reference.products.items():
        assert optical.metrics.relative_error(value, run.products[name]) < EXACT_RTOL[np.float32], \
            name
    assert optical.metrics.relative_error(reference.output, run.output) < EXACT_RTOL[np.float32]
    assert run.output.dtype == np.float32 and run.output.shape == h.shape


def test_a_one_token_prompt_calibrates_on_itself_but_not_on_one_held_out_token(tiny):
    """Noise-free calibrated windows fitted to one token are points: exact
    for that token (each product's own input, the oracle) and refused from a
    held-out one, which they would read every input as."""
    cfg = IDEAL.replace({**SMALL_CORE, "mapping.attention": "optical", "adc.bits": 10,
                         "adc.full_scale": "calibrated"})
    h = tiny.hidden_states(2, 1)
    layer = tiny.layer(2)
    reference, run = layer.trace(h, dtype="float32"), layer.trace(h, config=cfg, seed=0)
    for name, value in reference.products.items():
        assert optical.metrics.relative_error(value, run.products[name]) < 1e-5, name
    held_out = layer.matmul_inputs(tiny.hidden_states(2, 1, seed=4))
    with pytest.raises(ValueError, match=r"^calibration\['q_proj'\]: 128 of 128 calibrated ADC "
                                         r"windows collapsed to a point"):
        layer.optical(h, cfg, seed=0, calibration=held_out)


@pytest.mark.parametrize("attention", ["digital", "optical"])
@pytest.mark.parametrize("batch", [1, 3])
def test_stats_equal_layer_schedule(tiny, attention, batch):
    cfg = IRIS.replace({**SMALL_CORE, "mapping.attention": attention,
                        "outliers.policy": "none"})
    h = tiny.hidden_states(1, 10, batch=batch)
    _, stats = tiny.layer(1).optical(h, cfg, seed=0, return_stats=True)
    expected = layer_schedule(tiny.spec, 10, cfg, batch=batch)
    assert set(stats) == set(expected)
    for name, schedule in expected.items():
        counted = {f.name: getattr(stats[name], f.name) for f in dataclasses.fields(schedule)}
        assert counted == schedule.to_dict(), name
    # With outlier channels bypassing the optics, each weight matmul's optical
    # counts are those of the channels left on the mask.
    bypass = cfg.replace({"outliers.policy": "static"})
    _, stats = tiny.layer(1).optical(h, bypass, seed=0, return_stats=True)
    for shape in tiny.spec.linear_shapes():
        st = stats[shape.name]
        left = optical.core.schedule(batch * 10, shape.in_features - st.digital_channels,
                                     shape.out_features, bypass)
        assert {k: getattr(st, k) for k in left.to_dict()} == left.to_dict(), shape.name
    if attention == "optical":
        # K^T and V of every prompt and KV head are loaded as masks (dynamic operands)
        assert stats["attention.scores"].weight_loads == batch * tiny.spec.num_kv_heads


def test_optical_run_is_reproducible_and_seed_dependent(tiny):
    h = tiny.hidden_states(0, 12)
    layer = tiny.layer(0)
    a = layer.optical(h, IRIS, seed=5)
    np.testing.assert_array_equal(layer.optical(h, IRIS, seed=5), a)
    assert not np.array_equal(layer.optical(h, IRIS, seed=6), a)
    # every layer draws its own noise for the same seed
    other = LlamaLayer(tiny.spec, 1, layer.weights)
    assert not np.array_equal(other.optical(h, IRIS, seed=5), a)


def test_layout_of_the_input_changes_no_bit(tiny):
    # RMSNorm's mean along a strided axis would sum in another order.
    h = tiny.hidden_states(1, 12)
    layer = tiny.layer(1)
    for dtype in ("float32", "float16"):
        expected = layer.reference(h, dtype=dtype)
        for other in (np.asfortranarray(h), np.repeat(h, 2, axis=1)[:, ::2]):
            np.testing.assert_array_equal(layer.reference(other, dtype=dtype), expected)
    expected = layer.optical(h, IRIS, seed=5)
    np.testing.assert_array_equal(layer.optical(np.asfortranarray(h), IRIS, seed=5), expected)


def test_calibration_names_must_be_weight_matmuls(tiny):
    # A misspelt product would silently be calibrated on its own inputs.
    layer = tiny.layer(1)
    h = tiny.hidden_states(1, 6)
    held_out = layer.matmul_inputs(tiny.hidden_states(1, 8, seed=3))
    np.testing.assert_array_equal(layer.optical(h, IRIS, seed=0, calibration=held_out),
                                  layer.optical(h, IRIS, seed=0, calibration=dict(held_out)))
    with pytest.raises(ValueError, match=r"calibration: no weight matmul 'q_porj'; the "
                                         r"layer's are q_proj, k_proj, v_proj, o_proj"):
        layer.optical(h, IRIS, seed=0, calibration={"q_porj": held_out["q_proj"]})
    with pytest.raises(TypeError, match="calibration: expected a mapping"):
        layer.optical(h, IRIS, seed=0, calibration=[held_out["q_proj"]])


def test_a_calibration_missing_a_product_is_refused_where_the_config_calibrates(tiny):
    """A calibration shift audit: calibration={"q_proj": ...} calibrated every
    other weight matmul on its own test input (the oracle) beside the held-out
    one, silently: k_proj came out bit-identical to the oracle run. Under a
    config that calibrates nothing a partial mapping stays harmless."""
    layer = tiny.layer(1)
    h = tiny.hidden_states(1, 6)
    held_out = layer.matmul_inputs(tiny.hidden_states(1, 8, seed=3))
    with pytest.raises(ValueError, match=r"^calibration: no entry for k_proj, v_proj, o_proj, "
                                         r"gate_proj, up_proj, down_proj, which the config "
                                         r"calibrates: .*the oracle"):
        layer.optical(h, IRIS, seed=0, calibration={"q_proj": held_out["q_proj"]})
    with pytest.raises(ValueError, match=r"^program_options: 'calibration' given beside "
                                         r"calibration= \(each weight matmul's held-out rows\), "
                                         r"which calibrates every weight matmul itself"):
        layer.optical(h, IRIS, seed=0, calibration=held_out,  # the mapping was ignored
                      program_options={"calibration": held_out["q_proj"]})
    assert calibration_needs(IRIS) and not calibration_needs(IDEAL)
    np.testing.assert_array_equal(
        layer.optical(h, IDEAL, seed=0, calibration={"q_proj": held_out["q_proj"]}),
        layer.optical(h, IDEAL, seed=0))


def test_another_layers_calibration_inputs_are_refused_unless_given_as_a_plain_dict(tiny):
    """A calibration shift audit: layer 0's held-out inputs, which have layer
    1's widths, calibrated layer 1 silently (its down_proj lost 16 dB). The
    inputs a layer gives (matmul_inputs, a trace's) name it; another layer
    refuses them, naming both; a plain dict of the same rows is the caller's
    choice and runs; the layer's own run as before."""
    h = tiny.hidden_states(1, 6)
    held = tiny.hidden_states(0, 8, seed=3)
    from_0 = tiny.layer(0).matmul_inputs(held)
    traced = tiny.layer(0).trace(held, dtype="float32").inputs
    assert isinstance(from_0, transformer.LayerInputs) and from_0.layer == 0
    assert traced.layer == 0 and traced.keys() == from_0.keys()
    assert from_0.copy().layer == 0 and type(from_0.copy()) is transformer.LayerInputs
    assert transformer.LayerTrace(np.zeros(1), {}, {}).inputs.layer is None
    for given in (from_0, traced, from_0.copy()):
        with pytest.raises(ValueError, match=r"^calibration: the inputs of layer 0, given to "
                                             r"layer 1; each layer calibrates on its own "
                                             r"\(layer\(1\)\.matmul_inputs\(held_out\)\)"):
            tiny.layer(1).optical(h, IRIS, seed=0, calibration=given)
    plain = tiny.layer(1).optical(h, IRIS, seed=0, calibration=dict(from_0))
    own = tiny.layer(1).matmul_inputs(tiny.hidden_states(1, 8, seed=3))
    assert own.layer == 1
    assert not np.array_equal(plain, tiny.layer(1).optical(h, IRIS, seed=0, calibration=own))
    np.testing.assert_array_equal(tiny.layer(0).optical(h, IRIS, seed=0, calibration=from_0),
                                  tiny.layer(0).optical(h, IRIS, seed=0,
                                                        calibration=dict(from_0)))


def test_calibration_errors_name_the_product_and_its_source(tiny):
    """An all-zero h calibrates q_proj on its own all-zero input; an all-zero
    held-out entry is named by its key (not a bare "calibration")."""
    layer = tiny.layer(1)
    h = tiny.hidden_states(1, 6)
    with pytest.raises(ValueError, match=r"^q_proj's own input \(the oracle: no calibration= "
                                         r"entry for it\): all \d+ entries are zero"):
        layer.optical(np.zeros_like(h), IRIS, seed=0)
    held_out = layer.matmul_inputs(tiny.hidden_states(1, 8, seed=3))
    held_out["gate_proj"] = np.zeros_like(held_out["gate_proj"])
    with pytest.raises(ValueError, match=r"^calibration\['gate_proj'\]: all \d+ entries are "
                                         "zero"):
        layer.optical(h, IRIS, seed=0, calibration=held_out)
    held_out["gate_proj"][0, 0] = np.nan
    with pytest.raises(ValueError, match=r"^calibration\['gate_proj'\]: .*NaN"):
        layer.optical(h, IRIS, seed=0, calibration=held_out)
    held_out["gate_proj"] = held_out["gate_proj"].astype(np.float16)
    with pytest.raises(TypeError, match=r"^calibration\['gate_proj'\]: dtype float16"):
        layer.optical(h, IRIS, seed=0, calibration=held_out)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the overflow itself
def test_an_input_zeroed_by_an_upstream_overflow_names_the_overflow(tiny):
    """Read noise of ~1e7 full-scale MACs per readout blows the layer up:
    o_proj's rows sum their squares past float32's largest in the
    post-attention RMSNorm, its 1/rms is 0 and gate_proj's own (oracle)
    calibration input is all zero. The error names the product whose rows
    the norm lost (a review: it named the first product past sqrt(float32
    max), the optical attention's scores, which no norm takes)."""
    layer = tiny.layer(2)
    h = tiny.hidden_states(2, 18, batch=2)
    cfg = optical.presets.get("wang-2022").replace({
        "detector.read_noise_electrons": 4e7, "mapping.attention": "optical",
        "outliers.policy": "static"})
    run = layer.trace(h, config=cfg.replace({"outliers.policy": "none"}), seed=1)
    assert not np.any(run.inputs["gate_proj"])  # as in float32 Hugging Face
    summed = np.sum(np.square(run.products["o_proj"].astype(np.float64)), axis=-1)
    assert np.all(summed > np.finfo(np.float32).max)  # every row: hence all zero
    with pytest.raises(ValueError, match=r"gate_proj's own input .* all \d+ entries are zero.*"
                                         r"an earlier product overflowed: o_proj's rows' "
                                         r"squares sum to [0-9.e+]+, past float32's largest"):
        layer.optical(h, cfg, seed=1)
    # Fed inf or NaN instead (the oracle path, where program() sees it first:
    # a review), the error names the product that gave them.
    wild = optical.presets.get("iris-like").replace({"detector.read_noise_electrons": 1e30})
    with pytest.raises(ValueError, match=r"own input \(the oracle.*\): contains \d+ NaN or "
                                         r"infinite value\(s\): attention.scores gave inf or "
                                         r"NaN"):
        layer.optical(h, wild, seed=1)


def test_an_error_not_of_the_calibration_is_not_blamed_on_it(tiny, monkeypatch):
    """Under a calibrating preset every product names its calibration source in
    the calibration's own errors; any other error of program() (here a
    stand-in that fails on its own: an unknown option, the case before, is
    refused before any product now) passes through as it was raised, not
    prefixed with the calibration source (which did nothing wrong)."""
    layer = tiny.layer(0)
    h = tiny.hidden_states(0, 4)
    assert optical.quant.calibration_needs(IRIS)  # q_proj gets a calibration source

    @functools.wraps(_engines.program)
    def failing(w, config, **kwargs):
        raise TypeError("program() failed on its own")

    monkeypatch.setattr(_engines, "program", failing)
    with pytest.raises(TypeError) as err:
        layer.optical(h, IRIS, seed=0)
    assert str(err.value) == "program() failed on its own"


def test_engine_options_reach_every_program_and_matmul_call(tiny, monkeypatch):
    h = tiny.hidden_states(0, 4)
    given = {"program": [], "matmul": []}
    for name in given:
        inner = getattr(_engines, name)

        def recording(*args, _inner=inner, _name=name, **kwargs):
            given[_name].append(kwargs)
            return _inner(*args, **kwargs)

        monkeypatch.setattr(_engines, name, functools.wraps(inner)(recording))
    tiny.layer(0).optical(h, IDEAL, seed=0,
                          program_options={"calibration": None},
                          matmul_options={"chunk_tokens": 3})
    products = len(_engines.weight_matmuls(tiny.layer(0).weights))
    assert len(given["program"]) == len(given["matmul"]) == products == 7  # q k v o gate up down
    assert all(kw == {"calibration": None} for kw in given["program"])
    assert all(kw["chunk_tokens"] == 3 for kw in given["matmul"])


def test_iris_like_errors_are_finite_and_worse_than_ideal(tiny):
    report = transformer.validate(tiny, layer=1, tokens=16, config=IRIS.replace(SMALL_CORE),
                                  local=True)
    for row in report.products:
        assert np.isfinite(row.sqnr_db) and 0 < row.sqnr_db < 60, row
        assert row.optical == (not row.name.startswith("attention."))
    ideal = transformer.validate(tiny, layer=1, tokens=16, config=IDEAL.replace(SMALL_CORE),
                                 dtype="float32")
    assert min(r.sqnr_db for r in ideal.products) > 70


# --------------------------------------------------------------------------- #
# Massive activations hurt the matmul they enter
# --------------------------------------------------------------------------- #

# Llama-3.2-1B's widths (hidden 2048, MLP 8192): the effect grows with width.
ONE_B = ModelSpec.from_config({**TINY_LLAMA, "hidden_size": 2048, "intermediate_size": 8192,
                               "num_attention_heads": 32, "num_key_value_heads": 8,
                               "head_dim": 64, "num_hidden_layers": 4})


def _down_proj_error(weights: dict, config, tokens: int = 32) -> tuple[float, float]:
    """(SQNR dB, first-token error / median other-token error) of down_proj under
    ``config``, on the input the reference layer feeds it."""
    model = LlamaModel(Path("1b"), ONE_B, None, seed=0)
    layer = LlamaLayer(ONE_B, 1, weights)
    act = layer.trace(model.hidden_states(1, tokens), dtype="float32").inputs["down_proj"]
    w = np.ascontiguousarray(weights["down_proj"].T)
    exact = act.astype(np.float64) @ w.astype(np.float64)
    y = optical.matmul(act, w, config, seed=1)
    err = np.linalg.norm(y - exact, axis=1)
    return optical.metrics.sqnr_db(exact, y), err[0] / np.median(err[1:])


@pytest.mark.slow
def test_massive_activations_hurt_down_proj_of_the_super_layer_unless_bypassed():
    # Without outlier handling the first token's super activation (~200) sets
    # its DAC range, so its other inputs quantise to zero and every readout's
    # error is scaled by it; the super weights set their mask columns' scale.
    naive = IRIS.replace({"outliers.policy": "none"})
    weights = llama_layer_weights(ONE_B, 1, seed=0)
    plain = llama_layer_weights(ONE_B, 1, seed=0, stats=SyntheticLlama(massive_dims=0))
    with_super, without = _down_proj_error(weights, naive), _down_proj_error(plain, naive)
    # The first token's error is an order of magnitude above the others' (it
    # is not without the super weight); the whole-tensor SQNR drops although
    # the massive outputs themselves add signal energy.
    assert with_super[1] > 10 and without[1] < 3, (with_super, without)
    assert with_super[0] < without[0] - 1.5, (with_super, without)
    # iris-like's outlier bypass (channels above 6x the median run digitally)
    # takes the massive channels off the optics: the first token is no worse
    # than the others and the matmul is no worse than without the super weight.
    bypassed = _down_proj_error(weights, IRIS)
    assert bypassed[1] < 3 and bypassed[0] > without[0] - 0.5, (bypassed, without)


def test_optical_attention_draws_independent_noise_per_batch_and_head():
    cfg = optical.presets.get("iris-like").replace(
        {"core.inputs": 48, "core.outputs": 40, "mapping.attention": "optical"})
    rng = np.random.default_rng(0)
    q1 = rng.standard_normal((1, 1, 12, 16)).astype(np.float32)
    k1 = rng.standard_normal((1, 1, 12, 16)).astype(np.float32)
    # the same operands in two prompts and two KV heads: (2, 2, 12, 16)
    q, k = np.tile(q1, (2, 2, 1, 1)), np.tile(k1, (2, 2, 1, 1))
    s = OpticalEngine(cfg, seed=3, layer=0).scores(q, k)
    exact = q1[0, 0] @ k1[0, 0].T
    blocks = [s[i, j] for i in range(2) for j in range(2)]
    for b in blocks:  # each is a noisy estimate of the same product...
        assert optical.metrics.relative_error(exact, b) < 0.2
    for a in range(4):  # ...with its own noise draw
        for b in range(a + 1, 4):
            assert not np.array_equal(blocks[a], blocks[b]), (a, b)


@pytest.mark.parametrize("attention", ["digital", "optical"])
def test_program_time_adds_up_every_programmed_mask(tiny, monkeypatch, attention):
    """program_s sums the programming of every mask: on a clock that ticks 1 s
    per reading, each program() call costs 1 s, so the total is the number of
    masks programmed: the 7 weights, plus K^T and V of each (prompt, KV head)
    when attention runs optically."""
    from optical.transformer import _engines

    ticks = iter(range(10**6))

    class Clock:
        @staticmethod
        def perf_counter():
            return float(next(ticks))

    monkeypatch.setattr(_engines, "time", Clock)
    cfg = IRIS.replace({**SMALL_CORE, "mapping.attention": attention})
    run = tiny.layer(1).trace(tiny.hidden_states(1, 6, batch=2), config=cfg, seed=0)
    masks = 7 + (2 * 2 * tiny.spec.num_kv_heads if attention == "optical" else 0)
    assert run.program_s == masks


def test_stats_of_per_head_products_pool_photons_and_clipping_by_their_counts():
    """sum_stats by hand: counts add, tile counts are one matmul's, the mean
    photoelectrons are total photons over total readouts and the clipped
    fraction is weighted by each part's ADC conversions."""
    from optical.core import MatmulStats
    from optical.transformer._engines import sum_stats

    def part(adc, readouts, mean_pe, clipped, digital_macs=0, fraction=0.0):
        return MatmulStats(tokens=4, k_tiles=2, n_tiles=3, input_passes=2, passes=48,
                           weight_loads=6, dac_conversions=10, adc_conversions=adc,
                           detector_readouts=readouts, macs=120,
                           detected_photons=mean_pe * readouts, mean_photoelectrons=mean_pe,
                           clipped_fraction=clipped, digital_channels=0,
                           digital_macs=digital_macs, digital_mac_fraction=fraction)

    pooled = sum_stats([part(100, 200, 10.0, 0.1), part(300, 600, 30.0, 0.5, 60, 0.25)])
    assert (pooled.k_tiles, pooled.n_tiles, pooled.input_passes) == (2, 3, 2)
    assert (pooled.tokens, pooled.passes, pooled.weight_loads, pooled.macs) == (8, 96, 12, 240)
    assert (pooled.adc_conversions, pooled.detector_readouts) == (400, 800)
    assert pooled.detected_photons == 2000.0 + 18000.0
    assert pooled.mean_photoelectrons == pytest.approx(20000.0 / 800, rel=1e-12)
    assert pooled.clipped_fraction == pytest.approx((0.1 * 100 + 0.5 * 300) / 400, rel=1e-12)
    # 60 digital MACs of the second part's 60 / 0.25 = 240 logical ones, plus the first's 120
    assert pooled.digital_mac_fraction == pytest.approx(60 / (120 + 240), rel=1e-12)


@pytest.mark.parametrize("inputs", ["offset", "split"])
def test_optical_attention_sends_the_causal_masks_zeros_through_the_dac(tiny, inputs):
    """The first token's probabilities are (1, 0, ..., 0): the masked zeros go
    to the core too. With offset inputs an 8-bit DAC cannot show 0, level
    0.5 = 127.5 / 255 becomes 128 / 255, so each zero reads as +1/255 of the
    row's range (1 here) and the first token gets v_0 + sum_{j>0} v_j / 255
    (MappingConfig.attention); split inputs leave zeros dark and exact."""
    cfg = IDEAL.replace({**SMALL_CORE, "mapping.attention": "optical", "dac.bits": 8,
                         "encoding.inputs": inputs})
    run = tiny.layer(0).trace(tiny.hidden_states(0, 12), config=cfg, seed=0)
    p, v, out = run.operands["attention.values"]  # (prompt, KV head, query rows, keys)
    first = np.argwhere((p[..., 0] == 1) & (p[..., 1:] == 0).all(axis=-1))
    assert len(first) >= 4  # token 0 of each of the 2 x 2 query heads
    for prompt, head, row in first:
        values = v[prompt, head].astype(np.float64)
        bias = values[1:].sum(axis=0) / 255 if inputs == "offset" else 0.0
        np.testing.assert_allclose(out[prompt, head, row], values[0] + bias, rtol=0, atol=1e-5)
        if inputs == "offset":
            assert np.abs(bias).max() > 1e-2  # the bias is seen, far above the tolerance


@pytest.mark.parametrize("attention", ["digital", "optical"])
def test_a_prompts_noise_depends_on_its_place_in_the_batch_not_its_neighbours(tiny, attention):
    """Noise is keyed by each token's row in the batch laid end to end (the
    ``seed`` docstring of LlamaLayer.optical): the first prompt of a batch
    draws the noise of its own call, a later one does not, and neither
    depends on the other prompts' values. A config without calibration, so
    that no window depends on the batch."""
    cfg = IRIS.replace({**SMALL_CORE, "mapping.attention": attention,
                        "adc.full_scale": "rms", "outliers.policy": "none"})
    assert optical.quant.calibration_needs(cfg) == []
    layer = tiny.layer(1)
    h = tiny.hidden_states(1, 8, batch=2)
    other = tiny.hidden_states(1, 8, batch=2, seed=5)
    both = layer.optical(h, cfg, seed=4)
    np.testing.assert_array_equal(both[0], layer.optical(h[:1], cfg, seed=4)[0])
    np.testing.assert_array_equal(both[1], layer.optical(np.stack([other[0], h[1]]), cfg,
                                                         seed=4)[1])
    np.testing.assert_array_equal(both[0], layer.optical(np.stack([h[0], other[1]]), cfg,
                                                         seed=4)[0])
    alone = layer.optical(h[1:], cfg, seed=4)[0]
    assert not np.array_equal(both[1], alone)
    reference = layer.reference(h[1:], dtype="float32")[0]
    # a different draw, not a different computation: both are as close to the reference
    errors = [optical.metrics.relative_error(reference, y) for y in (both[1], alone)]
    assert max(errors) < 1.5 * min(errors), errors


def test_derived_seeds_keep_their_labels_apart():
    """Every product, prompt and KV head of every layer draws its own noise:
    labels that would run together as text ((1, 12) and (11, 2); "ab" and
    ("a", "b")) give different seeds, each in [0, 2**63), and a label set
    always gives the same one."""
    from optical.transformer._engines import derive_seed

    seeds = [derive_seed(3, "attention.scores", 1, 12), derive_seed(3, "attention.scores", 11, 2),
             derive_seed(3, "ab"), derive_seed(3, "a", "b"), derive_seed(31, "a"),
             derive_seed(3, 1, "a"), derive_seed(3, "1a")]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(3, "attention.scores", 1, 12) == seeds[0]


def test_progress_is_called_once_per_product_as_it_starts(tiny, monkeypatch):
    """OpticalEngine's ``progress`` is "called with a product's name as it
    starts on the core": once per product, not once per (prompt, KV head) of
    an attention product (validate's bar counts one step per product: 7
    weights and 2 attention products), before any of its masks is programmed
    (it was called after the product: validate's bar named the product that
    had finished while the next one ran)."""
    from optical.transformer import _engines

    cfg = IRIS.replace({**SMALL_CORE, "mapping.attention": "optical"})
    events = []
    program = _engines.program

    def programming(*args, **kwargs):
        events.append("program")
        return program(*args, **kwargs)

    monkeypatch.setattr(_engines, "program", programming)
    tiny.layer(1).trace(tiny.hidden_states(1, 6, batch=2), config=cfg, seed=0,
                        progress=events.append)
    names = [e for e in events if e != "program"]
    assert names == ["q_proj", "k_proj", "v_proj", "attention.scores", "attention.values",
                     "o_proj", "gate_proj", "up_proj", "down_proj"]
    starts = [i for i, e in enumerate(events) if e != "program"]
    assert starts[0] == 0  # named before its first mask
    assert all(b - a > 1 for a, b in zip(starts, [*starts[1:], len(events)], strict=True))


def test_sum_stats_takes_the_tile_counts_of_the_first_part():
    """sum_stats: "tile counts are those of the first matmul" (the prompts of
    a padded BERT batch have other shapes); parts of three different tile
    counts tell first from last."""
    from optical.core import MatmulStats
    from optical.transformer._engines import sum_stats

    def part(k_tiles, n_tiles):
        return MatmulStats(tokens=4, k_tiles=k_tiles, n_tiles=n_tiles, input_passes=1,
                           passes=8, weight_loads=2, dac_conversions=10, adc_conversions=10,
                           detector_readouts=10, macs=120, detected_photons=5.0,
                           mean_photoelectrons=0.5, clipped_fraction=0.0, digital_channels=0,
                           digital_macs=0, digital_mac_fraction=0.0)

    pooled = sum_stats([part(2, 3), part(1, 1), part(5, 7)])
    assert (pooled.k_tiles, pooled.n_tiles, pooled.passes, pooled.macs) == (2, 3, 24, 360)


@pytest.mark.parametrize("attention", ["digital", "optical"])
def test_each_mask_is_programmed_once(tiny, monkeypatch, attention):
    """"Each weight programmed once per call", and with optical attention K^T
    and V of each (prompt, KV head) one mask each, in execution order: the
    calls to program() counted (programming twice changes no value, only
    the time, which the clock test reads around all programming at once)."""
    from optical.transformer import _engines

    calls = []
    real = _engines.program
    monkeypatch.setattr(_engines, "program",
                        lambda w, *a, **k: calls.append(w.shape) or real(w, *a, **k))
    cfg = IRIS.replace({**SMALL_CORE, "mapping.attention": attention})
    batch, tokens, spec = 2, 6, tiny.spec
    tiny.layer(1).trace(tiny.hidden_states(1, tokens, batch=batch), config=cfg, seed=0)
    weights = [(s.in_features, s.out_features) for s in spec.linear_shapes()]
    masks = [] if attention == "digital" else (
        [(spec.head_dim, tokens)] * (batch * spec.num_kv_heads)
        + [(tokens, spec.head_dim)] * (batch * spec.num_kv_heads))
    assert calls == weights[:3] + masks + weights[3:]
