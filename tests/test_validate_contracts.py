"""Contracts of validate()'s report left open by a mutation audit (mut18):
every number of the table under its column and equal to the report's, the
totals row aligned and equal to the totals, the heading's preset, the
detected photons summed over the products, the calibration length reported
only where the config calibrates, and the timings splitting the wall clock."""

import time

import pytest

import optical
from optical import transformer
from optical.transformer import llama
from tests.transformer_helpers import TINY_LLAMA, write_model

#: iris-like on a small core, nothing calibrated (no held-out run).
NAIVE = optical.presets.get("iris-like").replace({
    "core.inputs": 48, "core.outputs": 40, "adc.full_scale": "rms", "outliers.policy": "none"})


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("tiny"), TINY_LLAMA)


def _columns(header: str) -> dict[str, tuple[int, int]]:
    """Each right-aligned numeric column's (start, end) in the header line."""
    names = ["SQNR dB", "cosine", "rel.err", "worst dB", "local dB", "passes", "mask loads",
             "DAC conv", "ADC conv", "clipped", "DAC clip"]
    out = {}
    for name in names:
        at = header.find(name)
        if at >= 0:
            out[name] = (at, at + len(name))
    return out


def _field(line: str, column: tuple[int, int]) -> str:
    """The token of ``line`` that ends where the right-aligned ``column`` ends."""
    end = column[1]
    start = line.rfind(" ", 0, end) + 1
    assert line[end:end + 1] in ("", " "), (line, column)  # the value ends at the column's end
    return line[start:end]


@pytest.mark.parametrize("local", [False, True])
def test_every_number_of_the_table_sits_under_its_column(tiny_dir, local):
    """Each product row shows its own SQNR, cosine, relative error, worst-token
    SQNR (and local SQNR), then its stats' passes, mask loads, DAC and ADC
    conversions and clipped share, each ending where its column's label ends;
    the totals row shows the totals under the same columns."""
    model = transformer.load(tiny_dir)
    cfg = NAIVE.replace({"mapping.attention": "optical"})  # every product with stats
    report = transformer.validate(model, layer=1, tokens=8, config=cfg, seed=4, batch=2,
                                  local=local)
    lines = report.table().splitlines()
    header = next(line for line in lines if line.startswith("product"))
    cols = _columns(header)
    assert ("local dB" in cols) == local
    for row in report.products:
        line = next(line for line in lines if line.startswith(row.name + " "))
        assert float(_field(line, cols["SQNR dB"])) == pytest.approx(row.sqnr_db, abs=0.006)
        assert float(_field(line, cols["cosine"])) == pytest.approx(row.cosine, abs=6e-7)
        assert float(_field(line, cols["rel.err"])) == pytest.approx(row.relative_error,
                                                                     rel=6e-3)
        if row.worst_token_sqnr_db is not None:
            assert float(_field(line, cols["worst dB"])) == pytest.approx(
                row.worst_token_sqnr_db, abs=0.006)
        if local:
            assert float(_field(line, cols["local dB"])) == pytest.approx(row.local_sqnr_db,
                                                                          abs=0.006)
        s = row.stats
        assert s is not None, row.name
        assert int(_field(line, cols["passes"])) == s.passes
        assert int(_field(line, cols["mask loads"])) == s.weight_loads
        assert int(_field(line, cols["DAC conv"])) == s.dac_conversions
        assert int(_field(line, cols["ADC conv"])) == s.adc_conversions
        assert _field(line, cols["clipped"]) == f"{s.clipped_fraction:.2%}"
    # the stats' four counts differ somewhere, so a swapped column shows
    assert any(len({r.stats.passes, r.stats.weight_loads, r.stats.dac_conversions,
                    r.stats.adc_conversions}) == 4 for r in report.products)
    assert any(abs(r.cosine - r.relative_error) > 1e-3 for r in report.products)
    total = next(line for line in lines if line.startswith("total (optical)"))
    t = report.totals
    assert int(_field(total, cols["passes"])) == t["passes"]
    assert int(_field(total, cols["mask loads"])) == t["weight_loads"]
    assert int(_field(total, cols["DAC conv"])) == t["dac_conversions"]
    assert int(_field(total, cols["ADC conv"])) == t["adc_conversions"]
    assert _field(total, cols["clipped"]) == f"{t['clipped_fraction']:.2%}"
    assert t["passes"] != t["weight_loads"]


def test_inputs_clipped_at_a_static_dac_range_are_reported_per_product_and_pooled(tiny_dir):
    """Under a static DAC range calibrated on held-out prompts, some test
    inputs fall beyond it: each product's "DAC clip" column shows its stats'
    share, the totals pool it over the DAC conversions, and a layer sweep's
    metrics carry it. Abs-max scaling has no such column."""
    from optical.workloads import layer_metrics

    model = transformer.load(tiny_dir)
    cfg = NAIVE.replace({"dac.scaling": "static", "dac.percentile": 99.0})
    report = transformer.validate(model, layer=1, tokens=16, config=cfg, seed=2,
                                  calibration_tokens=32)
    rows = [r for r in report.products if r.stats is not None]
    assert any(r.stats.dac_clipped_fraction > 0 for r in rows)
    assert all(r.stats.dac_clipped_fraction < 0.2 for r in rows)
    lines = report.table().splitlines()
    header = next(line for line in lines if line.startswith("product"))
    cols = _columns(header)
    for row in rows:
        line = next(line for line in lines if line.startswith(row.name + " "))
        assert _field(line, cols["DAC clip"]) == f"{row.stats.dac_clipped_fraction:.2%}"
    pooled = sum(r.stats.dac_clipped_fraction * r.stats.dac_conversions for r in rows) \
        / sum(r.stats.dac_conversions for r in rows)
    assert report.totals["dac_clipped_fraction"] == pytest.approx(pooled, rel=1e-12)
    total = next(line for line in lines if line.startswith("total (optical)"))
    assert _field(total, cols["DAC clip"]) == f"{pooled:.2%}"
    flat = layer_metrics(report)
    for r in rows:
        assert flat[f"dac_clipped_fraction.{r.name}"] == r.stats.dac_clipped_fraction
    dynamic = transformer.validate(model, layer=1, tokens=16, config=NAIVE, seed=2)
    assert dynamic.totals["dac_clipped_fraction"] == 0.0
    assert "DAC clip" not in dynamic.table()


def test_heading_footer_and_json_say_what_was_run(tiny_dir):
    """With outlier channels bypassed and calibrated windows (so the clipped
    and digital shares are not 0): the heading's tokens, prompts and reference
    dtype are the call's; the legend says prompt:token for a batch; each row's
    "clipped" is its own clipped share; the footer's optical MACs are
    layer_schedule's MACs less the digital ones counted by hand, its digital
    share theirs, its times the report's; the JSON holds the report's totals
    and timings."""
    model = transformer.load(tiny_dir)
    cfg = optical.presets.get("iris-like").replace({
        "core.inputs": 48, "core.outputs": 40, "outliers.threshold": None, "outliers.top_k": 3})
    report = transformer.validate(model, layer=2, tokens=12, batch=2, config=cfg, seed=3,
                                  calibration_tokens=16, dtype="float32")
    lines = report.table().splitlines()
    assert lines[0].startswith(f"{model.name} layer 2: 12 tokens x 2 prompt(s), weights ")
    assert "; reference float32 (Hugging Face numerics); seed 3" in lines[1]
    assert "the lowest SQNR of one token's row, at that prompt:token" in report.table()
    header = next(line for line in lines if line.startswith("product"))
    clipped = _columns(header)["clipped"]
    rows = [r for r in report.products if r.stats is not None]
    for row in rows:
        line = next(line for line in lines if line.startswith(row.name + " "))
        assert _field(line, clipped) == f"{row.stats.clipped_fraction:.2%}", row.name
    assert any(f"{r.stats.clipped_fraction:.2%}" != f"{r.stats.digital_mac_fraction:.2%}"
               for r in rows)
    shapes = {s.name: s for s in model.spec.linear_shapes()}
    digital = sum(2 * 12 * r.stats.digital_channels * shapes[r.name].out_features for r in rows)
    total = sum(s.macs for s in transformer.layer_schedule(model.spec, 12, cfg,
                                                           batch=2).values())
    assert digital > 0
    t = report.timings
    footer = lines[-1]
    assert footer.startswith(f"optical MACs {total - digital}; digital (outlier channels) MACs "
                             f"{digital}, {digital / total:.3%} of these products'; ")
    assert footer.endswith(f"layer and input {t['setup_s']:.2f} s, calibration run "
                           f"{t['calibration_s']:.2f} s, reference "
                           f"{t['reference_s']:.2f} s, optical {t['optical_s']:.2f} s "
                           f"(programming the masks {t['program_s']:.2f} s), metrics "
                           f"{t['compare_s']:.2f} s")
    data = report.to_dict()
    assert data["timings"] == t and set(t) == {"setup_s", "calibration_s", "reference_s",
                                               "optical_s", "program_s", "compare_s"}
    assert data["totals"] == report.totals and "detected_photons" in data["totals"]
    assert (data["tokens"], data["batch"], data["reference_dtype"]) == (12, 2, "float32")
    with pytest.raises(KeyError, match="no product 'down'; products: q_proj"):
        report.product("down")


def test_a_model_directory_is_loaded_as_load_loads_it(tiny_dir):
    """validate(path, seed=..., data_seed=...) keeps the directory's
    synthetic weights at load()'s seed 0: neither seed moves the model, as
    neither moves a checkpoint's weights."""
    cfg = optical.presets.get("ideal")
    for seed, data_seed in ((7, 2), (7, None)):
        report = transformer.validate(str(tiny_dir), layer=0, tokens=3, seed=seed,
                                      data_seed=data_seed, config=cfg)
        assert report.weights == "synthetic (seed 0)"
        loaded = transformer.validate(transformer.load(tiny_dir), layer=0, tokens=3, seed=seed,
                                      data_seed=data_seed, config=cfg)
        assert (report.products, report.output) == (loaded.products, loaded.output)


def test_a_preset_named_for_the_heading_wins_over_the_one_the_config_equals(tiny_dir):
    """table(preset) names the hardware in the heading; only by default is it
    the preset the config equals."""
    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=0, tokens=3, config=optical.presets.get("ideal"))
    assert "hardware ideal;" in report.table()
    assert "hardware mine;" in report.table(preset="mine")
    assert "hardware ideal;" not in report.table(preset="mine")


def test_detected_photons_are_summed_over_the_products(tiny_dir):
    """totals['detected_photons']: the expected photons detected, over every
    product on the optical core (finite under iris-like's source)."""
    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=1, tokens=6, config=NAIVE, seed=2)
    photons = [r.stats.detected_photons for r in report.products if r.stats is not None]
    assert len(photons) == 7 and all(0 < p < float("inf") for p in photons)
    assert report.totals["detected_photons"] == pytest.approx(sum(photons), rel=1e-12)


def test_calibration_tokens_are_reported_only_where_the_config_calibrates(tiny_dir):
    """calibration_tokens: None when the config needs no calibration, even if
    a length was given (nothing was calibrated on it); the table says nothing
    of a calibration then."""
    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=1, tokens=6, config=NAIVE, seed=2,
                                  calibration_tokens=9)
    assert report.calibration_tokens is None
    assert report.to_dict()["calibration_tokens"] is None
    assert "calibrated on" not in report.table() and "calibration run" not in report.table()
    calibrated = NAIVE.replace({"adc.full_scale": "calibrated"})
    report = transformer.validate(model, layer=1, tokens=6, config=calibrated, seed=2,
                                  calibration_tokens=9)
    assert report.calibration_tokens == 9
    assert "calibrated on 9 held-out tokens" in report.table()


@pytest.mark.parametrize("slowed", ["setup_s", "reference_s", "compare_s"])
def test_timings_are_disjoint_parts_of_the_call(tiny_dir, monkeypatch, slowed):
    """setup_s, calibration_s, reference_s, optical_s and compare_s time the
    call's parts one after the other: with one part made 0.6 s slower (the
    layer's making, the reference run, the metrics), it shows in its own
    timing alone, and they add up to no more than the call's wall time (the
    setup and the metrics were left out: an audit measured 6.6 s of parts in
    a 9.8 s call)."""
    import importlib

    validate_module = importlib.import_module("optical.transformer.validate")  # not the function

    def slowed_down(owner, name, when=lambda *a, **kw: True):
        original = getattr(owner, name)

        def slow(*args, **kwargs):
            if when(*args, **kwargs):
                time.sleep(0.6)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, slow)

    model = transformer.load(tiny_dir)
    if slowed == "setup_s":
        slowed_down(model, "layer")
    elif slowed == "reference_s":
        slowed_down(llama.LlamaLayer, "trace", lambda self, h, **kw: kw.get("dtype") is not None)
    else:
        slowed_down(validate_module, "_compare", lambda name, *a: name == "layer output")
    cfg = NAIVE.replace({"adc.full_scale": "calibrated"})
    start = time.perf_counter()
    report = transformer.validate(model, layer=1, tokens=6, config=cfg, seed=2,
                                  calibration_tokens=16)
    wall = time.perf_counter() - start
    t = report.timings
    parts = ("setup_s", "calibration_s", "reference_s", "optical_s", "compare_s")
    assert t[slowed] >= 0.6
    assert sum(t[p] for p in parts) <= wall
    assert all(t[p] < wall - 0.6 for p in parts if p != slowed)


def test_a_batch_is_calibrated_on_held_out_prompts_of_its_length(tiny_dir):
    """With batch > 1 the held-out input is still calibration_tokens tokens,
    in prompts as long as the scored ones (not the batch it scores): the
    report's SQNRs are those of a run calibrated on those prompts' matmul
    inputs, 10 rows evenly spaced over two 6-token prompts."""
    from optical import metrics
    from optical.transformer._engines import derive_seed

    model = transformer.load(tiny_dir)
    cfg = NAIVE.replace({"adc.full_scale": "calibrated"})
    report = transformer.validate(model, layer=2, tokens=6, config=cfg, seed=3, batch=2,
                                  calibration_tokens=10)
    layer = model.layer(2)
    held_out = model.hidden_states(2, 6, seed=derive_seed(3, "calibration"), batch=2)
    picked = [0, 1, 2, 4, 5, 6, 7, 9, 10, 11]  # round(linspace(0, 11, 10)), both prompts' ends
    calibration = {k: v[picked] for k, v in layer.matmul_inputs(held_out,
                                                                dtype="float32").items()}
    assert calibration["q_proj"].shape[0] == 10 and report.calibration_prompts == 2
    h = model.hidden_states(2, 6, seed=3, batch=2)
    run = layer.trace(h, config=cfg, seed=3, calibration=calibration)
    ref = layer.trace(h, dtype="float16")
    for row in report.products:
        assert row.sqnr_db == metrics.sqnr_db(ref.products[row.name],
                                              run.products[row.name]), row.name


def test_a_report_and_its_column_errors_are_read_only(tiny_dir):
    """A style audit set `report.totals["passes"] = -1` (a sweep's
    layer_metrics reads it) and `ColumnErrors.sqnr_db[...] = 99`, which moved
    worst_sqnr_db from 38.76 to 99.0 dB, on "frozen" records."""
    import pickle

    import numpy as np

    model = transformer.load(tiny_dir)
    report = transformer.validate(model, layer=0, tokens=8, config=NAIVE, seed=0)
    with pytest.raises(TypeError):
        report.totals["passes"] = -1
    with pytest.raises(TypeError):
        report.timings["optical_s"] = 0.0
    assert pickle.loads(pickle.dumps(report)).to_dict() == report.to_dict()
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((16, 4))
    cols = optical.metrics.column_errors(ref, ref + 0.01 * rng.standard_normal((16, 4)))
    with pytest.raises(ValueError, match="read-only"):
        cols.sqnr_db[cols.worst_column] = 99.0
    # ... also once pickled or copied (the diff review: they came back writeable)
    import copy

    for again in (pickle.loads(pickle.dumps(cols)), copy.deepcopy(cols)):
        assert not again.sqnr_db.flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            again.sqnr_db[0] = 99.0
    layer = transformer.load(tiny_dir).layer(0)
    for weights in (pickle.loads(pickle.dumps(layer.weights)), copy.deepcopy(layer.weights)):
        assert not weights["q_proj"].flags.writeable


def test_a_report_says_what_it_scored_and_what_calibrated_attention(tiny_dir):
    """A calibration audit: the record could not tell a caller's ``hidden``
    from a drawn input, and under optical attention its heading said
    "calibrated on N held-out tokens" though the attention products calibrate
    on their own operands."""
    model = transformer.load(tiny_dir)
    cfg = NAIVE.replace({"adc.full_scale": "calibrated"})
    drawn = transformer.validate(model, layer=1, tokens=6, config=cfg, seed=2)
    given = transformer.validate(model, layer=1, tokens=6, config=cfg, seed=2,
                                 hidden=model.hidden_states(1, 6, seed=2))
    assert given.products == drawn.products  # the same input, said apart
    assert (drawn.hidden_given, given.hidden_given) == (False, True)
    assert given.to_dict()["hidden_given"] is True
    assert "input given" in given.table() and "input given" not in drawn.table()
    assert "own operands" not in drawn.table()
    attention = transformer.validate(model, layer=1, tokens=6, seed=2,
                                     config=cfg.replace({"mapping.attention": "optical"}))
    assert ("calibrated on 256 held-out tokens (43 prompts of 6), attention products on "
            "their own operands") in attention.table()
