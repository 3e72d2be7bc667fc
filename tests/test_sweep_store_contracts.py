"""Sweep store and resume contracts that the other sweep tests leave open:
numpy-scalar metrics, the manifest's per-seed structure, the run time
stored, Range checks, and a resume that follows the manifest's points and
run ids rather than recomputing them."""

import dataclasses
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

import optical
from optical._files import atomic_write
from optical._sweep_store import content_hash
from optical.sweep import Range, SweepDefinition, execute, load, read_manifest, resume

pd = pytest.importorskip("pandas")

WL = optical.MatmulWorkload(tokens=16, k=64, n=32)
BASE = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 16})
PARAMS = {"adc.bits": [4, 8]}


def _sweep(out, seeds=2):
    optical.sweep(WL, PARAMS, seeds=seeds, out=out, base=BASE, executor="serial",
                  progress=False)
    return out


@dataclasses.dataclass(frozen=True)
class NumpyMetrics:
    """A custom workload whose metrics are numpy scalars (numbers.Real)."""

    def run(self, config, seed):
        return {"f32": np.float32(0.5), "i64": np.int64(3), "big": np.float32(np.inf),
                "bits": np.int64(config.adc.bits)}

    def to_dict(self):
        return {"kind": "numpy-metrics"}


def test_numpy_scalar_metrics_are_stored_as_their_values(tmp_path):
    """numpy scalars pass the metric check (they are numbers.Real), so the run
    file must store them: 0.5, 3, inf and the point's adc.bits come back."""
    frame = optical.sweep(NumpyMetrics(), {"adc.bits": [4, 6]}, seeds=1, out=tmp_path / "s",
                          executor="serial", progress=False)
    assert frame["f32"].tolist() == [0.5, 0.5]
    assert frame["i64"].tolist() == [3, 3]
    assert frame["big"].tolist() == [np.inf, np.inf]
    assert frame["bits"].tolist() == [4, 6] == frame["adc.bits"].tolist()


@pytest.mark.parametrize(("change", "message"), [
    # no seeds at all (and so no run ids): nothing could ever be placed
    (lambda m: (m["definition"].update(seeds=[]), m.update(run_ids=[[] for _ in m["points"]])),
     "'definition.seeds' is empty"),
    # one run id list more than there are points
    (lambda m: m["run_ids"].append(list(m["run_ids"][0])), "'run_ids' has 3 entries for 2 points"),
    # a point missing the run id of its second seed
    (lambda m: m["run_ids"][0].pop(), r"'run_ids'\[0\] is not a list of one run id per seed"),
    # a run id that is a path: a shared sweep's manifest would have a resume
    # write its run file outside the sweep (runs/../../x.json)
    (lambda m: m["run_ids"][1].__setitem__(0, "../../escape"),
     r"'run_ids'\[1\] holds '\.\./\.\./escape', which is not a run id"),
])
def test_manifest_run_ids_must_match_points_and_seeds(tmp_path, change, message):
    out = _sweep(tmp_path / "s")
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    for call in (lambda: load(out), lambda: read_manifest(out)):
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert str(path) in str(info.value)


@pytest.mark.parametrize(("change", "on_load", "on_resume"), [
    # the two points' run ids swapped: adc.bits=4's results placed at adc.bits=8
    (lambda m: m["run_ids"].reverse(),
     # (either point's run first: the files are read in the order of their ids' hashes,
     # which hash the results version too)
     r"this run holds adc\.bits = (8, where manifest\.json places it at the point adc\.bits = 4"
     r"|4, where manifest\.json places it at the point adc\.bits = 8)",
     r"'run_ids'\[0\] names \w+, which is not the run of point 0 \(adc\.bits=4\) at seed 0"),
    # a point's two seeds swapped
    (lambda m: m["run_ids"][1].reverse(),
     # (either run first: the files are read in the order of their ids' hashes)
     "this run holds seed (1, where manifest.json places it at seed 0|0, where manifest.json "
     "places it at seed 1)",
     r"'run_ids'\[1\] names \w+, which is not the run of point 1 \(adc\.bits=8\) at seed 0"),
    # the point's value changed, run ids kept
    (lambda m: m["points"][0].update({"adc.bits": 6}),
     r"this run holds adc\.bits = 4, where manifest\.json places it at the point adc\.bits = 6",
     r"'points'\[0\] has adc\.bits = 6, which the sweep does not define"),
])
def test_a_manifest_that_misplaces_its_runs_is_refused(tmp_path, change, on_load, on_resume):
    """A hand-edited manifest that is still valid JSON must not pass one
    point's results off as another's (the audit's reordered run ids loaded
    and resumed with each row's SQNR under the other point's adc.bits):
    loading checks each finished run against its place, resuming also the
    points and run ids the runs still to come would be filed under."""
    _edit_and_expect_refusals(tmp_path, change, on_load, on_resume)


def _edit_and_expect_refusals(tmp_path, change, on_load, on_resume):
    """A finished two-point sweep whose manifest ``change`` edits: loading it
    is refused matching ``on_load`` (None: not refused), resuming it and
    running its definition again matching ``on_resume``; each names the
    edit and how to rebuild the manifest. Returns the sweep's directory."""
    out = _sweep(tmp_path / "s")
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    definition = SweepDefinition.build(WL, PARAMS, seeds=2, base=BASE)
    calls = [(lambda: resume(out, executor="serial", progress=False), on_resume),
             (lambda: execute(definition, out, executor="serial", progress=False), on_resume)]
    for call, message in ([(lambda: load(out), on_load)] if on_load else []) + calls:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "(edited, or damaged)" in str(info.value)
        assert "are kept: delete" in str(info.value)  # how to rebuild it, keeping the runs
    return out



def _copy_point(m, run_ids):
    m["points"][1] = dict(m["points"][0])
    if run_ids:
        m["run_ids"][1] = list(m["run_ids"][0])


@pytest.mark.parametrize(("change", "on_load", "on_resume"), [
    # point 0 copied over point 1 with its run ids (the audit's edit: "8 runs, all
    # done already", and adc.bits=8 gone from the results without a word)
    (lambda m: _copy_point(m, run_ids=True), r"'run_ids'\[1\] repeats the run id \w+ of "
     r"'run_ids'\[0\]", r"'run_ids'\[1\] repeats the run id \w+ of 'run_ids'\[0\]"),
    # the same with point 1's own ids kept
    (lambda m: _copy_point(m, run_ids=False),
     r"this run holds adc\.bits = 8, where manifest\.json places it at the point adc\.bits = 4",
     r"'points'\[1\] repeats 'points'\[0\] \(adc\.bits=4\)"),
    # the last point and its run ids deleted ("4 runs, all done already")
    (lambda m: (m["points"].pop(), m["run_ids"].pop()), None,
     r"'points' leaves out the grid's point adc\.bits=8"),
    # one point's two seeds given one run id
    (lambda m: m["run_ids"][0].__setitem__(1, m["run_ids"][0][0]),
     r"'run_ids'\[0\] repeats the run id \w+ of 'run_ids'\[0\]",
     r"'run_ids'\[0\] repeats the run id \w+ of 'run_ids'\[0\]"),
])
def test_a_manifest_that_repeats_or_drops_a_point_is_refused(tmp_path, change, on_load,
                                                              on_resume):
    """A hand-edited manifest whose points are the grid's values but not its
    points (one twice, one left out) resumed as complete (an audit). A run
    id given twice is refused wherever the manifest is read, a run filed
    under another point when it is loaded; the points are checked against
    the grid on resume (a load shows the finished runs of the points the
    manifest lists)."""
    out = _edit_and_expect_refusals(tmp_path, change, on_load, on_resume)
    if on_load is None:
        assert set(load(out)["adc.bits"]) == {4}


def test_a_random_manifest_with_more_points_than_its_samples_is_refused(tmp_path):
    """A random sweep's points are not drawn again on resume (another version
    may draw others), but never number more than its samples: a third point
    inside the range, with its own run id, was run as the sweep's."""
    from optical.sweep import stored_definition

    out = _random_sweep(tmp_path / "s")
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    definition = stored_definition(out)
    data["points"].append({"source.photons_per_mac": 2e3})
    data["run_ids"].append([definition.run_id(
        definition.base.replace({"source.photons_per_mac": 2e3}), 0)])
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'points' holds 3 points; the sweep draws at most 2"):
        resume(out, executor="serial", progress=False)
    assert len(list((out / "runs").glob("*.json"))) == 2  # nothing run at 2e3


def _random_sweep(out):
    """A finished random sweep of two photon counts in [1e3, 1e4], one seed."""
    optical.sweep(WL, {"source.photons_per_mac": Range(1e3, 1e4, log=True)}, seeds=1,
                  samples=2, out=out, base=BASE, executor="serial", progress=False)
    return out


def test_a_run_not_yet_finished_is_not_filed_under_another_runs_id(tmp_path):
    """The review's case: a point edited while its run was still to come
    would have run adc.bits=6 under adc.bits=8's id, and another sweep
    would then have taken that run for its adc.bits=8 point."""
    out = _sweep(tmp_path / "s", seeds=1)
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    (out / "runs" / f"{data['run_ids'][1][0]}.json").unlink()  # point 1 not run yet
    data["points"][1]["adc.bits"] = 6
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"'points'\[1\] has adc\.bits = 6, which the sweep "
                                         "does not define"):
        resume(out, executor="serial", progress=False)
    data["points"][1]["adc.bits"] = 8
    data["run_ids"].reverse()  # and ids swapped while runs are still to come
    (out / "runs" / f"{data['run_ids'][1][0]}.json").unlink()
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"'run_ids'\[0\] names \w+, which is not the run"):
        resume(out, executor="serial", progress=False)
    assert list((out / "runs").glob("*.json")) == []  # nothing run under a wrong id


def test_a_run_shared_with_another_sweep_is_placed_by_its_config(tmp_path):
    """Run ids hash the workload, config and seed, not the swept paths: a run
    copied from a sweep over another path (its record's params name that
    path) is placed by its config, and passes the check."""
    import shutil

    first = tmp_path / "first"
    optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=1, out=first, base=BASE, executor="serial",
                  progress=False)
    second = tmp_path / "second"
    shutil.copytree(first / "runs", second / "runs")
    # adc.enob_loss at the base's own value: the first sweep's adc.bits=8 run.
    base = BASE.replace({"adc.bits": 8})
    summary = execute(SweepDefinition.build(WL, {"adc.enob_loss": [BASE.adc.enob_loss]},
                                            seeds=1, base=base),
                      second, executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (1, 0)
    frame, before = load(second), load(first)
    assert frame["sqnr_db"].tolist() == before["sqnr_db"].tolist()[1:]
    assert frame["run_id"].tolist() == before["run_id"].tolist()[1:]


@dataclasses.dataclass(frozen=True)
class Sleeps:
    """A custom workload whose every run takes at least ``seconds``."""

    seconds: float = 0.05

    def run(self, config, seed):
        time.sleep(self.seconds)
        return {"one": 1.0}

    def to_dict(self):
        return {"kind": "sleeps", "seconds": self.seconds}


def test_elapsed_s_is_the_run_time(tmp_path):
    """Each run sleeps 0.05 s: its elapsed_s is at least that (and not absurd)."""
    frame = optical.sweep(Sleeps(), {"adc.bits": [4, 6]}, seeds=2, out=tmp_path / "s",
                          executor="serial", progress=False)
    assert len(frame) == 4
    assert (frame["elapsed_s"] >= 0.05).all() and (frame["elapsed_s"] < 30).all()


@dataclasses.dataclass(frozen=True)
class Meets:
    """A custom workload whose run marks that it started in ``directory`` and
    waits (up to ``patience`` s) for a run of the other seed to start too."""

    directory: str
    patience: float = 60.0

    def run(self, config, seed):
        here = Path(self.directory)
        (here / f"started-{seed}").touch()
        deadline = time.monotonic() + self.patience
        while not (here / f"started-{1 - seed}").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return {"met": float((here / f"started-{1 - seed}").exists())}

    def to_dict(self):
        return {"kind": "meets", "directory": self.directory}


def test_two_local_workers_run_two_runs_at_once(tmp_path):
    """executor=2: both runs are in flight together, each in its own worker
    (one at a time, each would wait for the other in vain)."""
    frame = optical.sweep(Meets(str(tmp_path)), {"adc.bits": [6]}, seeds=2, out=tmp_path / "s",
                          executor=2, progress=False)
    assert frame["met"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(("path", "spec", "message"), [
    ("adc.bits", Range(6, 6), "must be finite with lo < hi"),
    ("adc.enob_loss", Range(1.0, 1.0), "must be finite with lo < hi"),
    ("adc.enob_loss", Range(0.0, 2.0, log=True), "a log range needs lo > 0"),
])
def test_range_bounds_are_checked_as_documented(path, spec, message):
    with pytest.raises(ValueError, match=message):
        SweepDefinition.build(WL, {path: spec}, seeds=1, base=BASE, samples=4)


def _reverse_manifest(out):
    """The manifest of an older version that listed the same points in
    another order (points and run ids together, consistently)."""
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    data["points"].reverse()
    data["run_ids"].reverse()
    path.write_text(json.dumps(data, indent=1))
    return data


def test_resume_runs_each_run_at_the_manifests_point(tmp_path):
    """Resuming follows the manifest's points and ids: with the manifest's
    order reversed and one run deleted, the run made again is the config of
    the point its id stands for (its stored config and metrics are those of
    a sweep run from scratch)."""
    whole = load(_sweep(tmp_path / "whole", seeds=1))
    out = _sweep(tmp_path / "s", seeds=1)
    data = _reverse_manifest(out)
    # data["points"] == [{"adc.bits": 8}, {"adc.bits": 4}]: delete the run of adc.bits 4
    (out / "runs" / f"{data['run_ids'][1][0]}.json").unlink()
    summary = resume(out, executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (1, 1)
    frame = load(out)
    assert frame["adc.bits"].tolist() == [8, 4]
    for _, row in frame.iterrows():
        assert json.loads(row["config"])["adc"]["bits"] == row["adc.bits"]
        expected = whole[whole["adc.bits"] == row["adc.bits"]].iloc[0]
        assert row["run_id"] == expected["run_id"]
        assert row["sqnr_db"] == expected["sqnr_db"]


def test_resume_uses_the_run_ids_in_the_manifest(tmp_path):
    """Run ids come from the manifest once it exists (a version without the
    mapping section hashed other config JSON): its finished runs, filed under
    those ids, are not re-run."""
    out = _sweep(tmp_path / "s")
    before = load(out)
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    renamed = {}
    for ids in data["run_ids"]:
        for i, old in enumerate(ids):
            new = f"{i}{old[1:]}"[::-1]  # another id of the same length
            renamed[old] = new
            ids[i] = new
    del data["definition"]["base_config"]["mapping"]  # as that version wrote it
    data["definition_hash"] = content_hash(data["definition"])
    path.write_text(json.dumps(data))
    for old, new in renamed.items():
        record = json.loads((out / "runs" / f"{old}.json").read_text())
        record["run_id"] = new
        (out / "runs" / f"{new}.json").write_text(json.dumps(record))
        (out / "runs" / f"{old}.json").unlink()
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    summary = execute(SweepDefinition.build(WL, PARAMS, seeds=2, base=BASE), out,
                      executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (4, 0)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamps
    after = load(out)
    assert sorted(after["run_id"]) == sorted(renamed.values())
    pd.testing.assert_frame_equal(after.drop(columns="run_id"), before.drop(columns="run_id"))


def test_a_lost_manifests_temporary_does_not_block_the_rebuild(tmp_path):
    """A kill while the manifest was written leaves `.manifest.json.*.tmp`
    and no manifest: the same sweep started again rebuilds it, finds the
    finished runs, and removes the temporary."""
    out = _sweep(tmp_path / "s")
    before = load(out)
    (out / "manifest.json").unlink()
    stale = out / ".manifest.json.12345.67890.tmp"
    stale.write_text('{"half": ')
    summary = execute(SweepDefinition.build(WL, PARAMS, seeds=2, base=BASE), out,
                      executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (4, 0)
    assert not stale.exists()
    pd.testing.assert_frame_equal(load(out), before)


@dataclasses.dataclass(frozen=True)
class NumpyDescribed:
    """A custom workload whose to_dict holds a numpy integer and an infinity."""

    def run(self, config, seed):
        return {"bits": float(config.adc.bits)}

    def to_dict(self):
        return {"kind": "numpy-described", "tokens": np.int64(8), "clip": float("inf")}


def test_a_custom_workload_described_with_numpy_and_inf_resumes_and_is_checked(tmp_path):
    """Its description is stored encoded: the resume's run-id check compared
    it raw (a TypeError for the numpy integer) and, for the infinity, never
    matched, so swapped ids of runs still to come went unnoticed."""
    out = tmp_path / "s"
    workload = NumpyDescribed()
    optical.sweep(workload, PARAMS, seeds=1, out=out, executor="serial", progress=False)
    summary = resume(out, workload=workload, executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (2, 0)
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    data["run_ids"].reverse()
    path.write_text(json.dumps(data))
    for run in (out / "runs").glob("*.json"):
        run.unlink()
    with pytest.raises(ValueError, match=r"'run_ids'\[0\] names \w+, which is not the run"):
        resume(out, workload=workload, executor="serial", progress=False)


@pytest.mark.parametrize("held", [np.ones(3), {1.5j}, object()])
def test_a_custom_workload_json_cannot_hold_is_named_before_anything_is_written(tmp_path, held):
    """An extension audit's to_dict() holding an array ended in json's bare
    "Object of type ndarray is not JSON serializable"; the refusal names the
    workload's to_dict and what to give, and the sweep writes nothing."""

    @dataclasses.dataclass(frozen=True)
    class Holding(NumpyDescribed):
        def to_dict(self):
            return {"kind": "holding", "weights": held}

    out = tmp_path / "s"
    with pytest.raises(TypeError, match=r"workload: Holding\.to_dict\(\) returned what JSON "
                                        r"cannot hold \(Object of type \w+ is not JSON "
                                        r"serializable\); a sweep stores it in its manifest"):
        optical.sweep(Holding(), PARAMS, seeds=1, out=out, executor="serial", progress=False)
    assert not out.exists()


def test_a_narrow_log_range_draws_within_its_bounds(tmp_path):
    """exp(uniform(log lo, log hi)) rounds an ulp outside [lo, hi] for about
    1 % of the draws of a range this narrow: such a point is clamped, so the
    sweep resumes (its points lie in the range the resume checks)."""
    spec = Range(1000.0, 1000.0000000001, log=True)
    definition = SweepDefinition.build(WL, {"source.photons_per_mac": spec}, seeds=1,
                                       samples=300)
    values = [p["source.photons_per_mac"] for p in definition.points()]
    assert len(values) > 100 and all(spec.lo <= v <= spec.hi for v in values)


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    """Every sweep file is written atomically: a write that fails half-way
    (a full disk) leaves the old file as it was, no temporary file behind,
    and an OSError naming the file."""
    from pathlib import Path

    path = tmp_path / "manifest.json"
    path.write_text("OLD")
    real = Path.write_text

    def half(self, text, *args, **kwargs):
        real(self, text[:len(text) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half)
    with pytest.raises(OSError, match="manifest.json"):
        atomic_write(path, "NEW-CONTENT")
    monkeypatch.undo()
    assert path.read_text() == "OLD"
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


def test_a_random_point_edited_outside_its_range_is_refused_even_with_its_own_run_id(
        tmp_path):
    """A Range's bounds are checked on resume like a list's values: a point
    of a random sweep moved outside its range, with the run id of the moved
    point written beside it (so the run-id check passes), would otherwise run
    a point the sweep does not define."""
    from optical.sweep import stored_definition

    out = _random_sweep(tmp_path / "s")
    path = out / "manifest.json"
    data = json.loads(path.read_text())
    (out / "runs" / f"{data['run_ids'][1][0]}.json").unlink()  # point 1 still to come
    data["points"][1]["source.photons_per_mac"] = 1e6
    definition = stored_definition(out)
    moved = definition.base.replace({"source.photons_per_mac": 1e6})
    data["run_ids"][1] = [definition.run_id(moved, 0)]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"'points'\[1\] has source\.photons_per_mac = "
                                         r"1000000\.0, which the sweep does not define"):
        resume(out, executor="serial", progress=False)
    assert len(list((out / "runs").glob("*.json"))) == 1  # nothing run at 1e6


class _Toy:
    """A custom workload whose metric is a known function of seed and config."""

    label = "toy"

    def run(self, config, seed):
        return {"m": float(seed) + config.adc.bits / 100}

    def to_dict(self):
        return {"kind": "toy"}


def _documented_columns(paths, metrics):
    return ["point", "seed", *paths, *metrics, "run_id", "elapsed_s", "finished_at",
            "optical_version", "optical_commit", "config"]


def test_a_file_named_runs_is_not_taken_for_a_sweeps_runs(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    (out / "runs").write_text("not a directory\n")
    with pytest.raises(ValueError, match=r"is not empty and holds no sweep .* holds runs"):
        optical.sweep(_Toy(), {"adc.bits": [6]}, seeds=1, out=out, base=BASE,
                      executor="serial", progress=False)
    assert (out / "runs").read_text() == "not a directory\n"


# The documented columns of the results table (optical.sweep.sweep, Returns).


def test_csv_results_hold_exactly_the_documented_columns(tmp_path):
    out = tmp_path / "s"
    summary = execute(SweepDefinition.build(_Toy(), {"adc.bits": [4, 6]}, seeds=2, base=BASE),
                      out, executor="serial", progress=False, results_format="csv")
    assert summary.results_path == out / "results.csv"
    table = pd.read_csv(out / "results.csv")
    assert list(table.columns) == _documented_columns(["adc.bits"], ["m"])
    assert len(table) == 2 * 2
    assert table["m"].tolist() == [s + b / 100 for b in (4, 6) for s in (0, 1)]


def test_resume_writes_the_results_format_it_is_given(tmp_path):
    from optical.sweep import resume

    out = tmp_path / "s"
    definition = SweepDefinition.build(_Toy(), {"adc.bits": [4, 6]}, seeds=1, base=BASE)
    execute(definition, out, executor="serial", progress=False, results_format="csv")
    (out / "results.csv").unlink()
    summary = resume(out, workload=_Toy(), executor="serial", progress=False,
                     results_format="csv")
    assert summary.results_path == out / "results.csv"
    assert (out / "results.csv").is_file() and not (out / "results.parquet").exists()
    assert pd.read_csv(out / "results.csv")["adc.bits"].tolist() == [4, 6]


def test_a_resumed_csv_sweep_stays_csv_and_a_switch_leaves_one_results_file(tmp_path):
    """No format given, a resume writes the format already in ``out`` (an
    interrupted CSV sweep, resumed with ``--out`` alone, used to switch to
    parquet and leave a stale results.csv with fewer runs); a format given
    replaces the other format's file."""
    out = tmp_path / "s"
    first = SweepDefinition.build(_Toy(), {"adc.bits": [4]}, seeds=1, base=BASE)
    execute(first, out, executor="serial", progress=False, results_format="csv")
    definition = SweepDefinition.build(_Toy(), {"adc.bits": [4, 6]}, seeds=1, base=BASE)
    (out / "manifest.json").unlink()  # the same directory, now a larger sweep
    summary = execute(definition, out, executor="serial", progress=False)
    assert summary.results_path == out / "results.csv"
    assert not (out / "results.parquet").exists()
    assert pd.read_csv(out / "results.csv")["adc.bits"].tolist() == [4, 6]
    summary = resume(out, workload=_Toy(), executor="serial", progress=False,
                     results_format="parquet")
    assert summary.results_path == out / "results.parquet"
    assert not (out / "results.csv").exists()
    assert pd.read_parquet(out / "results.parquet")["adc.bits"].tolist() == [4, 6]
    resume(out, workload=_Toy(), executor="serial", progress=False)  # parquet now
    assert sorted(p.name for p in out.glob("results.*")) == ["results.parquet"]
    # a results file that is a link: the link goes, what it points at stays
    kept = tmp_path / "elsewhere.parquet"
    (out / "results.parquet").rename(kept)
    (out / "results.parquet").symlink_to(kept)
    resume(out, workload=_Toy(), executor="serial", progress=False, results_format="csv")
    assert sorted(p.name for p in out.glob("results.*")) == ["results.csv"] and kept.is_file()
    resume(out, workload=_Toy(), executor="serial", progress=False)
    assert sorted(p.name for p in out.glob("results.*")) == ["results.csv"]


def test_an_executor_passed_in_is_not_closed_by_the_sweep(tmp_path):
    """make_executor: an Executor given is borrowed (owned False); only the
    executors the sweep makes itself are closed when it is done."""
    from optical.sweep import SerialExecutor

    class Recording(SerialExecutor):
        closed = 0

        def close(self):
            Recording.closed += 1

    runner = Recording()
    optical.sweep(_Toy(), {"adc.bits": [4, 6]}, seeds=1, out=tmp_path / "a", base=BASE,
                  executor=runner, progress=False)
    assert Recording.closed == 0


@pytest.mark.parametrize("content", [b"\xff\xfe{\x00\x81garbage",
                                     b"[" * 100_000 + b"]" * 100_000])
@pytest.mark.parametrize("damaged", ["run", "manifest"])
def test_a_binary_garbage_file_is_refused_naming_it(tmp_path, damaged, content):
    """A corrupt file (bytes that are not UTF-8, as a disk error or a
    truncated copy can leave, or JSON nested too deeply to parse) is a
    ValueError naming the file, as invalid JSON is, not a bare
    UnicodeDecodeError or RecursionError."""
    out = tmp_path / "s"
    definition = SweepDefinition.build(_Toy(), {"adc.bits": [4, 6]}, seeds=1, base=BASE)
    execute(definition, out, executor="serial", progress=False, results_format="csv")
    path = (sorted((out / "runs").glob("*.json"))[0] if damaged == "run"
            else out / "manifest.json")
    path.write_bytes(content)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: not valid JSON")):
        execute(definition, out, executor="serial", progress=False, results_format="csv")


@pytest.mark.parametrize("damaged", ["run", "manifest"])
def test_a_file_naming_a_key_twice_is_refused_naming_it(tmp_path, damaged):
    """An edited run or manifest naming a key twice is damaged: the first
    value would have been dropped without a word."""
    out = tmp_path / "s"
    definition = SweepDefinition.build(_Toy(), {"adc.bits": [4, 6]}, seeds=1, base=BASE)
    execute(definition, out, executor="serial", progress=False, results_format="csv")
    path = (sorted((out / "runs").glob("*.json"))[0] if damaged == "run"
            else out / "manifest.json")
    text = path.read_text()
    key = next(iter(json.loads(text)))
    path.write_text(text.replace("{", "{" + json.dumps(key) + ": 0, ", 1))
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}: not valid JSON (key "
                                                         f"{key!r} appears twice")):
        execute(definition, out, executor="serial", progress=False, results_format="csv")


def test_a_failed_atomic_write_names_the_file_not_its_temporary(tmp_path, monkeypatch):
    """replacing(): a failed write raises an OSError naming ``path``."""
    import os

    from optical import _files
    from optical._files import atomic_write

    monkeypatch.setattr(_files, "_unique", lambda: "f00d")
    path = tmp_path / "results.csv"
    # the temporary file's place is taken by a directory: opening it fails
    (tmp_path / f".{path.name}.{os.getpid()}.f00d.tmp").mkdir()
    with pytest.raises(OSError) as info:
        atomic_write(path, "x\n")
    assert info.value.filename == str(path)
    assert not path.exists()


def test_two_writes_of_one_file_never_share_a_temporary(tmp_path):
    """A concurrency audit: the temporary file was named by process and
    thread id alone, and a writer removed one of its own name as a kill's
    leftover, so two writers of one id (containers on two hosts sharing a
    directory; two writes in one thread) shared it and wrote into each
    other's. Each now gets its own; the last rename wins, whole."""
    from optical._files import replacing

    path = tmp_path / "results.csv"
    with replacing(path) as outer:
        outer.write_text("outer\n")
        with replacing(path) as inner:
            assert inner != outer
            inner.write_text("inner\n")
        assert path.read_text() == "inner\n" and outer.read_text() == "outer\n"
    assert path.read_text() == "outer\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.csv"]


def test_an_atomic_write_reaches_the_disk_before_its_rename(tmp_path, monkeypatch):
    """A power cut (not a kill) between the rename and the kernel's writeback
    could leave a run file empty: the new content is fsynced before the
    rename replaces the old file."""
    import os

    from optical import _files

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        events.append(("fsync", target, Path(target).is_file() and Path(target).read_text()))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(_files.os, "fsync", fsync)
    monkeypatch.setattr(_files.os, "replace", replace)
    path = tmp_path / "run.json"
    _files.atomic_write(path, "{}\n")
    assert [e[0] for e in events] == ["fsync", "replace"]
    tmp = events[1][1]
    assert events[0][1:] == (tmp, "{}\n") and events[1][2] == str(path)
    assert path.read_text() == "{}\n"


def test_attrs_list_the_metric_columns_in_the_tables_order(tmp_path):
    class TwoMetrics(_Toy):
        def run(self, config, seed):
            return {"zeta": 1.0, "alpha": 2.0}

    frame = optical.sweep(TwoMetrics(), {"adc.bits": [4]}, seeds=1, out=tmp_path / "s",
                          base=BASE, executor="serial", progress=False, results_format="csv")
    assert list(frame.columns) == _documented_columns(["adc.bits"], ["zeta", "alpha"])
    assert frame.attrs["sweep"]["metrics"] == ["zeta", "alpha"]


def test_vmapped_runs_share_their_batchs_time():
    """elapsed_s is a run's time: the runs of one batch share the batch's
    time, so their elapsed_s add up to no more than the sweep took."""
    import time

    from optical._executors import Task, VmapExecutor

    class Slow(_Toy):
        def batch_key(self, config):
            return "all"

        def run_batch(self, configs, seeds):
            time.sleep(0.2)
            return [{"m": float(s)} for s in seeds]

    tasks = [Task(f"r{i}", 0, i, Slow(), BASE) for i in range(4)]
    start = time.perf_counter()
    out = list(VmapExecutor(batch_size=4).run(tasks))
    wall = time.perf_counter() - start
    assert len(out) == 4 and wall >= 0.2
    assert sum(outcome["elapsed_s"] for _, outcome in out) <= wall


# --------------------------------------------------------------------------- #
# Two processes on one sweep directory
# --------------------------------------------------------------------------- #


def test_a_resume_leaves_another_writers_temporary_file_alone(tmp_path):
    """`optical plot D --json D/plot.json` (or the --json summary of the sweep
    that just ended) writing into the sweep directory while a resume starts:
    the resume removes the temporaries of its own files only (a kill's
    leftovers), so the other write completes."""
    from optical._files import replacing

    out = _sweep(tmp_path / "s", seeds=1)
    stale = out / f".{'results.parquet'}.999.1.tmp"  # a killed sweep's
    stale.write_text("")
    with replacing(out / "plot.json") as tmp:  # another process's write, in flight
        tmp.write_text("{}\n")
        _sweep(out, seeds=1)  # a resume starts meanwhile
    assert (out / "plot.json").read_text() == "{}\n"
    assert not stale.exists()


@pytest.mark.parametrize("code", ["ENOSYS", "ENOLCK"])
def test_a_file_system_without_flock_is_named_and_keeps_no_lock_file(tmp_path, monkeypatch,
                                                                     code):
    """flock unsupported (a Lustre or NFS mount without it): the error says
    what the lock is for and where, not a bare '[Errno 38] Function not
    implemented', the .lock made in a directory holding no sweep is removed
    again and its handle closed (a leaked one is a ResourceWarning, an error
    here)."""
    import errno
    import fcntl

    from optical._sweep_store import lock

    def flock(handle, op):
        raise OSError(getattr(errno, code), "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", flock)
    with pytest.raises(ValueError, match=r"cannot lock \.lock .*does not support the lock.*"
                                         r"or set OPTICAL_SWEEP_WITHOUT_FLOCK=1 to run"):
        with lock(tmp_path):
            pass
    assert not (tmp_path / ".lock").exists()


def test_a_file_system_without_flock_runs_a_sweep_unlocked_when_told(tmp_path, monkeypatch):
    """Where the cluster's only shared file system has no flock (Lustre
    mounted noflock), sweeps could not run at all: OPTICAL_SWEEP_WITHOUT_FLOCK=1
    runs them with a warning (the user keeps a second one out), whole and
    resumable; any other value is refused by name; the warning raised as an
    error (-W error) leaves no lock file and no open handle (a review)."""
    import errno
    import fcntl

    def flock(handle, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)
    out = tmp_path / "s"
    monkeypatch.setenv("OPTICAL_SWEEP_WITHOUT_FLOCK", "yes")
    with pytest.raises(ValueError, match=r"OPTICAL_SWEEP_WITHOUT_FLOCK='yes': expected 1"):
        optical.sweep(WL, {"adc.bits": [4, 6]}, seeds=1, out=out, executor="serial",
                      progress=False)
    monkeypatch.setenv("OPTICAL_SWEEP_WITHOUT_FLOCK", "1")
    # (the suite's filterwarnings=error: the warning is raised, before any run)
    with pytest.raises(RuntimeWarning, match="running without the sweep's lock"):
        optical.sweep(WL, {"adc.bits": [4, 6]}, seeds=1, out=out, executor="serial",
                      progress=False)
    assert not (out / ".lock").exists()  # (a leaked handle: a ResourceWarning, an error here)
    with pytest.warns(RuntimeWarning, match=r"running without the sweep's lock \(No locks "
                                            r"available; OPTICAL_SWEEP_WITHOUT_FLOCK=1\)"):
        frame = optical.sweep(WL, {"adc.bits": [4]}, seeds=1, out=out, executor="serial",
                              progress=False)
    with pytest.raises(ValueError, match="holds a different sweep"):  # (refused, as locked)
        with pytest.warns(RuntimeWarning):
            optical.sweep(WL, {"adc.bits": [4, 6]}, seeds=1, out=out, executor="serial",
                          progress=False)
    (out / "runs" / f"{frame['run_id'][0]}.json").unlink()  # resumed: the run again, alone
    with pytest.warns(RuntimeWarning):
        frame = optical.sweep(WL, {"adc.bits": [4]}, seeds=1, out=out, executor="serial",
                              progress=False)
    monkeypatch.undo()
    assert len(frame) == 1
    again = optical.sweep(WL, {"adc.bits": [4]}, seeds=1, out=tmp_path / "locked",
                          executor="serial", progress=False)
    pd.testing.assert_frame_equal(frame.drop(columns=["elapsed_s", "finished_at", "run_id"]),
                                  again.drop(columns=["elapsed_s", "finished_at", "run_id"]))


def test_a_manifest_that_appeared_meanwhile_is_not_replaced(tmp_path, monkeypatch):
    """Where flock does not exclude (a lock per host on a shared mount): a
    different sweep whose manifest appeared while this one prepared its own
    is refused, not silently replaced (its runs would be orphaned and
    load() return the other grid)."""
    import fcntl
    import sys

    monkeypatch.setattr(fcntl, "flock", lambda handle, op: None)
    sweep_module = sys.modules["optical.sweep"]
    out, real = tmp_path / "s", sweep_module.library_version

    def version():  # first called while this sweep builds its manifest
        monkeypatch.setattr(sweep_module, "library_version", real)
        optical.sweep(WL, {"adc.bits": [5]}, seeds=1, out=out, base=BASE,
                      executor="serial", progress=False)  # the other host's whole sweep
        return real()

    monkeypatch.setattr(sweep_module, "library_version", version)
    with pytest.raises(ValueError, match="holds a different sweep"):
        optical.sweep(WL, {"adc.bits": [4]}, seeds=1, out=out, base=BASE,
                      executor="serial", progress=False)
    assert read_manifest(out)["definition"]["params"] == {"adc.bits": [5]}
    assert not list(out.glob(".*.tmp"))


def test_an_exclusive_write_falls_back_to_a_rename_without_hard_links(tmp_path, monkeypatch):
    """A file system without hard links (FAT, some FUSE mounts) still gets
    the manifest, by rename, as before."""
    import errno
    import os

    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    atomic_write(tmp_path / "m.json", "x\n", exclusive=True)
    assert (tmp_path / "m.json").read_text() == "x\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]


def test_results_parquet_alone_rebuilds_the_call_of_each_run(tmp_path):
    """Two sweeps differing only in the workload's data seed had results
    tables alike in every column but the metrics and run ids (a
    reproduction audit): the table's attrs, which results.parquet keeps,
    hold the whole definition, and a run re-run from it alone gives its
    numbers."""
    from optical.workloads import workload_from_dict

    wl = optical.MatmulWorkload(tokens=8, k=48, n=16, data_seed=7, inputs="laplace")
    out = tmp_path / "s"
    optical.sweep(wl, {"adc.bits": [4, 6]}, seeds=[3], out=out, base=BASE, executor="serial",
                  progress=False)
    table = pd.read_parquet(out / "results.parquet")
    definition = table.attrs["sweep"]["definition"]
    stored = json.loads((out / "manifest.json").read_text())["definition"]
    assert definition == {k: v for k, v in stored.items() if k != "seeds"}  # (the column)
    rebuilt = workload_from_dict(definition["workload"])
    assert rebuilt == wl
    for _, row in table.iterrows():
        config = optical.OpticalConfig.from_dict(definition["base_config"]).replace(
            {"adc.bits": int(row["adc.bits"])})
        assert rebuilt.run(config, int(row["seed"]))["sqnr_db"] == row["sqnr_db"]
