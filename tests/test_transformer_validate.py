"""validate(): the report's numbers against metrics computed here, its counts
against layer_schedule, and the ``optical validate`` command."""

import dataclasses
import json
import math
import platform
import sys

import numpy as np
import pytest

import optical
from optical import metrics, transformer
from optical.cli import main
from optical.transformer.validate import worst_row, worst_row_sqnr_db
from tests.transformer_helpers import TINY_BERT, TINY_LLAMA, write_model

CFG = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
#: The same machine with nothing calibrated: every count is layer_schedule's.
NAIVE = CFG.replace({"adc.full_scale": "rms", "outliers.policy": "none"})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("tiny"), TINY_LLAMA)


def held_out_rows(model, layer, tokens, count, seed):
    """The documented held-out calibration set: ``count`` rows, evenly spaced,
    of each weight matmul's input in a float32 reference run of held-out
    prompts as long as the scored ones (``tokens``, or ``count`` if fewer),
    as many as hold ``count`` tokens."""
    length = min(tokens, count)
    prompts = math.ceil(count / length)
    held_out = model.hidden_states(layer, length, seed=seed, batch=prompts)
    inputs = model.layer(layer).trace(held_out, dtype="float32").inputs
    assert all(rows.shape[0] == prompts * length for rows in inputs.values())
    picked = np.rint(np.linspace(0, prompts * length - 1, count)).astype(int)
    return {name: rows[picked] for name, rows in inputs.items()}


def test_calibrated_machine_is_calibrated_on_a_held_out_input(tiny_dir):
    """iris-like calibrates its ADC windows and outlier channels: validate does
    it on each weight matmul's inputs in a float32 reference run of another
    input (seeded apart), never on the input it scores: 20 tokens, evenly
    spaced, of two held-out prompts of the scored 12 tokens (until
    2026-12-06, one prompt of 20 tokens, whatever the scored length)."""
    from optical.transformer._engines import derive_seed

    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=2, tokens=12, config=CFG, seed=3,
                                  calibration_tokens=20)
    assert (report.calibration_tokens, report.calibration_prompts) == (20, 2)
    assert "calibrated on 20 held-out tokens (2 prompts of 12)" in report.table()
    layer = model.layer(2)
    calibration = held_out_rows(model, 2, 12, 20, derive_seed(3, "calibration"))
    h = model.hidden_states(2, 12, seed=3, batch=1)
    run = layer.trace(h, config=CFG, seed=3, calibration=calibration)
    ref = layer.trace(h, dtype="float16")
    for row in report.products:
        assert row.sqnr_db == optical.metrics.sqnr_db(ref.products[row.name],
                                                      run.products[row.name]), row.name
    oracle = layer.trace(h, config=CFG, seed=3)  # calibrated on its own inputs
    assert not np.array_equal(oracle.output, run.output)


def test_held_out_input_is_as_long_as_programming_uses_by_default(tiny_dir):
    """Default calibration set: calibration.max_tokens held-out tokens, whatever
    the prompt length (programming subsamples to that many)."""
    model = transformer.load(tiny_dir)
    short = CFG.replace({"calibration.max_tokens": 8})

    def sqnrs(config, **kw):
        report = transformer.validate(model, layer=1, tokens=12, config=config, seed=5, **kw)
        return [row.sqnr_db for row in report.products] + [report.output.sqnr_db]

    assert sqnrs(short) == sqnrs(short, calibration_tokens=8)
    assert sqnrs(short) != sqnrs(short, calibration_tokens=12)
    few = CFG.replace({"calibration.max_tokens": 40})
    assert sqnrs(few) == sqnrs(few, calibration_tokens=40)  # more than the prompt's 12
    # the report says what it was calibrated on (nothing, for a naive machine)
    report = transformer.validate(model, layer=1, tokens=12, config=short, seed=5)
    assert report.calibration_tokens == report.to_dict()["calibration_tokens"] == 8
    assert "calibrated on 8 held-out tokens" in report.table()
    assert transformer.validate(model, layer=1, tokens=12, config=NAIVE).calibration_tokens is None


def test_matmul_inputs_are_the_traced_inputs_without_the_last_product(tiny_dir):
    """The calibration run records every weight matmul's input, bit for bit a
    full trace's, and stops before computing the last matmul."""
    from optical.transformer._engines import InputsComplete, ReferenceEngine

    model = transformer.load(tiny_dir)
    layer = model.layer(1)
    h = model.hidden_states(1, 9, seed=4, batch=2)
    # The documented default dtype is float32: what a float32 trace records.
    default, traced32 = layer.matmul_inputs(h), layer.trace(h, dtype="float32").inputs
    for name in traced32:
        np.testing.assert_array_equal(default[name], traced32[name], err_msg=name)
    for dtype in ("float32", "float16"):
        inputs = layer.matmul_inputs(h, dtype=dtype)
        traced = layer.trace(h, dtype=dtype).inputs
        assert list(inputs) == list(traced) == ["q_proj", "k_proj", "v_proj", "o_proj",
                                                "gate_proj", "up_proj", "down_proj"]
        for name in traced:
            np.testing.assert_array_equal(inputs[name], traced[name], err_msg=name)
    engine = ReferenceEngine("float32", stop_after=["a", "b"])
    x, w = np.ones((2, 3), np.float32), np.full((4, 3), 0.5, np.float32)
    np.testing.assert_array_equal(engine.linear("a", x, w), np.full((2, 4), 1.5))
    with pytest.raises(InputsComplete):
        engine.linear("b", 2 * x, w)
    assert list(engine.products) == ["a"] and engine.inputs["b"][0, 0] == 2
    from optical.transformer._engines import matmul_inputs
    with pytest.raises(ValueError, match="no weight matmul lm_head"):
        matmul_inputs(lambda e: layer._forward(h, e), ["q_proj", "lm_head"], "float32", 1)
    ran = []  # no names: refused before the layer runs
    with pytest.raises(ValueError, match="names: no weight matmul named"):
        matmul_inputs(ran.append, [], "float32", 1)
    assert ran == []


def test_report_timings_split_the_run(tiny_dir):
    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=1, tokens=12, config=CFG, seed=5)
    t = report.timings
    assert set(t) == {"setup_s", "calibration_s", "reference_s", "optical_s", "program_s",
                      "compare_s"}
    assert 0 < t["program_s"] < t["optical_s"] and t["calibration_s"] > 0
    assert f"programming the masks {t['program_s']:.2f} s" in report.table()
    assert "calibration run" in report.table()
    assert "calibration run" not in transformer.validate(model, layer=1, tokens=12,
                                                         config=NAIVE).table()
    # the heading names the hardware: a preset the config equals, else the
    # nearest preset and the fields it changes (presets.describe)
    assert "hardware iris-like with core.inputs=48, core.outputs=40;" in report.table()
    assert "hardware iris-like with" not in report.table(preset="mine")
    assert "hardware mine;" in report.table(preset="mine")
    ideal = transformer.validate(model, layer=1, tokens=3, config=optical.presets.get("ideal"))
    assert "hardware ideal;" in ideal.table()


def test_report_metrics_and_counts(tiny_dir):
    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=2, tokens=12, config=NAIVE, seed=3, batch=2,
                                  local=True)
    names = [r.name for r in report.products]
    assert names == ["q_proj", "k_proj", "v_proj", "attention.scores", "attention.values",
                     "o_proj", "gate_proj", "up_proj", "down_proj"]
    # the numbers are those of the two runs, recomputed here
    h = model.hidden_states(2, 12, seed=3, batch=2)
    layer = model.layer(2)
    ref = layer.trace(h, dtype="float16")
    run = layer.trace(h, config=NAIVE, seed=3)
    for row in report.products:
        assert row.sqnr_db == optical.metrics.sqnr_db(ref.products[row.name],
                                                      run.products[row.name])
    assert report.output.cosine == optical.metrics.cosine(ref.output, run.output)
    down = report.product("down_proj")
    x = run.inputs["down_proj"].astype(np.float64)
    exact = x @ layer.weights["down_proj"].T.astype(np.float64)
    assert down.local_sqnr_db == pytest.approx(optical.metrics.sqnr_db(exact,
                                                                       run.products["down_proj"]))
    # counts: those of layer_schedule, summed in the totals
    schedule = transformer.layer_schedule(model.spec, 12, NAIVE, batch=2)
    for name, expected in schedule.items():
        stats = report.product(name).stats
        assert {f.name: getattr(stats, f.name) for f in dataclasses.fields(expected)} == \
            expected.to_dict()
    assert report.totals["passes"] == sum(s.passes for s in schedule.values())
    assert report.totals["weight_loads"] == sum(s.weight_loads for s in schedule.values())
    assert report.product("attention.scores").stats is None  # digital by default
    text = report.table("iris-like")
    assert "down_proj" in text and "layer output" in text and "iris-like" in text
    rows = {line.split()[0] + (" output" if line.startswith("layer output") else ""):
            line.split() for line in text.splitlines() if line.strip()}
    assert rows["down_proj"][1] == "optical" and rows["attention.scores"][1] == "digital"
    assert rows["layer output"][2] == "-"  # not a product: it runs nowhere
    assert "worst dB: the lowest SQNR of one token's row" in text
    json.dumps(report.to_dict(), default=str)


def test_an_overflowing_product_is_named_in_a_note_not_a_warning(tiny_dir, tiny_bert_dir):
    """A warnings audit: read noise far past anything physical on wang-2022
    drives o_proj's rows past what the post-attention norm can square and
    sum in float32: numpy warned from llama.py (an exception under -W
    error, as this suite runs), and the table then read 0.00 dB for
    gate/up/down with no word why. The report names the product in a note
    (table and JSON) exactly where the norm's rows overflow (a review: a
    per-value bound, sqrt(float32 max), missed rows summing past it); a
    sane run has none."""
    model = transformer.load(tiny_dir)
    h = model.hidden_states(0, 8, seed=0)
    for noise, overflows in ((2.5e9, True), (1e9, False)):
        wild = optical.presets.get("wang-2022").replace({"detector.read_noise_electrons": noise})
        report = transformer.validate(model, layer=0, tokens=8, config=wild, seed=0)
        run = model.layer(0).trace(h, config=wild, seed=0)
        zero_rows = np.flatnonzero(~np.any(run.inputs["gate_proj"].reshape(8, -1), axis=-1))
        summed = np.sum(np.square(run.products["o_proj"].reshape(8, -1).astype(np.float64)), -1)
        assert (zero_rows.size > 0) == overflows  # rows the norm lost, by the trace
        np.testing.assert_array_equal(zero_rows, np.flatnonzero(summed > np.finfo(np.float32).max))
        if overflows:
            assert len(report.notes) == 1 and report.notes[0].startswith(
                "o_proj: rows whose squares sum past float32's largest")
            assert report.table().splitlines()[-1] == f"note: {report.notes[0]}"
            assert report.to_dict()["notes"] == list(report.notes)
        else:
            assert report.notes == () and report.to_dict()["notes"] == []
            assert not report.table().splitlines()[-1].startswith("note:")
    # BERT's LayerNorm warned the same way (its square of the centred rows).
    bert = transformer.load(tiny_bert_dir)
    wilder = optical.presets.get("wang-2022").replace(
        {"detector.read_noise_electrons": 4e9, "mapping.attention": "optical"})
    report = transformer.validate(bert, layer=0, tokens=8, config=wilder, seed=0)
    assert len(report.notes) == 1 and report.notes[0].startswith("attention.output: rows")
    sane = transformer.validate(bert, layer=0, tokens=8, config=NAIVE, seed=0)
    assert sane.notes == ()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_product_fed_inf_names_where_it_came_from(tiny_dir):
    """A review: read noise of 4e22 electrons (wang-2022) overflows float32
    outright, and the next product's check said "x: contains 512 NaN or
    infinite value(s)", naming neither the product nor the cause. It names
    both, and what to change. (numpy's own overflow and invalid-value
    warnings from the digital attention and softmax stay the caller's to
    handle, as the numerics module says.)"""
    model = transformer.load(tiny_dir)
    wild = optical.presets.get("wang-2022").replace({"detector.read_noise_electrons": 4e22})
    with pytest.raises(ValueError, match=r"^o_proj: its input contains \d+ NaN or infinite "
                                         r"value\(s\): attention.scores gave inf or NaN \(its "
                                         r"output overflowed float32\); lower the noise"):
        transformer.validate(model, layer=0, tokens=8, config=wild, seed=0)


@pytest.mark.parametrize("architecture", ["llama", "bert"])
def test_layer_update_scores_the_outputs_error_against_what_the_layer_adds(
        tiny_dir, tiny_bert_dir, architecture):
    """A Llama layer passes its input through exactly (the residual), so the
    output's SQNR counts it as signal without error; the update row scores
    the same error against output minus input, recomputed here in float64
    from the two runs. A BERT layer normalises its sum: no such row."""
    from optical.workloads import layer_metrics

    model = transformer.load(tiny_dir if architecture == "llama" else tiny_bert_dir)
    report = transformer.validate(model, layer=2 if architecture == "llama" else 1, tokens=8,
                                  config=NAIVE, seed=4, batch=2)
    if architecture == "bert":
        assert report.update is None and report.to_dict()["update"] is None
        assert "layer update" not in report.table()
        assert not any(k.startswith("update.") for k in layer_metrics(report))
        return
    h = model.hidden_states(2, 8, seed=4, batch=2).astype(np.float64)
    layer = model.layer(2)
    ref = layer.trace(h.astype(np.float32), dtype="float16").output.astype(np.float64)
    run = layer.trace(h.astype(np.float32), config=NAIVE, seed=4).output.astype(np.float64)
    expected = 10 * math.log10(np.sum((ref - h) ** 2) / np.sum((ref - run) ** 2))
    assert report.update.sqnr_db == pytest.approx(expected, rel=1e-6)
    assert report.update.cosine == pytest.approx(
        np.dot((ref - h).ravel(), (run - h).ravel())
        / np.linalg.norm(ref - h) / np.linalg.norm(run - h), rel=1e-6)
    # The residual is most of the output here: the output's SQNR reads higher.
    assert report.output.sqnr_db > report.update.sqnr_db + 1
    assert layer_metrics(report)["update.sqnr_db"] == report.update.sqnr_db
    line = next(row for row in report.table().splitlines() if row.startswith("layer update"))
    assert line.split()[2] == "-" and float(line.split()[3]) == round(expected, 2)
    assert report.to_dict()["update"]["sqnr_db"] == report.update.sqnr_db


@pytest.mark.parametrize("architecture", ["llama", "bert"])
def test_every_weight_matmul_and_the_output_get_a_worst_token_sqnr(tiny_dir, tiny_bert_dir,
                                                                  architecture):
    """Recomputed here row by row in float64: BERT's "attention.output" (its
    o_proj) too; only the two attention products, per head, get none."""
    directory = tiny_dir if architecture == "llama" else tiny_bert_dir
    model = transformer.load(directory)
    report = transformer.validate(model, layer=1, tokens=6, config=NAIVE, seed=3)
    h = model.hidden_states(1, 6, seed=3)
    layer = model.layer(1)
    ref, run = layer.trace(h, dtype="float16"), layer.trace(h, config=NAIVE, seed=3)

    def worst(a, b):  # (dB, token) of the first worst row
        a = a.reshape(-1, a.shape[-1]).astype(np.float64)
        b = b.reshape(a.shape).astype(np.float64)
        return min((10 * math.log10(np.sum(r**2) / np.sum((r - t) ** 2)), i)
                   for i, (r, t) in enumerate(zip(a, b, strict=True)) if np.any(r))

    for row in report.products:
        if row.name in ("attention.scores", "attention.values"):
            assert row.worst_token_sqnr_db is None and row.worst_token is None
        else:
            assert row.name in layer.weights or row.name + ".weight" in layer.weights
            db, token = worst(ref.products[row.name], run.products[row.name])
            assert row.worst_token_sqnr_db == pytest.approx(db, rel=1e-9), row.name
            assert row.worst_token == (0, token), row.name
    db, token = worst(ref.output, run.output)
    assert report.output.worst_token_sqnr_db == pytest.approx(db, rel=1e-9)
    assert report.output.worst_token == (0, token)
    assert {row.worst_token for row in report.products} - {None} != {(0, 0)}  # not a constant


@pytest.mark.parametrize("architecture", ["llama", "bert"])
def test_local_sqnr_of_optical_attention_is_against_its_own_operands(tiny_dir, tiny_bert_dir,
                                                                     architecture):
    """With attention on the core, --local gives the attention products the
    SQNR of their raw per-head output against the float64 product of the
    operands they received; those operands are the run's own (rebuilt here
    from its recorded products), and in the ideal limit the error vanishes."""
    directory = tiny_dir if architecture == "llama" else tiny_bert_dir
    model = transformer.load(directory)
    layer = model.layer(1)
    h = model.hidden_states(1, 6, seed=3, batch=2)
    cfg = NAIVE.replace({"mapping.attention": "optical"})
    report = transformer.validate(model, layer=1, tokens=6, config=cfg, seed=3, batch=2,
                                  local=True)
    run = layer.trace(h, config=cfg, seed=3)
    spec = model.spec
    heads, kv, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    v_name = "v_proj" if architecture == "llama" else "value"
    v = run.products[v_name].reshape(2, 6, kv, d).transpose(0, 2, 1, 3)
    probs, v_used, _ = run.operands["attention.values"]
    np.testing.assert_array_equal(v_used, v)  # V as the core received it
    scores = run.products["attention.scores"].reshape(probs.shape)
    masked = np.where(scores == 0, -np.inf, scores)  # masked entries are recorded as 0
    np.testing.assert_allclose(probs, np.nan_to_num(optical.transformer.numerics.softmax(
        masked.astype(np.float32))), rtol=1e-6, atol=1e-7)
    q, k_t, raw = run.operands["attention.scores"]
    if architecture == "bert":  # no RoPE: Q and K^T are the projections' outputs
        split = run.products["query"].reshape(2, 6, heads, d).transpose(0, 2, 1, 3)
        np.testing.assert_array_equal(q, split)
        np.testing.assert_array_equal(
            k_t, run.products["key"].reshape(2, 6, kv, d).transpose(0, 2, 3, 1))
    recorded = (raw.reshape(scores.shape) * np.float32(d ** -0.5)).astype(np.float32)
    np.testing.assert_array_equal(np.where(scores == 0, 0, recorded), scores)
    for name in ("attention.scores", "attention.values"):
        a, b, raw = run.operands[name]
        exact = np.einsum("bkmi,bkin->bkmn", a.astype(np.float64), b.astype(np.float64))
        row = report.product(name)
        assert row.optical and row.local_sqnr_db == pytest.approx(
            optical.metrics.sqnr_db(exact, raw), rel=1e-12), name
        assert 0 < row.local_sqnr_db < 60, name  # the noisy machine's own error
    # The totals count the attention products' passes, conversions and mask
    # loads (K^T and V of each prompt and KV head) beside the weight matmuls'.
    schedule = transformer.layer_schedule(spec, 6, cfg, batch=2)
    assert set(schedule) == {r.name for r in report.products if r.optical}
    for key in ("passes", "weight_loads", "dac_conversions", "adc_conversions",
                "detector_readouts", "macs"):
        assert report.totals[key] == sum(getattr(s, key) for s in schedule.values()), key
    linear_loads = sum(s.weight_loads for n, s in schedule.items()
                       if n not in ("attention.scores", "attention.values"))
    assert report.totals["weight_loads"] == linear_loads + 2 * 2 * kv
    ideal = transformer.validate(model, layer=1, tokens=6, seed=3, batch=2, local=True,
                                 config=optical.presets.get("ideal").replace(
                                     {"mapping.attention": "optical"}))
    for name in ("attention.scores", "attention.values"):
        assert ideal.product(name).local_sqnr_db > 120, name  # float32 rounding alone


def test_without_local_no_product_gets_a_local_sqnr(tiny_dir):
    """local=False (the default) computes no local SQNR, the optical attention
    products' included (their operands are recorded all the same), and the
    table has no 'local dB' column."""
    model = transformer.load(tiny_dir)
    cfg = NAIVE.replace({"mapping.attention": "optical"})
    report = transformer.validate(model, layer=1, tokens=6, config=cfg, seed=3)
    assert report.product("attention.scores").optical  # on the core, operands recorded
    assert [r.local_sqnr_db for r in report.products] == [None] * len(report.products)
    assert report.output.local_sqnr_db is None
    assert "local dB" not in report.table()


def test_table_columns_are_labelled_as_the_legend_names_them(tiny_dir):
    """The header's columns are the legend's: 'worst dB' (the lowest per-token
    SQNR, in dB), 'at' (that token) and, with local, 'local dB'; each row's
    worst-token figure sits under 'worst dB', its token under 'at'."""
    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=1, tokens=6, config=NAIVE, seed=3, local=True)
    lines = report.table().splitlines()
    assert str(report) == report.table()  # print(report) in a notebook: the table, not repr
    header = next(line for line in lines if line.startswith("product"))
    assert header.split()[:13] == ["product", "runs", "on", "SQNR", "dB", "cosine", "rel.err",
                                   "worst", "dB", "at", "local", "dB", "passes"]
    legend = next(line for line in lines if line.startswith("SQNR, cosine"))
    assert "worst dB: the lowest SQNR of one token's row, at that token" in legend
    assert "local dB:" in legend
    column = header.index("worst dB")
    down = next(line for line in lines if line.startswith("down_proj"))
    assert float(down[column:column + len("worst dB")]) == pytest.approx(
        report.product("down_proj").worst_token_sqnr_db, abs=0.006)
    at = header.index(" at") + 1
    assert down[at - 5:at + 2].strip() == str(report.product("down_proj").worst_token[1])


def test_worst_row_sqnr_is_the_minimum_over_rows():
    ref = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    test = np.array([[1.1, 0.0], [0.0, 2.0], [0.5, 0.0]])
    assert worst_row_sqnr_db(ref, test) == pytest.approx(10 * math.log10(1 / 0.01))
    assert worst_row_sqnr_db(ref, ref) == math.inf


def test_validate_errors(tiny_dir, tmp_path):
    model = transformer.load(tiny_dir)
    with pytest.raises(TypeError, match=r"config: expected an OpticalConfig, got str \(for "
                       r"the preset 'iris-like': optical.presets.get\('iris-like'\)\)"):
        transformer.validate(model, layer=0, tokens=4, config="iris-like")
    with pytest.raises(ValueError, match="layer: 7 is out of range"):
        transformer.validate(model, layer=7, tokens=4, config=CFG)
    with pytest.raises(ValueError, match="hidden: expected shape"):
        transformer.validate(model, layer=0, tokens=4, config=CFG,
                             hidden=np.zeros((1, 5, 64), np.float32))
    with pytest.raises(ValueError, match=r"hidden: expected shape \(1, 4, hidden\), got "
                                         r"\(2, 4, 64\)"):  # two prompts where batch is 1
        transformer.validate(model, layer=0, tokens=4, config=CFG,
                             hidden=np.zeros((2, 4, 64), np.float32))
    # The layer's checks of the input, naming it as validate's argument (they said h).
    for bad, error, message in [(np.zeros((1, 4, 64)), TypeError, "hidden: dtype float64"),
                                (np.full((1, 4, 64), np.nan, np.float32), ValueError,
                                 "hidden: contains NaN"),
                                (np.zeros((1, 4, 63), np.float32), ValueError,
                                 r"hidden: expected shape \(tokens, 64\)"),
                                ([[0.0] * 64] * 4, TypeError, "hidden: expected a numpy")]:
        with pytest.raises(error, match=message):
            transformer.validate(model, layer=0, tokens=4, config=CFG, hidden=bad)
    with pytest.raises(ValueError, match="tokens"):
        transformer.validate(model, layer=0, tokens=0, config=CFG)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="calibration_tokens"):
            transformer.validate(model, layer=0, tokens=4, config=CFG, calibration_tokens=bad)
    # The held-out tokens, in prompts of the scored length, are bounded as one
    # prompt is: a legal max_tokens of 2**24 drew 2**22 prompts of 4 tokens (24 GiB).
    # (A model of a short context, so that calibrating on the whole of it is quick.)
    model = transformer.load(write_model(tmp_path / "short", {
        **TINY_LLAMA, "max_position_embeddings": 96, "rope_scaling": None}))
    limit = model.spec.max_positions
    assert limit == 96
    with pytest.raises(ValueError, match=f"calibration_tokens: {limit + 1} exceed "
                                         f"max_position_embeddings {limit}"):
        transformer.validate(model, layer=0, tokens=4, config=CFG, calibration_tokens=limit + 1)
    report = transformer.validate(model, layer=0, tokens=4, seed=1,
                                  config=CFG.replace({"calibration.max_tokens": 1 << 24}))
    assert (report.calibration_tokens, report.calibration_prompts) == (limit, limit // 4)
    # A config that calibrates nothing ignores it, as it always has
    ideal = optical.presets.get("ideal")
    assert transformer.validate(model, layer=0, tokens=4, config=ideal,
                                calibration_tokens=limit + 1).calibration_tokens is None
    with pytest.raises(TypeError, match="model: expected a model from optical.transformer.load"):
        transformer.validate(42, layer=0, tokens=4, config=CFG)


def test_the_report_records_the_options_that_change_its_numbers(tiny_dir, tmp_path, capsys):
    """matmul_options (a backend, exact) change the numbers, and reports of
    the same call with and without them were alike in every other field (a
    reproduction audit): the report records them, as given (an array by its
    shape and dtype), and the CLI's JSON says there were none."""
    model = transformer.load(tiny_dir)
    kw = {"layer": 0, "tokens": 6, "config": NAIVE, "seed": 2}
    plain = transformer.validate(model, **kw)
    exact = transformer.validate(model, **kw, matmul_options={"exact": True,
                                                              "chunk_tokens": np.int64(4)})
    assert plain.output.sqnr_db != exact.output.sqnr_db
    assert plain.to_dict()["options"] == {"matmul_options": {}, "program_options": {}}
    assert exact.to_dict()["options"] == {"matmul_options": {"exact": True, "chunk_tokens": 4},
                                          "program_options": {}}
    with pytest.raises(TypeError):
        exact.options["matmul_options"]["exact"] = False  # read-only, as the report
    from optical.transformer.validate import _recorded

    assert _recorded({"calibration": np.zeros((3, 4), np.float32), "f": len}) == {
        "calibration": "ndarray (3, 4) float32", "f": "builtin_function_or_method"}
    out = tmp_path / "r.json"
    assert main(["validate", "--model", str(tiny_dir), "--tokens", "4", "--quiet",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["options"] == {"matmul_options": {},
                                                      "program_options": {}}


def test_numpy_integers_are_integers(tiny_dir):
    """Token counts computed with numpy (np.int64) are accepted and reported as int."""
    model = transformer.load(tiny_dir)
    kw = {"layer": 1, "config": NAIVE, "seed": 2}
    report = transformer.validate(model, tokens=np.int64(6), batch=np.int32(2), **kw)
    same = transformer.validate(model, tokens=6, batch=2, **kw)
    assert type(report.tokens) is int and type(report.batch) is int
    assert report.output.sqnr_db == same.output.sqnr_db
    np.testing.assert_array_equal(model.hidden_states(1, np.int64(6)), model.hidden_states(1, 6))


def test_cli_validate_prints_the_table_and_writes_json(tiny_dir, tmp_path, capsys):
    out = tmp_path / "report.json"
    argv = ["validate", "--model", str(tiny_dir), "--layer", "1", "--tokens", "8",
            "--preset", "iris-like", "--set", "core.inputs=48", "--set", "adc.bits=6",
            "--json", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "q_proj" in printed and "layer output" in printed and "adc.bits=6" in printed
    data = json.loads(out.read_text())
    assert data["layer"] == 1 and data["tokens"] == 8 and data["config"]["adc"]["bits"] == 6
    assert [p["name"] for p in data["products"]][:3] == ["q_proj", "k_proj", "v_proj"]
    # q_proj 64 -> 64 on a 48-input core: 8 tokens x 2 K-tiles x 1 N-tile, one input pass
    assert data["products"][0]["stats"]["passes"] == 8 * 2 * 1
    assert data["environment"]["numpy"] == np.__version__  # what its last bits depend on
    assert set(data["environment"]) == {"numpy", "numba", "jax", "jaxlib", "jax_cpu",
                                        "jax_device", "python", "machine", "optical_commit",
                                        "cpu", "blas"}
    assert data["environment"]["python"] == platform.python_version()


def test_cli_validate_json_tells_two_models_of_one_name_apart(tmp_path, capsys, monkeypatch):
    """Two directories named alike whose config.json differ (rms_norm_eps,
    rope_theta), or one before and after its checkpoint was rewritten, gave
    reports with the same identity ("model": "tiny", "weights": "synthetic
    (seed 0)") and other numbers; `--model .` recorded "model": "". The
    report records the directory, the checkpoint's fingerprint and the
    sampled digest a sweep's workload records, and the weights seed."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from optical.workloads import LayerWorkload
    from tests.transformer_helpers import random_llama_tensors

    def report(directory, *extra):
        assert main(["validate", "--model", str(directory), "--layer", "1", "--tokens", "4",
                     "--set", "core.inputs=48", "--quiet", "--json", "-", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    a = write_model(tmp_path / "a" / "tiny", TINY_LLAMA)
    b = write_model(tmp_path / "b" / "tiny", {**TINY_LLAMA, "rms_norm_eps": 1e-3})
    ra, rb = report(a), report(b)
    assert ra["model"] == rb["model"] == "tiny" and ra["output"] != rb["output"]
    assert (ra["model_dir"], rb["model_dir"]) == (str(a.resolve()), str(b.resolve()))
    assert ra["checkpoint"] is None and ra["weights_seed"] == 0
    assert ra["model_digest"] != rb["model_digest"]
    assert ra["model_digest"] == LayerWorkload(str(a), layer=1, tokens=4).model_digest
    monkeypatch.chdir(a)
    assert report(".")["model"] == "tiny"
    c = write_model(tmp_path / "c", TINY_LLAMA, random_llama_tensors(
        TINY_LLAMA, seed=1, dtype=ml_dtypes.bfloat16))
    first = report(c)
    write_model(c, TINY_LLAMA, random_llama_tensors(TINY_LLAMA, seed=2, dtype=ml_dtypes.bfloat16))
    second = report(c)
    assert first["checkpoint"] == second["checkpoint"] is not None  # same names and shapes
    assert first["model_digest"] != second["model_digest"]


def test_cli_validate_json_to_stdout_is_the_json_alone(tiny_dir, capsys):
    argv = ["validate", "--model", str(tiny_dir), "--layer", "1", "--tokens", "4",
            "--set", "core.inputs=48", "--quiet", "--json", "-"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["layer"], data["tokens"]) == (1, 4) and data["products"][0]["name"] == "q_proj"


@pytest.mark.parametrize(("changes", "steps"), [
    ({}, 1 + 1 + 7),  # calibration run, reference run, seven weight matmuls
    ({"adc.full_scale": "rms", "outliers.policy": "none", "mapping.attention": "optical"},
     1 + 7 + 2),  # nothing to calibrate; the attention products on the core too
])
def test_cli_validate_progress_bar_counts_every_step(tiny_dir, capsys, changes, steps):
    sets = [a for path, value in changes.items() for a in ("--set", f"{path}={value}")]
    argv = ["validate", "--model", str(tiny_dir), "--layer", "1", "--tokens", "6",
            "--set", "core.inputs=48", *sets]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"{steps}/{steps}" in err and "down_proj" in err
    assert main([*argv, "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_validate_progress_bar_names_the_product_that_is_running(tiny_dir, monkeypatch,
                                                                  capsys):
    """An observability audit: the bar named the product that had finished
    ("float16 reference" while q_proj ran, then q_proj while k_proj ran).
    Each mask's programming is marked on stderr: before the first, the bar
    shows q_proj; at the end it has counted every step."""
    from optical.transformer import _engines

    program = _engines.program

    def marked(*args, **kwargs):
        print("@program@", file=sys.stderr, flush=True)
        return program(*args, **kwargs)

    monkeypatch.setattr(_engines, "program", marked)
    transformer.validate(transformer.load(tiny_dir), layer=1, tokens=6, config=NAIVE,
                         progress=True)
    parts = capsys.readouterr().err.split("@program@")
    assert len(parts) == 1 + 7
    assert "q_proj]" in parts[0] and "k_proj]" not in parts[0]
    assert "k_proj]" in parts[1] and "down_proj]" in parts[6]
    assert "8/8" in parts[7]


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "no/such/dir"], "no such model directory"),
    (["--layer", "9"], "layer: 9 is out of range"),
    (["--tokens", "0"], "--tokens: 0 must be a positive integer"),
    # validate()'s own check, named as the option (it said "tokens:")
    (["--tokens", "200000"], "error: --tokens: 200000 exceed max_position_embeddings 131072"),
    (["--batch", "0"], "--batch: 0 must be a positive integer"),
    (["--set", "mapping.attention=maybe"], "mapping.attention"),
])
def test_cli_validate_bad_input_is_one_clear_line(tiny_dir, argv, message, capsys):
    base = ["validate", "--model", str(tiny_dir), "--tokens", "4"]
    assert main(base + argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# --------------------------------------------------------------------------- #
# Each option of ``optical validate`` against validate() called with its argument
# --------------------------------------------------------------------------- #

#: CFG (and NAIVE) as ``--set`` options on top of the iris-like preset.
CORE_SETS = ("core.inputs=48", "core.outputs=40")
NAIVE_SETS = (*CORE_SETS, "adc.full_scale=rms", "outliers.policy=none")
IDEAL = optical.presets.get("ideal").replace({"core.inputs": 48, "core.outputs": 40})


def _sets(overrides):
    return [a for item in overrides for a in ("--set", item)]


def _as_written(data):
    """``data`` as ``--json`` writes it: standard JSON, non-finite floats as strings."""
    return json.loads(json.dumps(data, default=lambda value: value.item()),
                      parse_constant=lambda name: str(float(name)))


def _cli_report(capsys, *argv):
    """What ``optical validate ARGV --quiet --json -`` writes, less its wall times."""
    assert main(["validate", *argv, "--quiet", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    del data["timings"]
    return data


def _api_report(report, preset, overrides, directory, weights_seed=0):
    """What the command writes for ``report`` run on ``preset`` + ``overrides``
    with the model in ``directory``."""
    from optical._version import RESULTS_VERSION
    from optical.commands.validate import model_identity
    from optical.kernels import environment

    data = _as_written(report.to_dict())
    del data["timings"]
    data.update(model_identity(transformer.load(directory, seed=weights_seed)),
                weights_seed=weights_seed)
    return {**data, "preset": preset, "overrides": list(overrides), "config_file": None,
            "environment": environment(), "optical_version": optical.__version__,
            "results_version": RESULTS_VERSION}


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("bert"), TINY_BERT)


def test_cli_validate_batch_is_validate_of_that_many_prompts(tiny_dir, capsys):
    """--batch 2: validate(batch=2), and two prompts through masks loaded once:
    every optical product streams twice the rows, with the same mask loads."""
    argv = ["--model", str(tiny_dir), "--layer", "1", "--tokens", "6", *_sets(CORE_SETS)]
    one = _cli_report(capsys, *argv)
    two = _cli_report(capsys, *argv, "--batch", "2")
    model = transformer.load(tiny_dir)
    assert two == _api_report(transformer.validate(model, layer=1, tokens=6, config=CFG, batch=2),
                              "iris-like", CORE_SETS, tiny_dir)
    assert one == _api_report(transformer.validate(model, layer=1, tokens=6, config=CFG),
                              "iris-like", CORE_SETS, tiny_dir)
    assert (one["batch"], two["batch"]) == (1, 2)
    on_core = [(a["stats"], b["stats"]) for a, b in zip(one["products"], two["products"],
                                                        strict=True) if a["optical"]]
    assert len(on_core) == 7
    for a, b in on_core:
        for count in ("passes", "dac_conversions", "adc_conversions", "macs"):
            assert b[count] == 2 * a[count], count
        assert b["weight_loads"] == a["weight_loads"]
    assert two["totals"]["weight_loads"] == one["totals"]["weight_loads"]


def test_cli_validate_defaults_to_the_first_layer(tiny_dir, capsys):
    argv = ["--model", str(tiny_dir), "--tokens", "4", *_sets(NAIVE_SETS)]
    data = _cli_report(capsys, *argv)
    assert data["layer"] == 0
    assert data == _cli_report(capsys, *argv, "--layer", "0")


def test_cli_validate_seed_seeds_input_and_noise_not_the_weights(tiny_dir, capsys):
    """--seed S: validate(seed=S) on the model load() gives (synthetic
    weights of seed 0, as a checkpoint's weights take no seed); the same seed
    twice gives the same report, another seed another one."""
    argv = ["--model", str(tiny_dir), "--layer", "1", "--tokens", "6", *_sets(CORE_SETS)]
    seven = _cli_report(capsys, *argv, "--seed", "7")
    assert _cli_report(capsys, *argv, "--seed", "7") == seven
    expected = transformer.validate(transformer.load(tiny_dir), layer=1, tokens=6,
                                    config=CFG, seed=7)
    assert seven == _api_report(expected, "iris-like", CORE_SETS, tiny_dir)
    assert (seven["seed"], seven["weights"]) == (7, "synthetic (seed 0)")
    eight = _cli_report(capsys, *argv, "--seed", "8")
    assert eight["weights"] == "synthetic (seed 0)"
    for a, b in zip(seven["products"], eight["products"], strict=True):
        assert a["sqnr_db"] != b["sqnr_db"], a["name"]
    # the default is seed 0
    default = _cli_report(capsys, *argv)
    assert default == _api_report(transformer.validate(transformer.load(tiny_dir), layer=1,
                                                       tokens=6, config=CFG),
                                  "iris-like", CORE_SETS, tiny_dir)
    assert default["seed"] == 0


def test_cli_validate_reproduces_a_layer_sweep_run(tiny_dir, capsys):
    """A --model sweep's run at seed 7 is `optical validate --seed 7`, figure
    for figure (both keep the synthetic weights at seed 0: the CLI seeded
    them with --seed, so a seed spread mixed models); with --weights-seed W
    it is the sweep's --weights-seed W run."""
    argv = ["--model", str(tiny_dir), "--layer", "1", "--tokens", "6", *_sets(CORE_SETS)]
    report = _cli_report(capsys, *argv, "--seed", "7")
    assert report["weights"] == "synthetic (seed 0)" and report["seed"] == 7
    run = optical.LayerWorkload(str(tiny_dir), layer=1, tokens=6).run(CFG, 7)
    assert run["sqnr_db"] == report["output"]["sqnr_db"]
    for row in report["products"]:
        assert run[f"sqnr_db.{row['name']}"] == row["sqnr_db"], row["name"]
    other = _cli_report(capsys, *argv, "--seed", "7", "--weights-seed", "5")
    assert other["weights"] == "synthetic (seed 5)"
    assert other["output"]["sqnr_db"] == optical.LayerWorkload(
        str(tiny_dir), layer=1, tokens=6, weights_seed=5).run(CFG, 7)["sqnr_db"] != run["sqnr_db"]
    # and a run of a sweep with --data-seed 2 is --seed 7 --data-seed 2
    held = optical.LayerWorkload(str(tiny_dir), layer=1, tokens=6, data_seed=2).run(CFG, 7)
    report = _cli_report(capsys, *argv, "--seed", "7", "--data-seed", "2")
    assert held["sqnr_db"] == report["output"]["sqnr_db"] != run["sqnr_db"]


#: iris-like on the tiny core, calibrated (ADC windows, outlier channels) but
#: without noise: no shot, dark, read, RIN or converter noise left.
NOISELESS = CFG.replace({"source.photons_per_mac": math.inf, "source.rin_db_per_hz": -math.inf,
                         "adc.enob_loss": 0.0})


def test_data_seed_holds_the_input_and_calibration_so_seeds_differ_in_noise_alone(tiny_dir):
    """validate(seed=S, data_seed=D) draws the layer input and the held-out
    calibration input from D: on a calibrated machine without noise it is
    validate(seed=D) to the bit, whatever S; with noise, S moves the noise
    only (its input is D's), and the report says which data seed it used."""
    model = transformer.load(tiny_dir)
    assert NOISELESS.detector.read_noise_electrons > 0  # negligible only against inf light
    plain = transformer.validate(model, layer=1, tokens=6, config=NOISELESS, seed=3)
    for seed in (0, 9):
        held = transformer.validate(model, layer=1, tokens=6, config=NOISELESS, seed=seed,
                                    data_seed=3)
        assert held.output == plain.output and held.products == plain.products
        assert (held.seed, held.data_seed, plain.data_seed) == (seed, 3, None)
    other = transformer.validate(model, layer=1, tokens=6, config=NOISELESS, seed=9)
    assert other.output.sqnr_db != plain.output.sqnr_db  # the data, not the noise, moved it
    # With noise: seed S with data seed D is the noise of S on D's input and calibration.
    from optical.transformer._engines import derive_seed

    noisy = transformer.validate(model, layer=1, tokens=6, config=CFG, seed=9, data_seed=3)
    layer = model.layer(1)
    run = layer.trace(model.hidden_states(1, 6, seed=3, batch=1), config=CFG, seed=9,
                      calibration=held_out_rows(model, 1, 6, CFG.calibration.max_tokens,
                                                derive_seed(3, "calibration")))
    ref = layer.trace(model.hidden_states(1, 6, seed=3, batch=1), dtype="float16")
    assert noisy.output.sqnr_db == metrics.sqnr_db(ref.output, run.output)
    assert "seed 9, data seed 3" in noisy.table()
    with pytest.raises(ValueError, match="data_seed: -1 is out of range"):
        transformer.validate(model, layer=1, tokens=6, config=CFG, data_seed=-1)


def test_cli_validate_data_seed_is_validate_s_not_the_weights(tiny_dir, capsys):
    """--data-seed D: validate(data_seed=D) on the weights load() gives (seed
    0), as the JSON records; --weights-seed W: on load(seed=W)'s."""
    argv = ["--model", str(tiny_dir), "--layer", "1", "--tokens", "6", *_sets(CORE_SETS)]
    data = _cli_report(capsys, *argv, "--seed", "7", "--data-seed", "2")
    expected = transformer.validate(transformer.load(tiny_dir), layer=1, tokens=6,
                                    config=CFG, seed=7, data_seed=2)
    assert data == _api_report(expected, "iris-like", CORE_SETS, tiny_dir)
    assert (data["seed"], data["data_seed"], data["weights"]) == (7, 2, "synthetic (seed 0)")
    weights = _cli_report(capsys, *argv, "--seed", "7", "--data-seed", "2", "--weights-seed", "3")
    assert weights == _api_report(transformer.validate(
        transformer.load(tiny_dir, seed=3), layer=1, tokens=6, config=CFG, seed=7, data_seed=2),
        "iris-like", CORE_SETS, tiny_dir, weights_seed=3)
    assert weights["weights"] == "synthetic (seed 3)"
    assert _cli_report(capsys, *argv)["data_seed"] is None


@pytest.mark.parametrize("architecture", ["llama", "bert"])
def test_cli_validate_dtype_is_the_reference_dtype(tiny_dir, tiny_bert_dir, capsys,
                                                   architecture):
    """--dtype under the ideal preset: the optical run is float32 arithmetic, so
    against a float32 reference the layer output is exact to float32 rounding,
    and against fp16 / bf16 the error is the reference's own rounding: within a
    decade of that dtype's unit roundoff (2**-11, 2**-8)."""
    directory = tiny_dir if architecture == "llama" else tiny_bert_dir
    argv = ["--model", str(directory), "--layer", "1", "--tokens", "8", "--preset", "ideal",
            *_sets(CORE_SETS)]
    reports = {dtype: _cli_report(capsys, *argv, "--dtype", dtype)
               for dtype in ("float32", "float16", "bfloat16")}
    error = {dtype: data["output"]["relative_error"] for dtype, data in reports.items()}
    assert error["float32"] < 1e-5 and reports["float32"]["output"]["sqnr_db"] > 100
    for dtype, unit_roundoff in (("float16", 2.0**-11), ("bfloat16", 2.0**-8)):
        assert unit_roundoff / 10 < error[dtype] < 10 * unit_roundoff, dtype
    model = transformer.load(directory)
    for dtype, data in reports.items():
        assert data["reference_dtype"] == dtype
        expected = transformer.validate(model, layer=1, tokens=8, config=IDEAL, dtype=dtype)
        assert data == _api_report(expected, "ideal", CORE_SETS, directory), dtype


@pytest.mark.parametrize("architecture", ["llama", "bert"])
def test_cli_validate_local_is_each_matmul_against_its_own_exact_product(
        tiny_dir, tiny_bert_dir, capsys, architecture):
    """--local adds, for each weight matmul, the SQNR of its optical product
    against the float64 product (bias included) of the inputs it received,
    recomputed here from a trace of the same run; it changes nothing else."""
    directory = tiny_dir if architecture == "llama" else tiny_bert_dir
    argv = ["--model", str(directory), "--layer", "1", "--tokens", "6", "--seed", "3",
            *_sets(NAIVE_SETS)]
    plain = _cli_report(capsys, *argv)
    local = _cli_report(capsys, *argv, "--local")
    assert all(row["local_sqnr_db"] is None for row in plain["products"])
    without = {**local, "products": [{**row, "local_sqnr_db": None}
                                     for row in local["products"]]}
    assert without == plain

    model = transformer.load(directory)  # weights of seed 0, whatever --seed
    layer = model.layer(1)
    run = layer.trace(model.hidden_states(1, 6, seed=3, batch=1), config=NAIVE, seed=3)
    checked = 0
    for row in local["products"]:
        name = row["name"]
        if not row["optical"]:  # the attention products, digital here
            assert row["local_sqnr_db"] is None, name
            continue
        exact = run.inputs[name].astype(np.float64) @ layer.weights[name].T.astype(np.float64)
        if name + ".bias" in layer.weights:
            exact = exact + layer.weights[name + ".bias"]
        assert row["local_sqnr_db"] == pytest.approx(
            optical.metrics.sqnr_db(exact, run.products[name]), rel=1e-12), name
        checked += 1
    assert checked == (7 if architecture == "llama" else 6)

    # the table gets a column of them
    assert main(["validate", *argv, "--local", "--quiet"]) == 0
    assert "local dB" in capsys.readouterr().out
    assert main(["validate", *argv, "--quiet"]) == 0
    assert "local dB" not in capsys.readouterr().out


def test_cli_validate_local_leaves_out_the_error_from_upstream(tiny_dir, capsys):
    """Ideal optics against an fp16 reference: every product's end-to-end SQNR
    is the reference's fp16 rounding (under 80 dB), its local SQNR float32
    rounding alone (over 100 dB)."""
    data = _cli_report(capsys, "--model", str(tiny_dir), "--layer", "1", "--tokens", "8",
                       "--preset", "ideal", *_sets(CORE_SETS), "--local")
    weight_matmuls = [row for row in data["products"] if row["optical"]]
    assert len(weight_matmuls) == 7
    for row in weight_matmuls:
        assert row["sqnr_db"] < 80 < 100 < row["local_sqnr_db"], row["name"]


def test_cli_validate_calibrates_a_model_with_fewer_positions_than_max_tokens(
        tiny_bert_dir, capsys):
    """A prompt of 8 tokens on a BERT of 64 positions, on the default machine:
    calibrated on max_position_embeddings held-out tokens (below max_tokens
    256) as 8 prompts of 8 (until 2026-12-06, one prompt of 64)."""
    assert json.loads((tiny_bert_dir / "config.json").read_text())[
        "max_position_embeddings"] < CFG.calibration.max_tokens
    data = _cli_report(capsys, "--model", str(tiny_bert_dir), "--layer", "1", "--tokens", "8",
                       *_sets(CORE_SETS))
    assert (data["calibration_tokens"], data["calibration_prompts"]) == (64, 8)
    assert data["hidden_given"] is False


def test_worst_row_sqnr_over_many_row_blocks(rng):
    """Rows are summed a block at a time: the same as a float64 sum per row."""
    from optical import metrics

    ref = rng.standard_normal((3 * metrics.SUM_CHUNK // 500 + 7, 500)).astype(np.float32)
    test = ref + (rng.standard_normal(ref.shape) * np.linspace(0.01, 0.1, ref.shape[0])[:, None]
                  ).astype(np.float32)
    test[-1] += 1.0  # the worst row is the last, in the last block
    r, t = ref.astype(np.float64), test.astype(np.float64)
    expected = min(10 * math.log10(math.fsum(a * a) / math.fsum((a - b) ** 2))
                   for a, b in zip(r, t, strict=True))
    assert worst_row_sqnr_db(ref, test) == pytest.approx(expected, rel=1e-12)


def test_worst_token_names_its_prompt_and_position_in_a_batch(tiny_dir):
    """A batch of 3 prompts of 5 tokens with one token made worst by hand:
    worst_row finds its (prompt, position); the report's table prints it as
    prompt:token and its JSON as a list. Zero rows (no signal) are skipped."""
    from optical.transformer.validate import worst_row

    rng = np.random.default_rng(4)
    ref = rng.standard_normal((3, 5, 16))
    test = ref + 0.01 * rng.standard_normal(ref.shape)
    test[2, 3] += 0.5
    ref[0, 1] = 0.0  # no signal: an infinitely bad row that does not count
    db, where = worst_row(ref, test)
    assert where == (2, 3)
    assert db == pytest.approx(10 * math.log10(np.sum(ref[2, 3] ** 2)
                                               / np.sum((ref[2, 3] - test[2, 3]) ** 2)))
    assert worst_row(ref[2], test[2]) == (db, (3,))
    assert worst_row(np.zeros((2, 3)), np.ones((2, 3))) == (-math.inf, None)

    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=1, tokens=5, batch=3, config=NAIVE, seed=3)
    h = model.hidden_states(1, 5, seed=3, batch=3)
    ref = model.layer(1).trace(h, dtype="float16")
    run = model.layer(1).trace(h, config=NAIVE, seed=3)

    def worst_place(a, b):  # (prompt, position) of the lowest per-token SQNR, by loops
        a = a.reshape(3, 5, -1).astype(np.float64)
        b = b.reshape(3, 5, -1).astype(np.float64)
        return min((10 * math.log10(np.sum(a[p, t] ** 2) / np.sum((a[p, t] - b[p, t]) ** 2)),
                    (p, t)) for p in range(3) for t in range(5))[1]

    places = set()
    for row in (*report.products, report.output):
        if row.worst_token is None:
            continue
        products = (ref.output, run.output) if row is report.output else \
            (ref.products[row.name], run.products[row.name])
        assert row.worst_token == worst_place(*products), row.name
        places.add(row.worst_token)
    assert len(places) > 1 and any(p > 0 for p, _ in places)  # not a constant, not prompt 0
    prompt, token = report.output.worst_token
    line = next(x for x in report.table().splitlines() if x.startswith("layer output"))
    assert line.split()[7] == f"{prompt}:{token}"
    assert report.to_dict()["output"]["worst_token"] == [prompt, token]


def test_worst_row_sqnr_of_an_all_zero_reference():
    zero = np.zeros((3, 4))
    assert worst_row_sqnr_db(zero, zero) == math.inf
    assert worst_row_sqnr_db(zero, zero + 0.1) == -math.inf


def test_worst_row_sqnr_at_any_magnitude_and_of_nan():
    """A metrics audit: float64 rows near 1e200 squared to inf (NaN), near
    1e-200 to 0 ("every row zero"), and NaN was ranked, where the pair
    metrics scale by a power of two first and refuse NaN."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((4, 16))
    test = ref + 0.1 * rng.standard_normal((4, 16))
    test[2] = ref[2] + 0.5 * rng.standard_normal(16)  # the worst row
    db, where = worst_row(ref, test)
    for scale in (1e200, 1e-200):
        assert worst_row(ref * scale, test * scale) == (pytest.approx(db, abs=1e-9), where)
    assert where == (2,)
    # rows far apart in magnitude keep their own SQNRs (the diff review: one
    # shared scale read the 1e-100 row as zero and named the 1e100 one)
    spread = np.stack([ref[0] * 1e100, ref[2] * 1e-100])
    assert worst_row(spread, np.stack([test[0] * 1e100, test[2] * 1e-100])) == \
        (pytest.approx(db, abs=1e-9), (1,))
    bad = test.copy()
    bad[1, 3] = np.nan
    with pytest.raises(ValueError, match="test contains NaN or infinite values"):
        worst_row(ref, bad)


def test_report_output_and_every_total_against_recomputed_values(tiny_dir):
    naive = optical.presets.get("iris-like").replace({
        "core.inputs": 48, "core.outputs": 40, "adc.full_scale": "rms",
        "outliers.policy": "none"})
    m = transformer.load(tiny_dir)
    report = transformer.validate(m, layer=2, tokens=12, config=naive, seed=3)
    h = m.hidden_states(2, 12, seed=3, batch=1)  # what validate draws
    layer = m.layer(2)
    ref = layer.trace(h, dtype="float16")
    run = layer.trace(h, config=naive, seed=3)
    sqnr, cosine, rel = metrics.compare(ref.output, run.output)
    out = report.output
    assert (out.sqnr_db, out.cosine, out.relative_error) == (sqnr, cosine, rel)
    assert out.worst_token_sqnr_db == worst_row_sqnr_db(ref.output, run.output)
    schedule = transformer.layer_schedule(m.spec, 12, naive)
    for key in ("passes", "weight_loads", "dac_conversions", "adc_conversions",
                "detector_readouts", "macs"):
        assert report.totals[key] == sum(getattr(s, key) for s in schedule.values()), key


def test_the_digital_cost_of_an_outlier_bypass_is_reported_and_swept(tiny_dir):
    """With outlier channels multiplied digitally (iris-like's static bypass),
    the totals, the table and a layer sweep's metrics say how many MACs ran
    digitally and their share of the layer's (layer_schedule's MACs, which
    count every channel), and the ADC clipping pooled over the products."""
    from optical.workloads import layer_metrics

    model = transformer.load(tiny_dir)
    bypass = CFG.replace({"outliers.threshold": None, "outliers.top_k": 3})  # 3 per product
    report = transformer.validate(model, layer=2, tokens=12, config=bypass, seed=3)
    rows = [r for r in report.products if r.stats is not None]
    shapes = {s.name: s for s in model.spec.linear_shapes()}
    digital = sum(12 * r.stats.digital_channels * shapes[r.name].out_features for r in rows)
    assert digital > 0
    logical = sum(s.macs for s in transformer.layer_schedule(model.spec, 12, bypass).values())
    assert report.totals["digital_macs"] == digital
    assert report.totals["digital_mac_fraction"] == pytest.approx(digital / logical, rel=1e-12)
    clipped = sum(r.stats.clipped_fraction * r.stats.adc_conversions for r in rows)
    assert report.totals["clipped_fraction"] == pytest.approx(
        clipped / sum(r.stats.adc_conversions for r in rows), rel=1e-12)
    assert f"digital (outlier channels) MACs {digital}" in report.table()
    flat = layer_metrics(json.loads(json.dumps(report.to_dict(), default=str)))
    assert flat == layer_metrics(report)
    assert flat["totals.digital_mac_fraction"] == report.totals["digital_mac_fraction"]
    for r in rows:
        assert flat[f"digital_mac_fraction.{r.name}"] == \
            r.stats.digital_channels / shapes[r.name].in_features
        assert flat[f"clipped_fraction.{r.name}"] == r.stats.clipped_fraction
    # Without a bypass: no digital MACs, and the table says nothing of them.
    plain = transformer.validate(model, layer=2, tokens=12, config=NAIVE, seed=3)
    assert plain.totals["digital_macs"] == 0 and plain.totals["digital_mac_fraction"] == 0.0
    assert "digital (outlier channels)" not in plain.table()


def test_cli_validate_defaults_to_256_tokens_as_the_readme_says():
    """The README's main job and --help rest on 256 tokens (sweep's default is
    512, energy's 2048): the default is what they say."""
    from optical.cli import build_parser

    args = build_parser().parse_args(["validate", "--model", "models/llama-3.1-8b"])
    assert (args.tokens, args.layer) == (256, 0)


def test_validate_takes_any_path_like_model(tiny_dir):
    """The docstring's "path of a model directory": an os.PathLike that is
    not a pathlib.Path was refused as not a model (load takes it)."""

    class Where:
        def __fspath__(self):
            return str(tiny_dir)

    ideal = optical.presets.get("ideal")
    by_path = transformer.validate(Where(), layer=0, tokens=4, config=ideal, seed=0)
    by_str = transformer.validate(str(tiny_dir), layer=0, tokens=4, config=ideal, seed=0)
    assert by_path.to_dict()["products"] == by_str.to_dict()["products"]


def test_largest_row_square_sum_is_the_float64_sum_over_the_last_axis():
    """The overflow notes' measure, taken a block of rows at a time (a
    float64 copy of a whole batch of embeddings was hundreds of MB): the
    largest of the rows' sums of squares, inf where a row is not finite."""
    from optical.transformer._engines import largest_row_square_sum

    rng = np.random.default_rng(0)
    value = (rng.standard_normal((3, 1500, 7)) * 1e19).astype(np.float32)  # 4500 rows
    expected = np.max(np.sum(np.square(value.astype(np.float64)), axis=-1))
    assert largest_row_square_sum(value) == pytest.approx(expected, rel=1e-12)
    assert expected > np.finfo(np.float32).max  # (past float32: the float64 sum holds it)
    value[2, 1400, 3] = np.inf
    assert largest_row_square_sum(value) == np.inf
    value[2, 1400, 3] = np.nan
    assert largest_row_square_sum(value) == np.inf
