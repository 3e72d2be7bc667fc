"""Sweep definition, CLI and workload contracts that the other sweep tests
leave open (mutation audit mut19): integer log ranges reaching both ends, run
ids that hash the workload, a swept path added or dropped refused as a
changed sweep, numpy arrays and single values as a path's values, seeds out
of order resumed each at its own run, results_format checked, the base
config named in a failure, metric values (booleans refused, None kept), a
damaged Range named by its manifest, the CLI's --param spacing, --model
defaults, --outlier-scale and summary table, booleans refused as workload
sizes, shape strings, workload descriptions refused as ValueErrors, and the
JAX path's photoelectrons per detector readout."""

import dataclasses
import json
import math
import re
import shutil
import statistics

import numpy as np
import pytest

import optical
from optical._sweep_store import content_hash
from optical.cli import main
from optical.commands.sweep import parse_param
from optical.sweep import (
    Range,
    SweepDefinition,
    SweepError,
    execute,
    load,
    resume,
    stored_definition,
)
from optical.workloads import LayerWorkload, MatmulWorkload, workload_from_dict
from tests.transformer_helpers import TINY_LLAMA, write_model

pd = pytest.importorskip("pandas")

from tests.test_sweep import BASE, WL, Returns  # noqa: E402  (shared with those tests)


def _serial(workload, params, out, **kwargs):
    return optical.sweep(workload, params, out=out, base=kwargs.pop("base", BASE),
                         executor="serial", progress=False, **{"seeds": 1} | kwargs)


# --------------------------------------------------------------------------- #
# Definition
# --------------------------------------------------------------------------- #


def test_an_integer_log_range_draws_every_integer_from_lo_to_hi():
    """Range: uniform in [lo, hi] in log space, integers for integer fields:
    each of 2, 3, 4, 5 is drawn (the top one too), nothing outside."""
    points = SweepDefinition.build(WL, {"adc.bits": Range(2, 5, log=True)}, seeds=1,
                                   samples=400, sample_seed=0).points()
    bits = [p["adc.bits"] for p in points]
    assert all(type(b) is int for b in bits)
    assert sorted(bits) == [2, 3, 4, 5]  # identical draws are one point: each once


def test_integer_ranges_draw_each_integer_by_its_share():
    """Linear: each integer of [lo, hi] equally likely. Log: each as likely as
    its share of [lo - 1/2, hi + 1/2] in log space (rounding reaches it from
    both sides; the ends had half their share). 20 000 draws, within 4 sigma."""
    from optical._sweep_definition import _draw

    n = 20_000
    for log, share in ((False, {1: 1 / 3, 2: 1 / 3, 3: 1 / 3}),
                       (True, {k: math.log((k + 0.5) / (k - 0.5)) / math.log(3.5 / 0.5)
                               for k in (1, 2, 3)})):
        rng = np.random.default_rng(0)
        draws = [_draw(rng, "adc.bits", Range(1, 3, log=log)) for _ in range(n)]
        for k, p in share.items():
            assert abs(draws.count(k) / n - p) < 4 * math.sqrt(p * (1 - p) / n), (log, k)


def test_random_points_do_not_depend_on_the_order_of_the_params():
    """The definition's hash ignores the order the params are given in (a
    reordered command resumes the sweep), so the points must too: the same
    points, each with its values in the order given."""
    params = {"adc.bits": [None, 4, 6], "source.photons_per_mac": Range(1e2, 1e5, True),
              "encoding.inputs": ["offset", "split"], "outliers.top_k": [None, 1]}
    reordered = dict(reversed(list(params.items())))
    first, second = (SweepDefinition.build(WL, p, seeds=2, samples=6, sample_seed=3)
                     for p in (params, reordered))
    assert first.hash == second.hash
    assert first.points() == second.points()
    assert list(second.points()[0]) == list(reordered)


def test_a_range_with_a_none_end_is_named():
    with pytest.raises(ValueError, match=r"adc.bits: range \[None, 8\] needs a number at each "
                                         r"end"):
        SweepDefinition.build(WL, {"adc.bits": Range(None, 8)}, seeds=1, samples=3)


@pytest.mark.parametrize(("workload", "params", "message"), [
    # a pure cross-field rule of the lens model
    (WL, {"optics.pixel_pitch": [1e-5, 5e-7]},
     "point optics.pixel_pitch=5e-07: optics.pixel_pitch: 5e-07 m is not above "
     "source.wavelength"),
    # compensation's reach depends on the tiles' shapes alone
    (WL, {"optics.pixel_pitch": [1e-5, 1e-6], "optics.fan_in_aperture": [0.0254, 0.09]},
     "point optics.pixel_pitch=1e-06, optics.fan_in_aperture=0.0254: mask.compensate: the "
     "optics' envelope and crosstalk leave no gain"),
    # every one of k = 64 channels sent to the digital side
    (WL, {"outliers.threshold": [None], "outliers.top_k": [1, 64]},
     "point outliers.threshold=None, outliers.top_k=64: outliers: .* send all 64 input "
     "channels to the digital side"),
    (optical.MatmulWorkload(tokens=4, k=64, n=16, backend="jax"),
     {"outliers.policy": ["static", "dynamic"]},
     "point outliers.policy='dynamic': .* the JAX backend runs only a static bypass"),
])
def test_a_point_that_cannot_run_is_named_before_any_run(tmp_path, workload, params, message):
    """ARCHITECTURE: every point's config is validated before anything is
    written. These points passed the config's own rules and failed mid-sweep,
    after the good points had run (the workload's check_config now runs them)."""
    if getattr(workload, "backend", None) == "jax":
        pytest.importorskip("jax")
    out = tmp_path / "s"
    with pytest.raises(ValueError, match=message):
        _serial(workload, params, out)
    assert not out.exists()
    # A stored sweep is read back without the check (it runs its manifest's
    # points, checked when it was made), so reading one never fails on it.
    stored = SweepDefinition.build(workload, params, seeds=1, base=BASE, check_points=False)
    assert SweepDefinition.from_dict(stored.to_dict()).hash == stored.hash
    if getattr(workload, "backend", None) == "jax":  # its run() alone says it the same way
        (path, values), = params.items()
        with pytest.raises(ValueError, match=message.split(": .* ")[-1]):
            workload.run(BASE.replace({path: values[-1]}), 0)


def test_a_layer_point_is_checked_for_every_product_it_programs(tmp_path):
    """A layer's smallest product decides: under optical attention, V of an
    8-token prompt (8 input channels) cannot keep 16 outlier channels off the
    mask; the weight matmuls (64 or more inputs) can."""
    model = write_model(tmp_path / "tiny", TINY_LLAMA)
    wl = LayerWorkload(str(model), layer=0, tokens=8)
    params = {"outliers.threshold": [None], "outliers.top_k": [16],
              "mapping.attention": ["digital", "optical"]}
    with pytest.raises(ValueError, match=r"point outliers.threshold=None, outliers.top_k=16, "
                                         r"mapping.attention='optical': .* send all 8 input "
                                         r"channels"):
        SweepDefinition.build(wl, params, seeds=1, base=BASE)
    SweepDefinition.build(wl, {**params, "mapping.attention": ["digital"]}, seeds=1, base=BASE)


def test_run_ids_hash_the_workload(tmp_path):
    """A run id is a hash of (workload, full config, seed): runs of another
    workload copied into a sweep are not its runs; it runs its own, and each
    is its own workload's matmul, recomputed here."""
    other = dataclasses.replace(WL, data_seed=1)
    a = SweepDefinition.build(WL, {"adc.bits": [6]}, seeds=1, base=BASE)
    b = SweepDefinition.build(other, {"adc.bits": [6]}, seeds=1, base=BASE)
    config = BASE.replace({"adc.bits": 6})
    assert a.run_id(config, 0) != b.run_id(config, 0)
    assert a.run_id(config, 0) == SweepDefinition.build(
        dataclasses.replace(WL), {"adc.bits": [6, 8]}, seeds=2, base=BASE).run_id(config, 0)

    first, second = tmp_path / "a", tmp_path / "b"
    _serial(WL, {"adc.bits": [6, 8]}, first, seeds=2)
    (second / "runs").mkdir(parents=True)
    for run in (first / "runs").glob("*.json"):
        shutil.copy(run, second / "runs")
    summary = execute(SweepDefinition.build(other, {"adc.bits": [6, 8]}, seeds=2, base=BASE),
                      second, executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (0, 4)
    x, w, _ = other.data()
    exact = x.astype(np.float64) @ w.astype(np.float64)
    for row in load(second).to_dict("records"):
        y = optical.matmul(x, w, BASE.replace({"adc.bits": row["adc.bits"]}), seed=row["seed"])
        assert row["sqnr_db"] == optical.metrics.sqnr_db(exact, y)


@pytest.mark.parametrize(("before", "after", "message"), [
    ({"adc.bits": [4, 8]}, {"adc.bits": [4, 8], "source.photons_per_mac": [1e4]},
     "params source.photons_per_mac: '(none)' -> [10000.0]"),
    ({"adc.bits": [4, 8], "source.photons_per_mac": [1e4]}, {"adc.bits": [4, 8]},
     "params source.photons_per_mac: [10000.0] -> '(none)'"),
])
def test_a_swept_path_added_or_dropped_is_a_changed_sweep(tmp_path, before, after, message):
    """The definition's params are part of what a resume compares: a sweep of
    one more (or one fewer) path is refused, naming that path, and the
    directory is left as it was."""
    out = tmp_path / "s"
    _serial(WL, before, out)
    manifest = (out / "manifest.json").read_text()
    runs = sorted(p.name for p in (out / "runs").iterdir())
    with pytest.raises(ValueError, match="holds a different sweep") as info:
        _serial(WL, after, out)
    assert message in str(info.value)
    assert (out / "manifest.json").read_text() == manifest
    assert sorted(p.name for p in (out / "runs").iterdir()) == runs


def test_numpy_arrays_of_values_are_their_values():
    """Values computed with numpy (np.arange, an array of floats) sweep the
    grid of their elements, stored as Python numbers."""
    params = {"adc.bits": np.arange(4, 9, 2), "adc.enob_loss": np.array([0.5, 1.5])}
    definition = SweepDefinition.build(WL, params, seeds=1, base=BASE)
    assert definition.points() == [{"adc.bits": b, "adc.enob_loss": h}
                                   for b in (4, 6, 8) for h in (0.5, 1.5)]
    assert all(type(p["adc.bits"]) is int for p in definition.points())
    assert definition.hash == SweepDefinition.build(
        WL, {"adc.bits": [4, 6, 8], "adc.enob_loss": [0.5, 1.5]}, seeds=1, base=BASE).hash


def test_a_single_value_is_a_one_value_list():
    """A path given one value (a string included, not its characters) has that
    value at every point: the same sweep as the one-element list."""
    one = SweepDefinition.build(WL, {"encoding.inputs": "split", "adc.bits": 6}, seeds=1,
                                base=BASE)
    listed = SweepDefinition.build(WL, {"encoding.inputs": ["split"], "adc.bits": [6]},
                                   seeds=1, base=BASE)
    assert one.points() == listed.points() == [{"encoding.inputs": "split", "adc.bits": 6}]
    assert one.hash == listed.hash


def test_results_format_is_checked_before_any_work(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=r"results_format: 'json' is not valid; "
                                         r"valid: parquet, csv"):
        optical.sweep(WL, {"adc.bits": [4]}, seeds=1, out=out, base=BASE, executor="serial",
                      progress=False, results_format="json")
    assert not out.exists()


@dataclasses.dataclass(frozen=True)
class Fails:
    """A workload whose every run fails."""

    def run(self, config, seed):
        raise RuntimeError("no light")

    def to_dict(self):
        return {"kind": "fails"}


def test_a_failed_run_of_the_base_config_says_so(tmp_path):
    """A sweep of no paths has one point, the base config: a failure there
    names it, as the point of a grid is named by its values."""
    with pytest.raises(SweepError, match=r"run failed at point \(base config\), seed 3: "
                                         r"RuntimeError: no light"):
        optical.sweep(Fails(), {}, seeds=[3], out=tmp_path / "s", base=BASE,
                      executor="serial", progress=False)


_FAILED: list[int] = []


@dataclasses.dataclass(frozen=True)
class FailsOnceAtSeed2:
    """WL, whose first run at seed 2 fails (a crash mid-sweep)."""

    def run(self, config, seed):
        if seed == 2 and not _FAILED:
            _FAILED.append(seed)
            raise RuntimeError("crash")
        return WL.run(config, seed)

    def to_dict(self):
        return WL.to_dict()


def test_seeds_in_any_order_resume_each_run_at_its_own_seed(tmp_path):
    """Seeds given out of order ([5, 2]), a run failing, then a resume from
    the manifest: every row holds its own seed's run, recomputed here with
    optical.matmul (the resume runs seed 2, not seed 5 again)."""
    out = tmp_path / "s"
    _FAILED.clear()
    with pytest.raises(SweepError, match="seed 2: RuntimeError: crash"):
        _serial(FailsOnceAtSeed2(), {"adc.bits": [6]}, out, seeds=[5, 2])
    assert len(load(out)) == 1
    summary = resume(out, workload=FailsOnceAtSeed2(), executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (1, 1)
    frame = load(out)
    assert sorted(frame["seed"]) == [2, 5]
    x, w, _ = WL.data()
    exact = x.astype(np.float64) @ w.astype(np.float64)
    for row in frame.to_dict("records"):
        y = optical.matmul(x, w, BASE.replace({"adc.bits": 6}), seed=row["seed"])
        assert row["sqnr_db"] == optical.metrics.sqnr_db(exact, y), row["seed"]


@pytest.mark.parametrize("value", [True, np.bool_(False)])
def test_a_boolean_metric_is_refused(tmp_path, value):
    """Metrics are numbers: a boolean is not one (it would be a column of
    True/False among numbers)."""
    out = tmp_path / "s"
    with pytest.raises(SweepError, match=rf"metric 'ok' = {value!r}, not a number"):
        _serial(Returns({"ok": value}), {"adc.bits": [4]}, out)
    assert not list((out / "runs").glob("*.json"))


def test_a_none_metric_is_kept_as_missing(tmp_path):
    """Metric values are numbers or None (a metric a run cannot give)."""
    frame = _serial(Returns({"sqnr_db": None, "passes": 3}), {"adc.bits": [4, 8]},
                    tmp_path / "s")
    assert len(frame) == 2 and frame["passes"].tolist() == [3, 3]
    assert frame["sqnr_db"].isna().all()


def test_a_range_without_its_bounds_in_the_manifest_is_named(tmp_path):
    """A manifest whose Range lost its bounds: the error names the manifest
    and the missing key, not a bare KeyError."""
    out = tmp_path / "s"
    _serial(WL, {"adc.enob_loss": Range(0.5, 2.0)}, out, samples=2)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["definition"]["params"]["adc.enob_loss"]["range"]
    manifest["definition_hash"] = content_hash(manifest["definition"])  # not a hand edit
    (out / "manifest.json").write_text(json.dumps(manifest))
    for call in (lambda: stored_definition(out),
                 lambda: resume(out, executor="serial", progress=False)):
        with pytest.raises(ValueError, match=r"manifest\.json: cannot rebuild the sweep's "
                                             r"definition from it: missing key 'range'"):
            call()


# --------------------------------------------------------------------------- #
# Command line
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("scale", ["0", "-1"])
def test_a_non_positive_outlier_scale_is_named_by_its_option(tmp_path, capsys, scale):
    out = tmp_path / "never"
    assert main(["sweep", "--matmul", "4x8x4", "--outlier-scale", scale, "--out", str(out),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--outlier-scale: {float(scale)} must be a positive finite number" in err
    assert not out.exists()


def test_param_path_and_values_may_have_spaces_around_them(tmp_path):
    """--param ' adc.bits = 4, 8 ' is adc.bits=4,8 (as --set takes spaces)."""
    assert parse_param(" adc.bits = 4, 8 ") == ("adc.bits", [4, 8])
    path, spec = parse_param("source.photons_per_mac = 10 : 1e5 : log")
    assert path == "source.photons_per_mac" and spec == Range(10.0, 1e5, log=True)
    out = tmp_path / "s"
    assert main(["sweep", "--matmul", "16x64x32", "--param", " adc.bits = 4, 8 ", "--set",
                 "core.inputs=32", "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    assert load(out)["adc.bits"].tolist() == [4, 8]


def test_model_sweep_defaults_are_the_documented_ones(tmp_path, monkeypatch):
    """--model without --layer, --tokens, --weights-seed, --seeds, --preset:
    layer 0, 512 tokens, weights seed 0, seed 0, iris-like (the help's
    defaults). The runs are stood in for: only the definition is checked."""
    model = write_model(tmp_path / "tiny", TINY_LLAMA)
    calls = []

    def run(self, config, seed):
        calls.append((self, config, seed))
        return {"sqnr_db": 1.0}

    monkeypatch.setattr(LayerWorkload, "run", run)
    out = tmp_path / "s"
    assert main(["sweep", "--model", str(model), "--jobs", "1", "--quiet",
                 "--out", str(out)]) == 0
    expected = LayerWorkload(str(model), layer=0, tokens=512, weights_seed=0)
    definition = json.loads((out / "manifest.json").read_text())["definition"]
    assert definition["workload"] == expected.to_dict()
    assert definition["seeds"] == [0]
    assert calls == [(expected, optical.presets.get("iris-like"), 0)]


def test_summary_table_gives_each_points_mean_spread_and_count(tmp_path, capsys):
    """The printed table: one line per point under its swept value, the mean
    of sqnr_db over the seeds, its sample standard deviation (blank for one
    seed) and the number of seeds, recomputed here from the runs."""
    base = ["sweep", "--matmul", "16x64x32", "--param", "adc.bits=4,8",
            "--set", "core.inputs=32", "--jobs", "1"]
    for seeds in (1, 3):
        out = tmp_path / f"s{seeds}"
        assert main([*base, "--seeds", str(seeds), "--out", str(out)]) == 0
        lines = capsys.readouterr().out.splitlines()
        header = next(i for i, line in enumerate(lines) if "sqnr_db mean" in line)
        assert lines[header].split() == ["adc.bits", "sqnr_db", "mean", "std", "n"]
        frame = load(out)
        for bits, line in zip((4, 8), lines[header + 1:header + 3], strict=True):
            values = frame[frame["adc.bits"] == bits]["sqnr_db"].tolist()
            fields = line.split()
            assert fields[0] == str(bits) and float(fields[1]) == round(statistics.mean(values), 3)
            if seeds == 1:
                assert len(fields) == 3 and "nan" not in line
            else:
                assert float(fields[2]) == round(statistics.stdev(values), 3)
            assert int(fields[-1]) == seeds
    # A column of None and integers shows them as given, not as nan and 6.0.
    out = tmp_path / "none"
    assert main([*base[:4], "adc.bits=none,6", *base[5:], "--seeds", "2", "--out",
                 str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if "sqnr_db mean" in line)
    assert [line.split()[0] for line in lines[header + 1:header + 3]] == ["None", "6"]
    # Points whose values print alike in 6 digits stay apart, one row each.
    out = tmp_path / "close"
    assert main([*base[:4], "source.photons_per_mac=1000,1000.0001", *base[5:], "--seeds",
                 "2", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if "sqnr_db mean" in line)
    rows = [line.split() for line in lines[header + 1:header + 3]]
    assert [r[0] for r in rows] == ["1000", "1000.0001"] and [r[-1] for r in rows] == ["2", "2"]


# --------------------------------------------------------------------------- #
# Workloads
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("field", ["tokens", "k", "n", "data_seed"])
def test_a_boolean_is_not_a_matmul_size_or_seed(field):
    kwargs = {"tokens": 2, "k": 4, "n": 4} | {field: True}
    kind = "non-negative" if field == "data_seed" else "positive"
    with pytest.raises(ValueError, match=f"{field}: True must be a {kind} integer"):
        MatmulWorkload(**kwargs)


def test_a_boolean_is_not_a_layer_or_token_count(tmp_path):
    model = write_model(tmp_path / "tiny", TINY_LLAMA)
    with pytest.raises(ValueError, match="layer: False must be a non-negative integer"):
        LayerWorkload(str(model), layer=False, tokens=4)
    with pytest.raises(ValueError, match="tokens: True must be a positive integer"):
        LayerWorkload(str(model), layer=0, tokens=True)
    # A weights seed past 2**64 was accepted here, then refused by load as "seed".
    with pytest.raises(ValueError, match=r"weights_seed: 18446744073709551616 must be below "
                                         r"2\*\*64"):
        LayerWorkload(str(model), layer=0, tokens=4, weights_seed=2**64)


@pytest.mark.parametrize("shape", ["16X64X32", " 16 x 64 x 32 "])
def test_shape_strings_take_either_x_and_spaces(shape):
    assert MatmulWorkload.from_shape(shape) == MatmulWorkload(16, 64, 32)


@pytest.mark.parametrize(("data", "message"), [
    ({"tokens": 2, "k": 4, "n": 4}, "workload kind None is not known; valid: matmul, layer"),
    ({"kind": "matmul", "tokens": 2, "k": 4}, r"matmul workload: .*missing .*'n'"),
    ({"kind": "matmul", "tokens": 2, "k": 4, "n": 4, "rows": 3},
     r"matmul workload: .*unexpected keyword argument 'rows'"),
])
def test_a_workload_description_that_is_not_one_is_a_value_error(data, message):
    with pytest.raises(ValueError, match=message):
        workload_from_dict(data)


def test_jax_runs_report_mean_photoelectrons_per_detector_readout():
    """MatmulStats.mean_photoelectrons is per detector readout: the JAX
    path's detected photons over its readouts (balanced detection: two
    readouts per ADC conversion), close to the numba run's."""
    pytest.importorskip("jax")
    wl = MatmulWorkload(12, 64, 16, backend="jax")
    config = BASE.replace({"adc.full_scale": "rms"})
    assert config.detector.balanced
    run = wl.run(config, 0)
    assert run["detector_readouts"] != run["adc_conversions"]
    assert run["mean_photoelectrons"] == pytest.approx(
        run["detected_photons"] / run["detector_readouts"], rel=1e-12)
    numba = dataclasses.replace(wl, backend="numba").run(config, 0)
    assert run["detector_readouts"] == numba["detector_readouts"]
    assert run["mean_photoelectrons"] == pytest.approx(numba["mean_photoelectrons"], rel=1e-3)
    assert math.isfinite(run["mean_photoelectrons"]) and run["mean_photoelectrons"] > 0


def test_the_gain_is_checked_on_the_rows_static_outliers_leave_on_the_mask():
    """Crosstalk that leaves compensation no gain on 3 or more rows: with 2
    of k = 4 channels bypassed programming succeeds, so the preflight
    accepts the point; with 1 bypassed (3 rows) both refuse it."""
    from optical.quant import check_programmable

    cfg = optical.presets.get("iris-like").replace({
        "optics.pixel_pitch": 1.8e-6, "optics.fan_in_aperture": 0.0254,
        "outliers.threshold": None, "outliers.top_k": 2})
    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((4, 32)), rng.standard_normal((8, 4))
    optical.program(w, cfg, calibration=x)
    check_programmable(4, 32, cfg)
    one = cfg.replace({"outliers.top_k": 1})
    for attempt in (lambda: optical.program(w, one, calibration=x),
                    lambda: check_programmable(4, 32, one)):
        with pytest.raises(ValueError, match="mask.compensate: the optics' envelope and "
                                             "crosstalk leave no gain"):
            attempt()
    # A threshold alone bounds nothing before the calibration input is seen:
    # the gain is checked on one row, so the preflight accepts the point
    # (programming then decides, on the rows that calibration leaves).
    alone = cfg.replace({"outliers.threshold": 6.0, "outliers.top_k": None})
    check_programmable(4, 32, alone)
    with pytest.raises(ValueError, match="leave no gain"):
        check_programmable(4, 32, alone.replace({"outliers.policy": "none"}))


# (base changes, a field the base leaves unread, two of its values, the change that makes it read)
_UNREAD = [
    ({}, "adc.headroom", (2.0, 8.0), {"adc.full_scale": "rms"}),
    ({"adc.full_scale": "max"}, "adc.headroom", (2.0, 8.0), {"adc.full_scale": "rms"}),
    ({"adc.bits": None}, "adc.enob_loss", (0.0, 1.5), {"adc.bits": 8}),
    ({"adc.bits": None}, "adc.window", ("per_column", "per_tile"), {"adc.bits": 8}),
    ({}, "dac.percentile", (50.0, 99.99), {"dac.scaling": "static"}),
    ({"optics.model": "ideal"}, "optics.pixel_pitch", (10e-6, 20e-6),
     {"optics.model": "diffraction"}),
    ({"optics.model": "ideal"}, "mask.compensate", (True, False),
     {"optics.model": "diffraction"}),
    ({"outliers.policy": "none"}, "outliers.threshold", (2.0, 50.0), {"outliers.policy": "static"}),
]


@pytest.mark.parametrize(("changes", "path", "values", "read"), _UNREAD)
def test_a_field_the_config_leaves_unread_changes_nothing_and_is_not_swept(
        changes, path, values, read):
    """OpticalConfig.unread's rules against the arithmetic: the field's two
    values give the same metrics (counts included) where the rule says it is
    unread, and other ones once the config reads it. A sweep of it over
    such a base ran identical points (iris-like's calibrated windows ignore
    adc.headroom: 26.691 dB at every headroom), a flat line taken for a
    measurement; refused, naming why."""
    workload = MatmulWorkload(tokens=24, k=80, n=40, inputs="laplace", outlier_channels=2)
    base = BASE.replace(changes)
    assert base.unread(path) is not None and base.replace(read).unread(path) is None
    same = [workload.run(base.replace({path: v}), 3) for v in values]
    assert same[0] == same[1]
    differ = [workload.run(base.replace({**read, path: v}), 3) for v in values]
    assert differ[0]["sqnr_db"] != differ[1]["sqnr_db"]
    with pytest.raises(ValueError, match=rf"^{re.escape(path)}: no point of this sweep reads it "
                                         rf"\({re.escape(base.unread(path))}\)"):
        SweepDefinition.build(workload, {path: list(values)}, seeds=1, base=base)
    # Swept beside the field that makes it count, at some point: accepted.
    (key, value), = read.items()
    SweepDefinition.build(workload, {path: list(values), key: [base.get(key), value]}, seeds=1,
                          base=base)



def _another_value(value):
    """A valid value of an energy.* field other than ``value``."""
    if isinstance(value, bool):
        return not value
    if value is None:
        return 1e-12
    if isinstance(value, int):
        return value + 1
    return value / 2 if value else 1.0


def test_no_energy_field_changes_the_arithmetic_and_none_is_swept(tmp_path):
    """``optical sweep --param energy.laser_efficiency=0.1,0.3,0.9`` ran
    three identical matmuls (an audit): ``energy.*`` prices the machine, and
    the built-in workloads measure the arithmetic. Every field changed at
    once leaves a matmul's and a Llama layer's metrics (counts included)
    as they were; a sweep of any one is refused, naming it; a workload of
    one's own (which may price the machine) sweeps them still."""
    paths = [p for p in BASE.paths() if p.startswith("energy.")]
    other = BASE.replace({p: _another_value(BASE.get(p)) for p in paths})
    assert set(other.diff(BASE)) == set(paths)
    layer = LayerWorkload(str(write_model(tmp_path / "m", TINY_LLAMA)), layer=0, tokens=6)
    for workload in (WL, layer):
        assert workload.run(BASE, 3) == workload.run(other, 3)
        for path in paths:
            with pytest.raises(ValueError, match=rf"^{re.escape(path)}: a "
                                                 rf"{type(workload).__name__} measures the "
                                                 "emulated arithmetic, which no energy"):
                SweepDefinition.build(workload, {path: [BASE.get(path), other.get(path)]},
                                      seeds=1, base=BASE)
    SweepDefinition.build(Returns({"j": 1.0}), {"energy.cores": [1, 2]}, seeds=1, base=BASE)

def test_an_unread_swept_field_is_one_line_from_the_cli(tmp_path, capsys):
    out = tmp_path / "s"
    assert main(["sweep", "--matmul", "16x64x32", "--param", "adc.headroom=2,4",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("optical sweep: error: adc.headroom: no point of this sweep reads it "
                   "(adc.full_scale is 'calibrated': the headroom sets the 'rms' window alone), "
                   "so each of its values would give the same numbers; sweep or set the field "
                   "that makes it count, or leave it out (a sweep stored by an earlier version "
                   "resumes from its directory alone: optical sweep --out DIR, "
                   "optical.resume_sweep)")
    assert not out.exists()


def test_whether_an_unread_field_is_refused_does_not_hang_on_the_draws():
    """Decided on the values the params can take, not on the points drawn: a
    random sweep of adc.headroom beside adc.full_scale in ["calibrated",
    "rms"] was refused for the sample seeds whose two draws were both
    calibrated (3 of 40) and accepted for the rest (the review)."""
    params = {"adc.full_scale": ["calibrated", "rms"], "adc.headroom": Range(1.0, 8.0)}
    draws = [SweepDefinition.build(WL, params, seeds=1, base=BASE, samples=2, sample_seed=s)
             for s in range(40)]
    assert any(all(p["adc.full_scale"] == "calibrated" for p in d.points()) for d in draws)
    with pytest.raises(ValueError, match="adc.headroom: no point of this sweep reads it"):
        SweepDefinition.build(WL, {"adc.full_scale": ["calibrated", "max"],
                                   "adc.headroom": Range(1.0, 8.0)}, seeds=1, base=BASE,
                              samples=2)


@pytest.mark.parametrize(("base", "params"), [
    # adc.bits=1 is valid beside enob_loss 0 or 0.5, not beside iris-like's 1.5
    (BASE, {"adc.bits": [None, 1], "adc.enob_loss": [0.0, 0.5]}),
    # policy "static" needs a rule: the swept top_k, not the base's None
    (BASE.replace({"outliers.policy": "none", "outliers.threshold": None}),
     {"outliers.policy": ["none", "static"], "outliers.top_k": [1, 2]}),
])
def test_a_field_read_beside_other_swept_values_is_not_refused(base, params):
    """A condition's value valid only beside the other swept values (not the
    base's) was dropped from the combinations the refusal decides on, leaving
    the unread ones alone: sweeps that ran before were refused (the second
    review). Undecided, they run."""
    definition = SweepDefinition.build(WL, params, seeds=1, base=base)
    reads = [config for config in definition.configs(definition.points())
             if all(config.unread(path) is None for path in params)]
    assert reads  # some point reads every swept field
