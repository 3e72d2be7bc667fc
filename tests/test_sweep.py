"""Sweeps: definition and validation, results against direct runs, resume,
refusal of a changed sweep, executors agreeing bit for bit."""

import contextlib
import dataclasses
import fractions
import functools
import json
import math
import os
import pathlib
import platform
import re
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import optical
from optical import _executors, _signals, _sweep_definition
from optical._signals import sigterm_as_exit
from optical._sweep_store import content_hash, lock
from optical.sweep import (
    Range,
    SweepDefinition,
    SweepError,
    Terminated,
    execute,
    load,
    read_manifest,
    resume,
)

pd = pytest.importorskip("pandas")

WL = optical.MatmulWorkload(tokens=16, k=64, n=32)
PARAMS = {"adc.bits": [4, 8], "source.photons_per_mac": [1e4, 1e6]}
# K = 64 fits one K-tile of the 1024-input core; give it several tiles so the
# sweep exercises the tiled path.
BASE = optical.presets.get("iris-like").replace({"core.inputs": 32, "core.outputs": 16})
# The headroom sets the "rms" window alone (iris-like calibrates its windows).
RMS_BASE = BASE.replace({"adc.full_scale": "rms"})


def metric_frame(frame):
    """The columns that must not depend on where or when a run executed."""
    return frame.drop(columns=["elapsed_s", "finished_at"]).reset_index(drop=True)


def test_grid_rows_are_the_direct_runs(tmp_path):
    frame = optical.sweep(WL, PARAMS, seeds=2, out=tmp_path / "s", base=BASE,
                          executor="serial", progress=False)
    assert len(frame) == 4 * 2
    assert list(frame.columns[:4]) == ["point", "seed", "adc.bits", "source.photons_per_mac"]
    # the first path varies slowest, seeds fastest
    assert frame["adc.bits"].tolist() == [4, 4, 4, 4, 8, 8, 8, 8]
    assert frame["source.photons_per_mac"].tolist() == [1e4, 1e4, 1e6, 1e6] * 2
    assert frame["seed"].tolist() == [0, 1] * 4
    x, w, _ = WL.data()
    exact = x.astype(np.float64) @ w.astype(np.float64)
    for _, row in frame.iterrows():
        cfg = BASE.replace({"adc.bits": row["adc.bits"],
                            "source.photons_per_mac": row["source.photons_per_mac"]})
        assert optical.OpticalConfig.from_json(row["config"]) == cfg
        y, stats = optical.matmul(x, w, cfg, seed=int(row["seed"]), return_stats=True)
        assert row["sqnr_db"] == optical.metrics.sqnr_db(exact, y)
        assert row["cosine"] == optical.metrics.cosine(exact, y)
        assert row["relative_error"] == optical.metrics.relative_error(exact, y)
        assert row["clipped_fraction"] == stats.clipped_fraction
        assert row["passes"] == stats.passes == optical.core.schedule(16, 64, 32, cfg).passes
        assert row["optical_version"] == optical.__version__
    # more photons and more bits: a better result (averaged over seeds)
    mean = frame.groupby(["adc.bits", "source.photons_per_mac"])["sqnr_db"].mean()
    assert mean[(8, 1e6)] > mean[(4, 1e6)] and mean[(8, 1e6)] > mean[(8, 1e4)]


def test_noise_seeds_differ_but_data_do_not(tmp_path):
    frame = optical.sweep(WL, {"adc.bits": [8]}, seeds=[3, 7], out=tmp_path / "s",
                          base=BASE, executor="serial", progress=False)
    assert frame["seed"].tolist() == [3, 7]
    # any seed the library accepts, up to 2**64 - 1, lands in the table
    big = [2**63 + 5, 2**64 - 1]
    frame = optical.sweep(WL, {"adc.bits": [8]}, seeds=big, out=tmp_path / "big",
                          base=BASE, executor="serial", progress=False)
    assert frame["seed"].tolist() == big and load(tmp_path / "big")["seed"].tolist() == big
    assert frame["sqnr_db"].iloc[0] != frame["sqnr_db"].iloc[1]
    x1, w1, _ = WL.data()
    x2, w2, _ = dataclasses.replace(WL).data()
    assert np.array_equal(x1, x2) and np.array_equal(w1, w2)


def test_rerun_skips_finished_runs_and_keeps_their_files(tmp_path):
    out = tmp_path / "s"
    definition = SweepDefinition.build(WL, PARAMS, seeds=2, base=BASE)
    first = execute(definition, out, executor="serial", progress=False)
    assert (first.runs, first.already_done, first.ran) == (8, 0, 8)
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    before = load(out)
    second = execute(definition, out, executor="serial", progress=False)
    assert (second.runs, second.already_done, second.ran) == (8, 8, 0)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamps
    pd.testing.assert_frame_equal(load(out), before)
    assert pd.read_parquet(out / "results.parquet").shape == before.shape


@dataclasses.dataclass(frozen=True)
class Interruptible:
    """Like WL, but raises KeyboardInterrupt (Ctrl-C) at its ``stop_after``-th
    run in this process; its identity (to_dict) ignores that."""

    inner: optical.MatmulWorkload
    stop_after: int | None = dataclasses.field(default=None, compare=False)
    calls: list = dataclasses.field(default_factory=list, compare=False)

    label = "interruptible"

    def run(self, config, seed):
        self.calls.append(seed)
        if self.stop_after is not None and len(self.calls) > self.stop_after:
            raise KeyboardInterrupt
        return self.inner.run(config, seed)

    def to_dict(self):
        return self.inner.to_dict()


def test_interrupted_sweep_keeps_finished_runs_and_completes_each_run_once(tmp_path):
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        optical.sweep(Interruptible(WL, stop_after=3), PARAMS, seeds=2, out=out, base=BASE,
                      executor="serial", progress=False)
    assert len(load(out)) == 3
    (out / "runs" / ".half-written.json.1.2.tmp").write_text("{")  # as a kill mid-write
    for left in (".manifest.json.7.tmp", ".results.parquet.7.tmp"):  # of the table too
        (out / left).write_text("{")
    again = Interruptible(WL)
    summary = resume(out, workload=again, executor="serial", progress=False)
    assert (summary.already_done, summary.ran, len(again.calls)) == (3, 5, 5)
    frame = load(out)
    assert len(frame) == 8 and not frame.duplicated(["point", "seed"]).any()
    assert not list((out / "runs").glob(".*.tmp")) and not list(out.glob(".*.tmp"))
    whole = optical.sweep(WL, PARAMS, seeds=2, out=tmp_path / "whole", base=BASE,
                          executor="serial", progress=False)
    pd.testing.assert_frame_equal(metric_frame(frame), metric_frame(whole))


def test_failed_run_names_its_point_and_keeps_the_others(tmp_path):
    class Fails(Interruptible):
        def run(self, config, seed):
            if config.adc.bits == 8:
                raise RuntimeError("detector on fire")
            return self.inner.run(config, seed)

    out = tmp_path / "s"
    with pytest.raises(SweepError, match=r"adc.bits=8.*seed 0: RuntimeError: detector on fire"):
        optical.sweep(Fails(WL), PARAMS, seeds=2, out=out, base=BASE, executor="serial",
                      progress=False)
    assert sorted(load(out)["adc.bits"]) == [4, 4, 4, 4]


@pytest.mark.parametrize(("change", "message"), [
    ({"params": {"adc.bits": [4, 6], "source.photons_per_mac": [1e4, 1e6]}},
     r"params adc.bits: \[4, 8\] -> \[4, 6\]"),
    ({"seeds": 3}, r"seeds: \[0, 1\] -> \[0, 1, 2\]"),
    ({"base": BASE.replace({"adc.headroom": 3.0})}, r"base config adc.headroom: 4.0 -> 3.0"),
    ({"workload": optical.MatmulWorkload(16, 64, 32, inputs="laplace")},
     r"workload inputs: 'gaussian' -> 'laplace'"),
])
def test_changed_sweep_is_refused_naming_the_change(tmp_path, change, message):
    out = tmp_path / "s"
    kwargs = {"workload": WL, "params": PARAMS, "seeds": 2, "base": BASE} | change
    optical.sweep(WL, PARAMS, seeds=2, out=out, base=BASE, executor="serial", progress=False)
    files = sorted(p.name for p in (out / "runs").iterdir())
    manifest = (out / "manifest.json").read_text()
    with pytest.raises(ValueError, match="holds a different sweep") as info:
        optical.sweep(kwargs.pop("workload"), kwargs.pop("params"), out=out,
                      executor="serial", progress=False, **kwargs)
    assert info.match(message)
    # The runs of another workload are not the new sweep's: no advice to copy them.
    shared = "workload" not in change
    assert ("copy" in str(info.value)) == shared
    assert ("the two share no run (a run's id hashes its workload)" in str(info.value)) != shared
    assert sorted(p.name for p in (out / "runs").iterdir()) == files
    assert (out / "manifest.json").read_text() == manifest


@pytest.mark.parametrize(("change", "message"), [
    ({"sample_seed": 1}, r"sample_seed: 0 -> 1"), ({"samples": 5}, r"samples: 3 -> 5")])
def test_other_random_points_are_a_changed_sweep(tmp_path, change, message):
    """Random points drawn with another seed, or more of them, are another
    sweep: their first draws must not be answered with the stored ones."""
    out, params = tmp_path / "s", {"source.photons_per_mac": Range(1e3, 1e5, log=True)}
    kwargs = {"seeds": 2, "base": BASE, "executor": "serial", "progress": False}
    optical.sweep(WL, params, out=out, samples=3, sample_seed=0, **kwargs)
    assert read_manifest(out)["runs"] == 3 * 2 == len(load(out))
    with pytest.raises(ValueError, match="holds a different sweep") as info:
        optical.sweep(WL, params, out=out, **({"samples": 3, "sample_seed": 0} | change),
                      **kwargs)
    assert info.match(message)
    assert len(load(out)) == 6


def test_a_sample_seed_without_samples_is_refused(tmp_path):
    """A grid draws nothing: a sample seed beside it would only make the same
    grid a "different sweep" when it runs again without one (the CLI refuses
    --sample-seed without --samples alike)."""
    with pytest.raises(ValueError, match=r"sample_seed: applies only with samples"):
        optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=1, out=tmp_path / "s", sample_seed=5,
                      base=BASE, executor="serial", progress=False)
    assert not (tmp_path / "s").exists()


def test_a_grown_grid_reuses_the_runs_it_shares_as_the_refusal_says(tmp_path):
    """Adding a value is a different sweep: refused, with the way to keep the
    shared runs, which the new sweep then finds (and does not run again)."""
    import shutil

    out, grown = tmp_path / "s", tmp_path / "grown"
    optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=2, out=out, base=BASE, executor="serial",
                  progress=False)
    with pytest.raises(ValueError, match=rf"copy {out / 'runs'}/\*\.json into the new "
                                         "directory first"):
        optical.sweep(WL, {"adc.bits": [4, 6, 8]}, seeds=2, out=out, base=BASE,
                      executor="serial", progress=False)
    (grown / "runs").mkdir(parents=True)
    for run in (out / "runs").glob("*.json"):
        shutil.copy(run, grown / "runs")
    summary = execute(SweepDefinition.build(WL, {"adc.bits": [4, 6, 8]}, seeds=2, base=BASE),
                      grown, executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (4, 2)
    pd.testing.assert_frame_equal(load(grown)[load(grown)["adc.bits"] != 6].reset_index(
        drop=True).drop(columns=["point"]), load(out).drop(columns=["point"]))


def test_runs_copied_into_a_sweep_of_more_paths_are_reused(tmp_path):
    """The refusal's advice holds when the new sweep also sweeps a path the
    old one held fixed: a run id hashes the workload, the whole config and
    the seed, so the copied runs are the new sweep's own; its table takes
    every swept value from its manifest. (Their records lack the new path:
    they were refused as not runs of this sweep, with advice to delete them.)"""
    import shutil

    out, wider = tmp_path / "s", tmp_path / "wider"
    photons = BASE.source.photons_per_mac
    optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=2, out=out, base=BASE, executor="serial",
                  progress=False)
    (wider / "runs").mkdir(parents=True)
    for run in (out / "runs").glob("*.json"):
        shutil.copy(run, wider / "runs")
    params = {"adc.bits": [4, 8], "source.photons_per_mac": [photons, 10 * photons]}
    summary = execute(SweepDefinition.build(WL, params, seeds=2, base=BASE), wider,
                      executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (4, 4)
    frame = load(wider)
    assert sorted(frame["source.photons_per_mac"]) == [photons] * 4 + [10 * photons] * 4
    shared = frame[frame["source.photons_per_mac"] == photons].reset_index(drop=True)
    pd.testing.assert_frame_equal(shared.drop(columns=["point", "source.photons_per_mac"]),
                                  load(out).drop(columns=["point"]))


@pytest.mark.parametrize(("params", "kwargs", "message"), [
    ({"adc.bits": [4, 0]}, {}, "adc.bits: 0 is out of range"),
    ({"adc.bits": ["6"]}, {}, "adc.bits: '6' is not an integer"),
    ({"encoding.inputs": ["offset", "both"]}, {}, "encoding.inputs: 'both' is not valid"),
    ({"adc.bits": []}, {}, "adc.bits: no values given"),
    ({"adc.bits": [4, 4]}, {}, "adc.bits: value 4 is given twice"),
    ({"adc.bits": [2, 8], "adc.enob_loss": [0.0, 3.0]}, {},
     r"point adc.bits=2, adc.enob_loss=3.0: adc.enob_loss"),
    ({"adc.bits": Range(2, 8)}, {}, "a Range needs random sampling"),
    ({"encoding.inputs": Range(0, 1)}, {"samples": 3}, "a Range needs a numeric field"),
    ({"source.photons_per_mac": Range(0.0, 10.0, log=True)}, {"samples": 3},
     "source.photons_per_mac: 0.0 is out of range"),
    ({"adc.bits": [4]}, {"seeds": 0}, "seeds: 0 must be a positive number"),
    ({"adc.bits": [4]}, {"seeds": [1, 1]}, "repeats a seed"),
    ({"adc.bits": [4]}, {"samples": 0}, "samples: 0 must be a positive integer"),
    ({"adc.bits": [4]}, {"seeds": [0, -1]}, r"seeds: -1 is out of range"),
    ({"adc.bits": [4]}, {"seeds": np.array([0.0, 1.0])}, "seeds: an array of seeds must be 1-D "
                                                         "and of integers"),
    ({"adc.bits": [4]}, {"seeds": np.zeros((1, 2), int)}, "must be 1-D"),
    ({"adc.bits": [4]}, {"seeds": np.array([], int)}, "non-empty sequence of seeds"),
    ({"adc.bits": [4]}, {"samples": 2, "sample_seed": -1}, r"sample_seed: -1 is out of range"),
    # Past a million runs (a file each): refused at once, not after building
    # (a MemoryError) or drawing (hours) them.
    ({"adc.bits": [4]}, {"seeds": 10**11}, r"seeds: 100000000000 seeds are more than a sweep "
                                           r"holds \(at most 1000000 runs"),
    ({"adc.bits": Range(2, 8)}, {"samples": 10**11}, "samples: 100000000000 random points"),
    ({"adc.bits": Range(2, 8)}, {"samples": 1000, "seeds": 1001},
     r"samples, seeds: 1001000 runs \(points x seeds\)"),
    ({"adc.bits": [4, 6]}, {"seeds": 500_001}, r"params, seeds: 1000002 runs \(grid points"),
    # A sequence of seeds or of values too: before each entry is checked.
    ({"adc.bits": [4]}, {"seeds": range(10**11)}, "seeds: 100000000000 seeds are more"),
    ({"source.photons_per_mac": range(1, 10**6 + 2)}, {},
     "source.photons_per_mac: 1000001 values are more than a sweep holds"),
])
def test_bad_definition_fails_before_any_work(tmp_path, params, kwargs, message):
    out = tmp_path / "never"
    kwargs = {"seeds": 1} | kwargs
    with pytest.raises(ValueError, match=message):
        optical.sweep(WL, params, out=out, executor="serial", progress=False, **kwargs)
    assert not out.exists()


def test_out_must_be_a_sweep_or_empty(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        optical.sweep(WL, {}, seeds=1, out=tmp_path / "file", executor="serial",
                      progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and holds no sweep"):
        optical.sweep(WL, {}, seeds=1, out=tmp_path / "other", executor="serial",
                      progress=False)
    assert [p.name for p in (tmp_path / "other").iterdir()] == ["notes.txt"]  # no .lock left
    with pytest.raises(FileNotFoundError, match="no sweep here"):
        load(tmp_path / "missing")


def test_second_sweep_on_the_same_directory_is_refused(tmp_path):
    out = tmp_path / "s"
    out.mkdir()
    with lock(out), pytest.raises(ValueError, match="another sweep is running"):
        optical.sweep(WL, {}, seeds=1, out=out, executor="serial", progress=False)


def test_a_lock_file_a_failed_sweep_removed_is_never_held_twice(tmp_path, monkeypatch):
    """Sweep A made .lock and failed before its manifest (the file is removed);
    B had opened .lock just before and locks it just after: B must not hold
    the removed file, or a third sweep C makes a new .lock and runs beside B."""
    import fcntl

    a = lock(tmp_path)
    a.__enter__()
    real, pending = fcntl.flock, [True]

    def flock(handle, op):
        if pending and op & fcntl.LOCK_EX:  # between B's open and B's lock
            pending.clear()
            assert not a.__exit__(RuntimeError, RuntimeError("A fails"), None)  # re-raised
        return real(handle, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    with lock(tmp_path):  # B
        assert (tmp_path / ".lock").exists()
        with pytest.raises(ValueError, match="another sweep is running"), lock(tmp_path):  # C
            pass


def test_corrupt_run_file_is_named(tmp_path):
    out = tmp_path / "s"
    optical.sweep(WL, {}, seeds=1, out=out, executor="serial", progress=False)
    run = next((out / "runs").glob("*.json"))
    run.write_text('{"run_id": ')
    with pytest.raises(ValueError, match=run.name):
        load(out)


def test_a_sweep_runs_and_resumes_from_the_top_level_names_alone(tmp_path):
    """`optical.sweep` is the function, so `optical.sweep.Range` does not
    exist: Range, SweepError and resume are exported as optical.Range,
    optical.SweepError and optical.resume_sweep."""
    out = tmp_path / "s"
    params = {"adc.bits": optical.Range(3, 9)}
    workload = SignalledRun(WL, None, after="fail")  # its second run fails
    with pytest.raises(optical.SweepError, match="ImportError"):
        optical.sweep(workload, params, seeds=1, samples=3, out=out, base=BASE,
                      executor="serial", progress=False)
    assert len(load(out)) == 1
    summary = optical.resume_sweep(out, workload=WL, executor="serial", progress=False)
    assert summary.ran == 2 and len(load(out)) == 3
    assert load(out)["adc.bits"].between(3, 9).all()


def test_random_sampling_draws_in_range_and_resumes_the_same_points(tmp_path):
    params = {"source.photons_per_mac": Range(10.0, 1e5, log=True),
              "adc.bits": Range(3, 9), "encoding.inputs": ["offset", "split"]}
    definition = SweepDefinition.build(WL, params, seeds=1, base=BASE, samples=40,
                                       sample_seed=5)
    points = definition.points()
    assert points == SweepDefinition.build(WL, params, seeds=1, base=BASE, samples=40,
                                           sample_seed=5).points()
    assert points != SweepDefinition.build(WL, params, seeds=1, base=BASE, samples=40,
                                           sample_seed=6).points()
    photons = np.array([p["source.photons_per_mac"] for p in points])
    bits = [p["adc.bits"] for p in points]
    assert np.all((photons >= 10) & (photons <= 1e5))
    # log-uniform: log10 spread over the 4 decades, not bunched in the top one
    assert np.mean(np.log10(photons) < 3) > 0.25
    assert all(isinstance(b, int) and 3 <= b <= 9 for b in bits) and len(set(bits)) > 3
    assert {p["encoding.inputs"] for p in points} == {"offset", "split"}
    out = tmp_path / "r"
    small = SweepDefinition.build(WL, params, seeds=1, base=BASE, samples=4, sample_seed=5)
    execute(small, out, executor="serial", progress=False)
    manifest = read_manifest(out)
    assert manifest["definition"]["sampling"] == "random"
    assert manifest["points"] == json.loads(json.dumps(small.points()))
    frame = load(out)
    assert frame["source.photons_per_mac"].tolist() == [p["source.photons_per_mac"]
                                                        for p in small.points()]
    again = resume(out, executor="serial", progress=False)
    assert again.ran == 0 and again.already_done == 4


def test_infinite_and_none_values_round_trip(tmp_path):
    params = {"source.photons_per_mac": [math.inf, 1e5], "adc.bits": [None, 8]}
    frame = optical.sweep(WL, params, seeds=1, out=tmp_path / "s", base=BASE,
                          executor="serial", progress=False)
    assert frame["source.photons_per_mac"].tolist() == [math.inf, math.inf, 1e5, 1e5]
    assert frame["adc.bits"].tolist() == [None, 8, None, 8]
    assert read_manifest(tmp_path / "s")["points"][0] == {
        "source.photons_per_mac": "inf", "adc.bits": None}
    again = resume(tmp_path / "s", executor="serial", progress=False)
    assert again.ran == 0


def test_non_finite_metrics_keep_their_sign(tmp_path):
    """A metric of -inf (a zero reference against noise), +inf (exact) or NaN
    is stored as "-inf", "inf", "nan" and read back as such."""
    @dataclasses.dataclass(frozen=True)
    class NonFinite(Interruptible):
        label = "non-finite"

        def run(self, config, seed):
            return {"low": -math.inf, "high": math.inf, "missing": math.nan}

    frame = optical.sweep(NonFinite(WL), {"adc.bits": [4]}, seeds=1, out=tmp_path / "s",
                          base=BASE, executor="serial", progress=False)
    again = load(tmp_path / "s")
    for table in (frame, again):
        assert table["low"].tolist() == [-math.inf] and table["high"].tolist() == [math.inf]
        assert math.isnan(table["missing"].iloc[0])


def test_local_processes_give_the_serial_results(tmp_path):
    # Bit for bit, on a shape whose float64 truth a multi-threaded BLAS would
    # round differently from the workers' single BLAS thread (100 x 300 x 70).
    workload = optical.MatmulWorkload(tokens=100, k=300, n=70, outlier_channels=3)
    serial = optical.sweep(workload, PARAMS, seeds=2, out=tmp_path / "serial", base=BASE,
                           executor="serial", progress=False)
    procs = optical.sweep(workload, PARAMS, seeds=2, out=tmp_path / "procs", base=BASE,
                          executor=2, progress=False)
    pd.testing.assert_frame_equal(metric_frame(procs), metric_frame(serial), check_exact=True)


def test_dask_threads_cluster_gives_the_serial_results(tmp_path):
    distributed = pytest.importorskip("distributed")
    serial = optical.sweep(WL, PARAMS, seeds=2, out=tmp_path / "serial", base=BASE,
                           executor="serial", progress=False)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        frame = optical.sweep(WL, PARAMS, seeds=2, out=tmp_path / "dask", base=BASE,
                              executor=client, progress=False)
    pd.testing.assert_frame_equal(metric_frame(frame), metric_frame(serial), check_exact=True)


@pytest.mark.slow
def test_dask_process_cluster_gives_the_local_process_results(tmp_path):
    distributed = pytest.importorskip("distributed")
    procs = optical.sweep(WL, PARAMS, seeds=3, out=tmp_path / "procs", base=BASE,
                          executor=2, progress=False)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        frame = optical.sweep(WL, PARAMS, seeds=3, out=tmp_path / "dask", base=BASE,
                              executor=client, progress=False)
        # interrupted here, finished on the cluster: only the missing runs run there
        out = tmp_path / "half"
        with pytest.raises(KeyboardInterrupt):
            optical.sweep(Interruptible(WL, stop_after=5), PARAMS, seeds=3, out=out,
                          base=BASE, executor="serial", progress=False)
        definition = SweepDefinition.build(WL, PARAMS, seeds=3, base=BASE)
        summary = execute(definition, out, executor=client, progress=False)
        assert (summary.already_done, summary.ran) == (5, 7)
        assert "Dask cluster" in summary.executor
    pd.testing.assert_frame_equal(metric_frame(load(out)), metric_frame(procs), check_exact=True)
    pd.testing.assert_frame_equal(metric_frame(frame), metric_frame(procs), check_exact=True)


def test_executor_argument_is_checked(tmp_path):
    with pytest.raises(TypeError, match="executor: 'threads' is not valid"):
        optical.sweep(WL, {}, seeds=1, out=tmp_path / "s", executor="threads",
                      progress=False)
    for jobs in (0, -2):  # named as `executor`, the argument given (it said `jobs`)
        with pytest.raises(ValueError, match=rf"^executor: {jobs} is not a number of jobs"):
            optical.sweep(WL, {}, seeds=1, out=tmp_path / "t", executor=jobs, progress=False)


@pytest.mark.parametrize(("jobs", "workers", "threads"), [
    (None, 8, 1), (1, 1, 8), (3, 3, 2), (4, 4, 2), (16, 16, 1)])
def test_local_workers_share_the_cores(monkeypatch, jobs, workers, threads):
    """On 8 cores, each of the workers' BLAS/OpenMP pools gets cores // jobs
    threads, at least one: together they never oversubscribe the cores (until
    there are more workers than cores). No pool is started."""
    monkeypatch.setattr(_executors, "_available_cores", lambda: 8)
    executor = _executors.ProcessExecutor(jobs)
    assert (executor.jobs, executor.threads) == (workers, threads)
    assert executor.jobs * executor.threads <= max(8, executor.jobs)
    executor._get_pool(100)  # a call of 100 runs (the pool starts no process until a submit)
    executor._ran = 100
    try:
        assert (executor.workers, executor.threads) == (workers, threads)
        assert executor.describe() == \
            f"{workers} local worker process{'es' if workers > 1 else ''}"
    finally:
        executor.close()


@pytest.mark.parametrize(("jobs", "runs", "workers", "threads"), [
    (64, 2, 2, 4), (3, 1, 1, 8), (None, 5, 5, 1), (4, 0, 0, None)])
def test_local_workers_are_no_more_than_the_runs(monkeypatch, jobs, runs, workers, threads):
    """--jobs 64 for 2 runs on 8 cores starts 2 workers of 4 threads each (not
    64 of one, most of them idle), and says so."""
    monkeypatch.setattr(_executors, "_available_cores", lambda: 8)
    executor = _executors.ProcessExecutor(jobs)
    started = []
    monkeypatch.setattr(_executors.cf, "ProcessPoolExecutor",
                        lambda max_workers, initargs, **_: started.append(
                            (max_workers, initargs[0])) or FakePool())
    tasks = [_executors.Task(f"r{i}", 0, i, WL, BASE) for i in range(runs)]
    assert len(list(executor.run(tasks))) == runs
    assert started == ([(workers, threads)] if runs else [])
    assert executor.describe() == {0: "no worker process (nothing to run)",
                                   1: "1 local worker process"}.get(
        workers, f"{workers} local worker processes")


def test_a_later_call_with_more_runs_starts_a_bigger_pool(monkeypatch):
    """jobs=4 on 8 cores: a call of 1 run starts 1 worker of 8 threads; a later
    call of 3 runs needs 3 workers, so the small pool is closed and one of 3
    workers (8 // 3 = 2 threads each) starts; a call of 2 runs then reuses it
    (enough workers) and describe() speaks of that call alone: 2 workers in
    use, and an empty call after it runs nothing."""
    monkeypatch.setattr(_executors, "_available_cores", lambda: 8)
    executor = _executors.ProcessExecutor(4)
    started, closed = [], []

    class Recorded(FakePool):
        def shutdown(self, **_):
            closed.append(self)

    monkeypatch.setattr(_executors.cf, "ProcessPoolExecutor",
                        lambda max_workers, initargs, **_: started.append(
                            (max_workers, initargs[0])) or Recorded())

    def call(runs):
        tasks = [_executors.Task(f"r{i}", 0, i, WL, BASE) for i in range(runs)]
        assert len(list(executor.run(tasks))) == runs
        return executor.describe()

    assert call(1) == "1 local worker process"
    assert started == [(1, 8)]
    assert call(3) == "3 local worker processes"
    assert started == [(1, 8), (3, 2)] and len(closed) == 1  # the pool of 1 is closed
    assert (executor.workers, executor.threads) == (3, 2)
    assert call(2) == "2 local worker processes"
    assert started == [(1, 8), (3, 2)]  # the pool of 3 serves 2 runs: none started
    assert call(0) == "no worker process (nothing to run)"
    executor.close()
    assert len(closed) == 2


def test_a_dead_worker_keeps_its_reason_and_names_the_main_guard(monkeypatch):
    """A BrokenProcessPool from the pool comes back as the run's outcome, still
    a BrokenProcessPool, with the pool's own reason kept and the main guard
    named (the usual cause of a worker that dies as it starts)."""
    import concurrent.futures as cf
    from concurrent.futures.process import BrokenProcessPool

    class Broken(FakePool):
        def submit(self, fn, *args):
            future = cf.Future()
            future.set_exception(BrokenProcessPool("the pool's own reason"))
            return future

    monkeypatch.setattr(_executors.cf, "ProcessPoolExecutor", lambda **_: Broken())
    executor = _executors.ProcessExecutor(2)
    tasks = [_executors.Task(f"r{i}", 0, i, WL, BASE) for i in range(2)]
    outcomes = [outcome for _, outcome in executor.run(tasks)]
    executor.close()
    assert len(outcomes) == 2
    for err in outcomes:
        assert isinstance(err, BrokenProcessPool)
        assert str(err).startswith("a worker process died while ")
        assert ("runs were in flight, this one among them (the pool's own reason); if it died "
                "as it started, worker processes are spawned") in str(err)
        assert 'under `if __name__ == "__main__":`' in str(err)


@dataclasses.dataclass(frozen=True)
class FailsSeed0:
    """A workload whose run of seed 0 fails."""

    def run(self, config, seed):
        if seed == 0:
            raise RuntimeError("seed 0 fails")
        return {"sqnr_db": float(seed)}

    def to_dict(self):
        return {"kind": "fails-seed-0"}


def test_runs_finished_beside_a_failed_one_are_kept(tmp_path, monkeypatch):
    """Runs that finish in the same wait as a failed run are recorded before
    the failure ends the sweep (they were dropped in the set's order, and ran
    again on resume)."""
    class CatchingPool(FakePool):
        def submit(self, fn, *args):
            import concurrent.futures as cf

            future = cf.Future()
            try:
                future.set_result(fn(*args))
            except Exception as err:  # noqa: BLE001 - the run's failure, as a pool gives it
                future.set_exception(err)
            return future

    real_wait = _executors.cf.wait

    def failure_first(fs, return_when):  # an order a set may give: the failure first
        done, pending = real_wait(fs, return_when=return_when)
        return sorted(done, key=lambda f: f.exception() is None), pending

    monkeypatch.setattr(_executors.cf, "ProcessPoolExecutor", lambda **_: CatchingPool())
    monkeypatch.setattr(_executors.cf, "wait", failure_first)
    executor = _executors.ProcessExecutor(4)  # a window of 8: every run in one wait
    with pytest.raises(SweepError, match="seed 0: RuntimeError: seed 0 fails. The 7 runs "):
        optical.sweep(FailsSeed0(), {"adc.bits": [4]}, seeds=8, out=tmp_path / "s",
                      executor=executor, progress=False)
    executor.close()
    assert len(list((tmp_path / "s" / "runs").glob("*.json"))) == 7


class FakePool:
    """A ProcessPoolExecutor that runs each task at once in this process."""

    def submit(self, fn, *args):
        import concurrent.futures as cf

        future = cf.Future()
        future.set_result(fn(*args))
        return future

    def shutdown(self, **_):
        pass


def test_progress_bar_on_stderr_unless_quiet(tmp_path, capsys):
    optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=1, out=tmp_path / "a", executor="serial")
    assert "2/2" in capsys.readouterr().err
    optical.sweep(WL, {"adc.bits": [4, 8]}, seeds=1, out=tmp_path / "b", executor="serial",
                  progress=False)
    assert capsys.readouterr().err == ""


def test_resumed_progress_bar_counts_the_runs_already_done(tmp_path, capsys):
    """3 of 8 runs finished before an interruption: the resumed bar starts at
    3/8 and the 5 runs left take it to 8/8."""
    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        optical.sweep(Interruptible(WL, stop_after=3), PARAMS, seeds=2, out=out, base=BASE,
                      executor="serial", progress=False)
    capsys.readouterr()
    resume(out, executor="serial")
    err = capsys.readouterr().err
    assert "3/8" in err and "8/8" in err  # counted from 0, 5 runs would end at 5/8


def test_sweep_written_before_a_new_config_field_resumes_without_rerunning(tmp_path):
    """A manifest from a version without the `mapping` section: the same
    sweep, since the new field's default keeps the old behaviour."""
    out = tmp_path / "s"
    optical.sweep(WL, PARAMS, seeds=1, out=out, base=BASE, executor="serial", progress=False)
    before = load(out)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["definition"]["base_config"]["mapping"]
    # ... whose definition_hash that version computed over its own definition.
    manifest["definition_hash"] = content_hash(manifest["definition"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "runs" / "0123456789abcdef0123.json").write_text("stray file, not a run")
    summary = execute(SweepDefinition.build(WL, PARAMS, seeds=1, base=BASE), out,
                      executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (4, 0)
    pd.testing.assert_frame_equal(load(out), before)


def test_integer_range_draws_every_integer_uniformly():
    from scipy import stats

    params = {"adc.bits": Range(3, 6), "adc.headroom": Range(1.0, 8.0)}
    points = SweepDefinition.build(WL, params, seeds=1, samples=2000, sample_seed=1,
                                   base=RMS_BASE).points()
    assert len(points) == 2000  # the continuous headroom makes every draw distinct
    bits = np.array([p["adc.bits"] for p in points])
    counts = np.bincount(bits, minlength=7)
    assert counts[:3].sum() == 0 and counts[3:].min() > 0  # both ends included
    assert stats.chisquare(counts[3:]).pvalue > 1e-3
    headroom = np.array([p["adc.headroom"] for p in points])
    assert stats.kstest(headroom, stats.uniform(1.0, 7.0).cdf).pvalue > 1e-3


@pytest.mark.slow
def test_vmap_executor_gives_the_serial_results_of_jax_runs(tmp_path):
    """JAX runs batched in one vmap (seeds x photons, rule-based windows; seeds
    only under calibrated windows) give the very numbers of one-by-one runs."""
    pytest.importorskip("jax")
    workload = optical.MatmulWorkload(tokens=12, k=96, n=40, backend="jax")
    base = BASE.replace({"adc.full_scale": "rms"})
    params = {"source.photons_per_mac": [1e3, 1e5], "adc.bits": [6, 8]}
    batched = optical.sweep(workload, params, seeds=3, out=tmp_path / "v", base=base,
                            executor="vmap", progress=False)
    serial = optical.sweep(workload, params, seeds=3, out=tmp_path / "s", base=base,
                           executor="serial", progress=False)
    pd.testing.assert_frame_equal(batched.drop(columns=["elapsed_s", "finished_at"]),
                                  serial.drop(columns=["elapsed_s", "finished_at"]))
    assert batched["sqnr_db"].nunique() == len(batched)  # every run its own noise
    # one vmap per ADC resolution (its windows), over 3 seeds x 2 photon counts
    assert _vmap_batches(tmp_path / "v") == [6] * 12
    assert _vmap_batches(tmp_path / "s") == [None] * 12
    calibrated = optical.sweep(workload, {"source.photons_per_mac": [1e3, 1e5]}, seeds=2,
                               out=tmp_path / "c", base=BASE, executor="vmap", progress=False)
    one = workload.run(BASE.replace({"source.photons_per_mac": 1e5}), 1)
    row = calibrated[(calibrated["source.photons_per_mac"] == 1e5) & (calibrated["seed"] == 1)]
    assert row["sqnr_db"].item() == one["sqnr_db"]


def test_seeds_a_workload_cannot_run_are_refused_before_any_run(tmp_path):
    # The JAX backend's keys are 32-bit: refused when the sweep is defined,
    # not after its first runs.
    jax_workload = optical.MatmulWorkload(tokens=4, k=16, n=8, backend="jax")
    with pytest.raises(ValueError, match=r"seeds: 4294967296 is out of range for the JAX "
                                         r"backend; valid: \[0, 2\*\*32\)"):
        optical.sweep(jax_workload, {}, seeds=[0, 2**32], out=tmp_path / "j", base=BASE,
                      executor="serial", progress=False)
    assert not (tmp_path / "j").exists()
    assert SweepDefinition.build(jax_workload, {}, seeds=[0, 2**32 - 1]).seeds == (0, 2**32 - 1)
    assert SweepDefinition.build(WL, {}, seeds=[2**32]).seeds == (2**32,)  # numba: 64-bit


def test_numpy_seeds_are_seeds():
    """Seeds computed with numpy: an integer array, numpy integers, a numpy count."""
    def seeds(value):
        return SweepDefinition.build(WL, {}, seeds=value).seeds

    assert seeds(np.arange(2)) == seeds([0, 1]) == seeds(np.int64(2)) == (0, 1)
    assert seeds(np.array([7, 3], dtype=np.uint32)) == seeds([np.int64(7), np.int8(3)]) == (7, 3)
    assert all(type(s) is int for s in seeds(np.arange(3)))


def sweep_dir(tmp_path, runs=None):
    """A finished (or, with ``runs``, partly finished) sweep of WL x PARAMS x 2 seeds."""
    out = tmp_path / "s"
    workload = WL if runs is None else Interruptible(WL, stop_after=runs)
    try:
        optical.sweep(workload, PARAMS, seeds=2, out=out, base=BASE, executor="serial",
                      progress=False)
    except KeyboardInterrupt:
        pass
    return out


def definition():
    return SweepDefinition.build(WL, PARAMS, seeds=2, base=BASE)


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_lost_manifest_advice_works_and_finds_the_finished_runs(tmp_path, damage):
    """A truncated (or deleted) manifest: the error says to delete it and start
    the same sweep again; doing so finds every finished run, re-running none."""
    out = sweep_dir(tmp_path)
    before = load(out)
    manifest = out / "manifest.json"
    if damage == "truncate":
        manifest.write_text(manifest.read_text()[:100])
        for call in (lambda: load(out), lambda: resume(out, progress=False),
                     lambda: execute(definition(), out, executor="serial", progress=False)):
            with pytest.raises(ValueError, match="not valid JSON") as info:
                call()
            assert str(manifest) in str(info.value) and "delete" in str(info.value)
            assert "not re-run" in str(info.value)
        manifest.unlink()
    else:
        manifest.unlink()
        with pytest.raises(FileNotFoundError, match="start the same sweep again"):
            load(out)
        # A file of the user's in the directory (say a --json summary) stops
        # the rebuild, and the error names it and says what to do.
        (out / "summary.json").write_text("{}")
        with pytest.raises(ValueError, match=r"holds summary.json: .*move those away"):
            execute(definition(), out, executor="serial", progress=False)
        (out / "summary.json").unlink()
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    summary = execute(definition(), out, executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (8, 0)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamps
    pd.testing.assert_frame_equal(load(out), before)


def test_a_rebuilt_manifest_places_the_finished_runs_at_its_own_points(tmp_path):
    """Run ids hash (workload, config, seed), not a point's position: a manifest
    rebuilt from the same sweep with its values in another order, or from a
    part of it, finds the finished runs and shows them at its own points."""
    out = sweep_dir(tmp_path)
    before = load(out)
    (out / "manifest.json").unlink()
    reordered = {"source.photons_per_mac": [1e6, 1e4], "adc.bits": [8, 4]}
    summary = execute(SweepDefinition.build(WL, reordered, seeds=2, base=BASE), out,
                      executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (8, 0)
    after = load(out)
    manifest = read_manifest(out)
    for _, row in after.iterrows():
        point = manifest["points"][row["point"]]
        assert point["adc.bits"] == row["adc.bits"]
        assert point["source.photons_per_mac"] == row["source.photons_per_mac"]
    key = ["adc.bits", "source.photons_per_mac", "seed"]
    pd.testing.assert_frame_equal(
        after.drop(columns="point").sort_values(key).reset_index(drop=True),
        before.drop(columns="point").sort_values(key).reset_index(drop=True)[
            list(after.columns.drop("point"))])
    # A part of the sweep: its one point holds the two finished runs of that point.
    (out / "manifest.json").unlink()
    part = {"adc.bits": [8], "source.photons_per_mac": [1e4]}
    summary = execute(SweepDefinition.build(WL, part, seeds=2, base=BASE), out,
                      executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (2, 0)
    frame = load(out)
    assert list(frame["point"]) == [0, 0] and list(frame["seed"]) == [0, 1]
    assert set(frame["adc.bits"]) == {8} and set(frame["source.photons_per_mac"]) == {1e4}


def test_boolean_metrics_of_older_runs_are_read_as_numbers(tmp_path):
    """Versions before the record checks stored a custom workload's booleans."""
    out = sweep_dir(tmp_path)
    run = next((out / "runs").glob("*.json"))
    record = json.loads(run.read_text())
    record["metrics"]["converged"] = True
    run.write_text(json.dumps(record))
    frame = load(out)
    assert frame["converged"].dropna().tolist() == [1.0]


def _damage(manifest, change):
    data = json.loads(manifest.read_text())
    change(data)
    manifest.write_text(json.dumps(data))


@pytest.mark.parametrize(("change", "message"), [
    (lambda m: m.pop("definition"), "missing key 'definition'"),
    (lambda m: m["definition"].pop("seeds"), "missing key 'definition.seeds'"),
    (lambda m: m["definition"].update(workload=[1]), "'definition.workload' is not a JSON "
                                                     "object"),
    (lambda m: m.update(run_ids={}), "'run_ids' is not a JSON array"),
    (lambda m: m["run_ids"].pop(), "'run_ids' has 3 entries for 4 points"),
    (lambda m: m["run_ids"].__setitem__(1, "abc"), r"'run_ids'\[1\] is not a list of one run id "
                                                   "per seed"),
    (lambda m: m["points"][2].pop("adc.bits"), r"'points'\[2\] does not give a value"),
    (lambda m: m.update(params=["adc.bits"]), "'params' does not list"),
    (lambda m: m.update(format=None), "'format' is None"),
    # A definition edited by hand: its runs would be passed off as another sweep's.
    (lambda m: m["definition"]["workload"].update(tokens=9),
     "its 'definition' does not match its 'definition_hash' \\(the definition was edited"),
    # Another version's workload kind (that version wrote its own hash).
    (lambda m: (m["definition"]["workload"].update(kind="mystery"),
                m.update(definition_hash=content_hash(m["definition"]))),
     r"manifest.json: the sweep's workload, of kind 'mystery', is not one its manifest can "
     r"rebuild \(built-in: matmul, layer\): a custom workload's sweep resumes from Python"),
])
def test_damaged_manifest_is_named_with_what_is_wrong(tmp_path, change, message):
    out = sweep_dir(tmp_path)
    _damage(out / "manifest.json", change)
    calls = [lambda: resume(out, executor="serial", progress=False)]
    if "mystery" not in message:  # (only resuming rebuilds the definition)
        calls += [lambda: load(out),
                  lambda: execute(definition(), out, executor="serial", progress=False)]
    for call in calls:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert str(out / "manifest.json") in str(info.value)


def test_a_manifest_not_of_this_version_or_not_a_sweeps_is_not_to_be_deleted(tmp_path):
    out = sweep_dir(tmp_path)
    _damage(out / "manifest.json", lambda m: m.update(format="optical-sweep/2"))
    with pytest.raises(ValueError, match="format 'optical-sweep/2', written by another version"):
        load(out)
    (out / "manifest.json").write_text('{"name": "my notes"}')
    with pytest.raises(ValueError, match="not an optical sweep manifest") as info:
        load(out)
    assert "delete" not in str(info.value)


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r.pop("seed"), "missing key 'seed'"),
    (lambda r: r.update(point="0"), "'point' is '0', not an integer"),
    (lambda r: r.update(seed=True), "'seed' is True, not an integer"),  # JSON true: no seed
    (lambda r: r.update(metrics=[1.0]), "'metrics' is \\[1.0\\], not a JSON object"),
    (lambda r: r["metrics"].update(sqnr_db="high"), "metric 'sqnr_db' is 'high', not a number"),
    (lambda r: r["metrics"].update(sqnr_db=10**400),  # past what a float column holds
     "metric 'sqnr_db' is 100000000000000000...0000000000000000000, not a number"),
    (lambda r: r.update(params=[4]), "'params' is \\[4\\], not a JSON object"),
    (lambda r: r.update(run_id="0123"), "'run_id' '0123' is not the file's name"),
])
def test_damaged_run_file_is_named_before_any_run(tmp_path, change, message):
    out = sweep_dir(tmp_path, runs=3)
    run = sorted((out / "runs").glob("*.json"))[1]
    record = json.loads(run.read_text())
    change(record)
    run.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=message) as info:
        load(out)
    assert run.name in str(info.value) and "Delete it and resume" in str(info.value)
    again = Interruptible(WL)
    with pytest.raises(ValueError, match=message):
        resume(out, workload=again, executor="serial", progress=False)
    assert again.calls == []  # refused before any run
    run.unlink()  # the advice: it runs again
    summary = resume(out, workload=again, executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (2, 6)
    pd.testing.assert_frame_equal(metric_frame(load(out)),
                                  metric_frame(load(sweep_dir(tmp_path / "whole"))))


@dataclasses.dataclass(frozen=True)
class Returns:
    """A workload whose runs return ``metrics``."""

    metrics: dict = dataclasses.field(hash=False)

    def run(self, config, seed):
        return dict(self.metrics)

    def to_dict(self):
        return {"kind": "returns"}


@pytest.mark.parametrize(("metrics", "message"), [
    ({"seed": 1.0}, "a metric named 'seed', which is a column of the run"),
    ({"adc.bits": 1.0}, "a metric named 'adc.bits'"),
    ({"error": "big"}, "metric 'error' = 'big', not a number"),
    # A Fraction passed as a numbers.Real, then json.dumps failed on it.
    ({"error": fractions.Fraction(1, 3)}, r"metric 'error' = Fraction\(1, 3\), not a number"),
    # Stored, then the sweep refused its own run file as damaged.
    ({"error": 10**400}, r"metric 'error' = 1000.*, a finite number beyond float64's range"),
    ({"error": np.longdouble("1e310")}, "a finite number beyond float64's range"),
])
def test_metrics_that_cannot_be_columns_are_refused(tmp_path, metrics, message):
    with pytest.raises(SweepError, match=message):
        optical.sweep(Returns(metrics), {"adc.bits": [4]}, seeds=1, out=tmp_path / "s",
                      executor="serial", progress=False)


@dataclasses.dataclass(frozen=True)
class ReturnsList:
    """A workload whose run returns a list, not a dict of metrics."""

    def run(self, config, seed):
        return [float(config.adc.bits)]

    def to_dict(self):
        return {"kind": "returns-list"}


@pytest.mark.parametrize("executor", ["serial", 2])
def test_a_run_returning_no_dict_is_named_in_this_process_and_in_workers(tmp_path, executor):
    """A coverage audit found the check of a run's return, here and in a
    worker process, untested: the run fails naming the workload's run and
    what it returned."""
    with pytest.raises(SweepError, match=r"run failed at point adc\.bits=4, seed 0: TypeError: "
                                         r"ReturnsList\.run returned list, expected a dict of "
                                         r"metrics\. The 0 runs finished so far are kept"):
        optical.sweep(ReturnsList(), {"adc.bits": [4]}, seeds=1, out=tmp_path / "s",
                      executor=executor, progress=False)


def test_a_longdouble_metric_is_stored_as_a_float(tmp_path):
    """np.longdouble's item() is a longdouble again: encoding it recursed
    until RecursionError, and a resume crashed the same way."""
    frame = optical.sweep(Returns({"m": np.longdouble(1.5), "n": np.float32(0.25)}),
                          {"adc.bits": [4]}, seeds=1, out=tmp_path / "s", executor="serial",
                          progress=False)
    assert frame["m"].tolist() == [1.5] and frame["n"].tolist() == [0.25]


def test_a_0d_array_of_values_is_one_value(tmp_path):
    """A 0-d array is one value, as the scalar it holds is (it failed with
    "len() of unsized object")."""
    frame = optical.sweep(WL, {"adc.bits": np.array(6)}, seeds=1, out=tmp_path / "s",
                          base=BASE, executor="serial", progress=False)
    assert frame["adc.bits"].tolist() == [6]

def test_older_runs_seed_metric_does_not_replace_the_seed_column(tmp_path):
    """Layer sweeps of earlier versions recorded the report's seed as a metric."""
    out = sweep_dir(tmp_path)
    for run in (out / "runs").glob("*.json"):
        record = json.loads(run.read_text())
        record["metrics"]["seed"] = 99
        run.write_text(json.dumps(record))
    frame = load(out)
    assert frame["seed"].tolist() == [0, 1] * 4 and "seed" not in frame.attrs["sweep"]["metrics"]


def test_sigterm_becomes_terminated_inside_the_context_only():
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated) as info, sigterm_as_exit():
        signal.raise_signal(signal.SIGTERM)  # in this (the main) thread
    assert info.value.code == 128 + signal.SIGTERM and isinstance(info.value, SystemExit)
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_the_caller_ignores_stays_ignored(signum):
    """A background job of a shell script (SIGINT ignored), or a SIGTERM a
    caller ignores: the
    sweep must not take back a signal its caller chose to ignore, as Python
    does not (it stopped such a sweep, exit 130)."""
    previous = signal.signal(signum, signal.SIG_IGN)
    try:
        with sigterm_as_exit():
            assert signal.getsignal(signum) == signal.SIG_IGN
            signal.raise_signal(signum)  # ignored: nothing raised, nothing recorded
        assert signal.getsignal(signum) == signal.SIG_IGN
    finally:
        signal.signal(signum, previous)


@dataclasses.dataclass(frozen=True)
class SignalledRun:
    """Like WL, but its second run receives a stop signal inside a library
    that swallows it, and then, per ``after``: goes on (``"run"``, as a
    garbage-collection callback does: Python ignores exceptions raised
    there), fails (``"fail"``, as jaxlib raises ImportError when the signal
    lands while it imports), or hands back what it has (``"bad metrics"``: a
    string the table cannot hold). With ``signum=None`` no signal is raised:
    the second run just does what ``after`` says (outside
    :func:`sigterm_as_exit`, a raised SIGINT whose handler happens to run
    inside a garbage-collection callback would be lost, and the run go on)."""

    inner: optical.MatmulWorkload
    signum: int | None = signal.SIGINT
    after: str = "run"
    calls: list = dataclasses.field(default_factory=list, compare=False)

    label = "signalled run"

    def run(self, config, seed):
        self.calls.append(seed)
        if len(self.calls) == 2:
            try:
                if self.signum is None:
                    raise KeyboardInterrupt  # stands for the swallowed signal's exception
                signal.raise_signal(self.signum)
            except (KeyboardInterrupt, SystemExit):
                if self.after == "fail":
                    raise ImportError("Encountered an error while initializing the "
                                      "extension.") from None
                if self.after == "bad metrics":
                    return {"sqnr_db": "interrupted"}
        return self.inner.run(config, seed)

    def to_dict(self):
        return self.inner.to_dict()


def test_a_swallowed_ctrl_c_still_stops_the_sweep_after_the_run(tmp_path):
    out = tmp_path / "s"
    workload = SignalledRun(WL)
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), sigterm_as_exit():
        optical.sweep(workload, PARAMS, seeds=2, out=out, base=BASE, executor="serial",
                      progress=False)
    assert len(workload.calls) == 2 and len(load(out)) == 2  # the run it hit is kept
    assert signal.getsignal(signal.SIGINT) is previous
    # the record is gone with the context: a later sweep runs to its end
    assert len(optical.sweep(WL, PARAMS, seeds=2, out=out, base=BASE, executor="serial",
                             progress=False)) == 8


def test_a_swallowed_ctrl_c_stops_a_sweep_called_from_python_too(tmp_path):
    """From Python (a notebook: no sigterm_as_exit), Ctrl-C swallowed by a
    garbage-collection callback (JAX's) was lost: the sweep ran to its end
    (1 to 3 of 20 interrupts in a notebook). Where SIGINT has Python's own
    handler, the sweep records it, stops after the run it hit and says what
    is kept; a caller's own handler is left alone (its choice)."""
    out = tmp_path / "s"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    workload = SignalledRun(WL)
    with pytest.raises(KeyboardInterrupt, match=rf"^sweep interrupted: the 2 runs finished so "
                                                rf"far are kept in {re.escape(str(out))}; run "
                                                r"the sweep again to resume$"):
        optical.sweep(workload, PARAMS, seeds=2, out=out, base=BASE, executor="serial",
                      progress=False)
    assert len(workload.calls) == 2 and len(load(out)) == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        own = SignalledRun(WL)
        assert len(optical.sweep(own, PARAMS, seeds=2, out=tmp_path / "own", base=BASE,
                                 executor="serial", progress=False)) == 8
        assert seen == [signal.SIGINT] and len(own.calls) == 8
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_recorded_by_the_main_thread_s_sweep_leaves_a_thread_s_sweep_running(
        tmp_path):
    """The record of a swallowed Ctrl-C is the main thread's sweep's: a sweep
    in a background thread (which Python never signals) stopped on it too,
    after its next result (the review)."""
    recorded, checked = threading.Event(), threading.Event()

    @dataclasses.dataclass(frozen=True)
    class Background:
        calls: list = dataclasses.field(default_factory=list, compare=False)

        def run(self, config, seed):
            self.calls.append(seed)
            if len(self.calls) == 1:
                recorded.wait(30)  # returns once the main sweep has recorded its Ctrl-C
            else:
                checked.set()  # the first result was taken after the record
            return WL.run(config, seed)

        def to_dict(self):
            return WL.to_dict()

    @dataclasses.dataclass(frozen=True)
    class Main:
        calls: list = dataclasses.field(default_factory=list, compare=False)

        def run(self, config, seed):
            self.calls.append(seed)
            if len(self.calls) == 2:
                with contextlib.suppress(KeyboardInterrupt):
                    signal.raise_signal(signal.SIGINT)  # swallowed, recorded
                recorded.set()
                checked.wait(30)
            return WL.run(config, seed)

        def to_dict(self):
            return WL.to_dict()

    background, errors = Background(), []

    def other():
        try:
            optical.sweep(background, PARAMS, seeds=1, out=tmp_path / "bg", base=BASE,
                          executor="serial", progress=False)
        except BaseException as err:  # noqa: BLE001  (reported below)
            errors.append(err)

    thread = threading.Thread(target=other)
    thread.start()
    with pytest.raises(KeyboardInterrupt, match="sweep interrupted"):
        optical.sweep(Main(), PARAMS, seeds=1, out=tmp_path / "main", base=BASE,
                      executor="serial", progress=False)
    thread.join(60)
    assert not errors and len(background.calls) == 4 and len(load(tmp_path / "bg")) == 4


def test_a_ctrl_c_that_makes_a_run_fail_stops_the_sweep_as_an_interruption(tmp_path):
    """The user pressed Ctrl-C: the sweep is interrupted (resume it), not a
    run failure with the library's error. (It was reported as "run failed
    ... ImportError", exit 1.)"""
    out = tmp_path / "s"
    workload = SignalledRun(WL, after="fail")
    with pytest.raises(KeyboardInterrupt), sigterm_as_exit():
        optical.sweep(workload, PARAMS, seeds=2, out=out, base=BASE, executor="serial",
                      progress=False)
    assert len(workload.calls) == 2 and len(load(out)) == 1  # the first run is kept
    # Without a signal the same failure is a failure, its message not doubly stopped.
    with pytest.raises(SweepError, match=r"ImportError: Encountered an error while "
                                         r"initializing the extension\. The 0 runs"):
        optical.sweep(SignalledRun(WL, None, after="fail", calls=[0]), PARAMS, seeds=2,
                      out=tmp_path / "t", base=BASE, executor="serial", progress=False)


@pytest.mark.parametrize(("signum", "stop"), [(signal.SIGINT, KeyboardInterrupt),
                                              (signal.SIGTERM, Terminated)])
def test_a_stop_signal_that_spoils_a_runs_metrics_stops_the_sweep_as_an_interruption(
        tmp_path, signum, stop):
    """A signal that arrived inside the run wins over what the run returned:
    the sweep stops as interrupted (resume it), not with a SweepError about
    the metrics. Without a signal the same metrics are refused."""
    workload = SignalledRun(WL, signum, after="bad metrics")
    with pytest.raises(stop), sigterm_as_exit():
        optical.sweep(workload, PARAMS, seeds=2, out=tmp_path / "s", base=BASE,
                      executor="serial", progress=False)
    assert len(workload.calls) == 2 and len(load(tmp_path / "s")) == 1  # the first run is kept

    @dataclasses.dataclass(frozen=True)
    class Bad:
        def run(self, config, seed):
            return {"sqnr_db": "interrupted"}

        def to_dict(self):
            return WL.to_dict()

    with pytest.raises(SweepError, match="not a number"):
        optical.sweep(Bad(), PARAMS, seeds=2, out=tmp_path / "t", base=BASE,
                      executor="serial", progress=False)


def test_a_swallowed_stop_signal_prints_no_traceback(monkeypatch):
    """Python hands what a garbage-collection callback or a __del__ raises to
    sys.unraisablehook, which prints a traceback, and goes on; for the stop
    signal's own exception that traceback follows the sweep saying it stops.
    Inside the context it is dropped once a signal is recorded; anything
    else still reaches the hook, which is restored on the way out."""
    class Raises:
        def __init__(self, exc):
            self.exc = exc

        def __del__(self):
            raise self.exc

    seen = []

    def hook(unraisable):
        seen.append(type(unraisable.exc_value).__name__)

    monkeypatch.setattr(sys, "unraisablehook", hook)
    with sigterm_as_exit():
        Raises(KeyboardInterrupt())  # no signal recorded: the hook sees it
        assert seen == ["KeyboardInterrupt"]
        _signals._RECEIVED.append(signal.SIGTERM)
        Raises(Terminated(143))
        Raises(KeyboardInterrupt())
        assert seen == ["KeyboardInterrupt"]
        Raises(RuntimeError("unrelated"))
        assert seen == ["KeyboardInterrupt", "RuntimeError"]
    assert sys.unraisablehook is hook


def test_a_nested_sigterm_as_exit_keeps_what_the_outer_one_received():
    """A review: sigterm_as_exit cleared the record of received signals on
    entry and exit, so one nested in another (a caller's around the CLI's,
    say) made the outer forget a signal whose exception was swallowed, and
    its sweep ran on. The record is now cleared by the outermost alone."""
    with sigterm_as_exit():
        with pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)  # recorded, and raised here
        with sigterm_as_exit():
            pass
        with pytest.raises(Terminated):  # as if the exception had been swallowed
            _signals._raise_received()
    _signals._raise_received()  # the outermost's exit clears the record


def test_vmap_executor_says_when_it_vmapped_nothing(tmp_path):
    summary = execute(SweepDefinition.build(WL, {"adc.bits": [4]}, seeds=2, base=BASE),
                      tmp_path / "s", executor="vmap", progress=False)
    assert summary.executor == "this process, one run at a time (nothing to vmap)"


def test_a_reused_vmap_executor_describes_each_sweep_alone(tmp_path):
    pytest.importorskip("jax")
    from optical._executors import VmapExecutor

    runner = VmapExecutor()
    jax_wl = optical.MatmulWorkload(tokens=8, k=32, n=16, backend="jax")
    first = execute(SweepDefinition.build(jax_wl, {"source.photons_per_mac": [1e4, 1e5]},
                                          seeds=1, base=BASE),
                    tmp_path / "a", executor=runner, progress=False)
    assert first.executor.startswith("this process, vmapped batches")
    second = execute(SweepDefinition.build(WL, {"adc.bits": [4]}, seeds=2, base=BASE),
                     tmp_path / "b", executor=runner, progress=False)
    assert second.executor == "this process, one run at a time (nothing to vmap)"
    # Each run file says how many runs one vmap computed it with (None: alone):
    # BASE calibrates its windows, so only seeds share a batch, and each
    # photon count went alone through one.
    assert _vmap_batches(tmp_path / "a") == [1, 1]
    assert _vmap_batches(tmp_path / "b") == [None, None]


def _vmap_batches(out: pathlib.Path) -> list[int | None]:
    """Each run file's ``vmap_batch``."""
    return [json.loads(f.read_text())["vmap_batch"] for f in (out / "runs").glob("*.json")]


def test_a_custom_executors_vmap_batch_is_recorded_only_as_a_plain_int(tmp_path):
    """A custom executor's outcome may leave ``vmap_batch`` out or give
    something else than a count: its run files say null, never that value."""
    from optical._executors import SerialExecutor

    class Relabelled(SerialExecutor):
        def __init__(self, value):
            self.value = value

        def run(self, tasks):
            for task, outcome in super().run(tasks):
                outcome = {k: v for k, v in outcome.items() if k != "vmap_batch"}
                yield task, outcome if self.value is None else {**outcome,
                                                                "vmap_batch": self.value}

    for name, value in (("absent", None), ("text", "2"), ("numpy", np.int64(2)),
                        ("flag", True), ("count", 2)):
        optical.sweep(WL, {"adc.bits": [6]}, seeds=2, out=tmp_path / name, base=BASE,
                      executor=Relabelled(value), progress=False)
        assert _vmap_batches(tmp_path / name) == [2 if name == "count" else None] * 2, name


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_the_main_guard_is_told_so(tmp_path, guarded):
    """Spawned workers re-import the script: without `if __name__ ==
    "__main__":` each would start the sweep again. The worker's error and the
    sweep's both name the guard; with it, the same script runs."""
    import subprocess
    import sys
    import textwrap

    body = textwrap.dedent("""\
        frame = optical.sweep(optical.MatmulWorkload(4, 8, 4), {"adc.bits": [4, 8]}, seeds=1,
                              out="runs", executor=2, progress=False)
        print(len(frame))
        """)
    if guarded:
        body = 'if __name__ == "__main__":\n' + textwrap.indent(body, "    ")
    (tmp_path / "script.py").write_text("import optical\n\n" + body)
    done = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    if guarded:
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "2"
    else:
        assert done.returncode == 1
        assert "optical.sweep was called in a worker process as it started" in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("optical.sweep.SweepError: run failed") and \
            'must run under `if __name__ == "__main__":`' in last


class NeedsTwoArgs(Exception):
    """An exception pickle cannot rebuild (``__init__`` takes two arguments,
    ``args`` holds one), as subprocess.CalledProcessError-like classes are."""

    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def raise_needs_two_args():
    raise NeedsTwoArgs("x", "y")


def exit_with_3():
    sys.exit(3)


@dataclasses.dataclass(frozen=True)
class FailsAtEightBits:
    """Like WL, but its runs at adc.bits = 8 call ``fail`` (module-level, so
    that worker processes can unpickle it)."""

    inner: optical.MatmulWorkload
    fail: object

    label = "fails at 8 bits"

    def run(self, config, seed):
        if config.adc.bits == 8:
            self.fail()
        return self.inner.run(config, seed)

    def to_dict(self):
        return self.inner.to_dict()


@pytest.mark.parametrize("executor", ["serial", pytest.param(2, marks=pytest.mark.slow), "dask"])
def test_a_run_that_calls_sys_exit_is_that_runs_failure_on_every_executor(tmp_path, executor):
    """sys.exit in a run ended a serial sweep (exit code 3), failed the run in
    worker processes, and killed a Dask threads cluster's worker thread, the
    sweep then waiting for good. Every executor now reports the run's failure
    and keeps the other runs."""
    out = tmp_path / "s"
    workload = FailsAtEightBits(WL, exit_with_3)
    match = r"point adc.bits=8, .*FailsAtEightBits.run called sys.exit\(3\)"
    if executor != "dask":
        with pytest.raises(SweepError, match=match):
            optical.sweep(workload, {"adc.bits": [4, 8]}, seeds=1, out=out, base=BASE,
                          executor=executor, progress=False)
    else:
        distributed = pytest.importorskip("distributed")
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                      dashboard_address="127.0.0.1:0") as cluster, \
                distributed.Client(cluster) as client:
            failed: list[BaseException] = []

            def sweep():
                try:
                    optical.sweep(workload, {"adc.bits": [4, 8]}, seeds=1, out=out,
                                  base=BASE, executor=client, progress=False)
                except BaseException as err:  # noqa: BLE001 - examined below
                    failed.append(err)

            thread = threading.Thread(target=sweep, daemon=True)
            thread.start()
            thread.join(60)
            assert not thread.is_alive(), "the sweep hung"
        assert len(failed) == 1 and isinstance(failed[0], SweepError)
        assert re.search(match, str(failed[0]))
    if executor != 2:  # (two workers: the 4-bit run may still be in flight, and is stopped)
        assert len(list((out / "runs").glob("*.json"))) == 1  # the 4-bit run is kept


@pytest.mark.slow
def test_a_worker_exception_that_cannot_be_unpickled_names_its_run_and_cause(tmp_path):
    """It was reported as a dead worker ('BrokenProcessPool'), on another run,
    its cause dropped; it now names the failing run and the exception."""
    with pytest.raises(SweepError, match=r"point adc.bits=8, .*NeedsTwoArgs: x/y"):
        optical.sweep(FailsAtEightBits(WL, raise_needs_two_args), {"adc.bits": [4, 8]},
                      seeds=1, out=tmp_path / "s", base=BASE, executor=2, progress=False)


def test_worker_processes_in_a_deleted_directory_are_refused_naming_it(tmp_path, monkeypatch):
    """A shell left in a directory that was then deleted: spawn gives the
    workers the current directory, and a sweep failed with a bare "[Errno
    2] No such file or directory" (an environment audit). The error says
    which directory and what to do; nothing is started."""
    from optical import _executors

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    executor = _executors.ProcessExecutor(2)
    with pytest.raises(FileNotFoundError, match=r"the current directory was deleted, and worker "
                                                r"processes start in it\); cd to a directory "
                                                r"that exists: '.'$"):
        list(executor.run([_executors.Task(f"r{i}", 0, i, WL, BASE) for i in range(2)]))
    assert executor.workers == 0 and executor._pool is None


@pytest.mark.slow
@pytest.mark.parametrize("victim", [0, 1])
def test_closing_the_pool_does_not_hang_when_a_worker_dies_meanwhile(victim):
    """A worker killed while the pool shuts down can leave the other blocked
    on the call queue's lock for good, and shutdown(wait=True) with it (a
    sweep then never wrote its table and ignored SIGTERM). Both idle workers
    are stopped so that neither takes its sentinel, close() starts, one is
    killed and the other continued: close() returns, no worker is left."""
    import os
    import threading
    import time

    from optical import _executors

    executor = _executors.ProcessExecutor(2)
    tasks = [_executors.Task(f"r{i}", 0, i, WL, BASE) for i in range(2)]
    assert len(list(executor.run(tasks))) == 2
    processes = list(executor._pool._processes.values())
    for process in processes:
        os.kill(process.pid, signal.SIGSTOP)
    closer = threading.Thread(target=executor.close, daemon=True)
    closer.start()
    time.sleep(1.0)  # the sentinels are queued
    os.kill(processes[victim].pid, signal.SIGKILL)
    for process in processes:
        try:
            os.kill(process.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    closer.join(3 * _executors._CLOSE_WAIT_S)
    alive = closer.is_alive()
    for process in processes:  # (never leave a stuck child behind, whatever happened)
        if process.is_alive():
            process.kill()
    assert not alive
    assert not any(process.is_alive() for process in processes)


def test_a_workload_dask_cannot_send_is_a_sweep_error(tmp_path):
    """It escaped the Dask executor as a raw TypeError from the submit loop."""
    import threading

    distributed = pytest.importorskip("distributed")

    @dataclasses.dataclass(frozen=True)
    class HoldsALock:
        inner: optical.MatmulWorkload
        lock: object = dataclasses.field(default_factory=threading.Lock, compare=False)

        def run(self, config, seed):
            return self.inner.run(config, seed)

        def to_dict(self):
            return self.inner.to_dict()

    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster) as client:
        with pytest.raises(SweepError, match=r"run failed at point adc.bits=4, seed 0: "):
            optical.sweep(HoldsALock(WL), {"adc.bits": [4, 8]}, seeds=1, out=tmp_path / "s",
                          base=BASE, executor=client, progress=False)


def test_a_dask_future_without_a_result_is_the_runs_failure():
    """A scheduler lost mid-sweep cancels the futures; their result() raised
    out of the executor as a raw traceback. It is now the run's outcome."""
    from optical import _executors

    class Cancelled:
        key, status = "k", "cancelled"

        def result(self):
            raise RuntimeError("scheduler-connection-lost")  # as FutureCancelledError says

        def release(self):
            pass

    class Client:
        def submit(self, fn, task, key, retries):
            future = Cancelled()
            future.key = key
            return future

        def cancel(self, futures):
            pass

    distributed = pytest.importorskip("distributed")
    task = _executors.Task("r0", 0, 0, WL, BASE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed, "as_completed", lambda futures: iter(futures))
        ((got, outcome),) = list(_executors.DaskExecutor(Client()).run([task]))
    assert got is task and isinstance(outcome, RuntimeError)
    assert "scheduler-connection-lost" in str(outcome) and "scheduler still running" in str(outcome)


def test_a_dask_worker_of_an_optical_that_sends_no_versions_is_an_older_one(tmp_path):
    """Outcomes carry the worker's versions since results were versioned: a
    Dask worker running an optical from before sends none, and passed for
    this one's (the review reproduced it with a real LocalCluster)."""
    from optical import _executors

    class Done:
        status = "finished"

        def __init__(self, task):
            self.task = task

        def result(self):
            outcome = _executors.evaluate(self.task)
            del outcome["results_version"], outcome["optical_version"]  # as before
            return outcome

        def release(self):
            pass

    class Client:
        def submit(self, fn, task, key, retries):
            future = Done(task)
            future.key = key
            return future

        def cancel(self, futures):
            pass

        def scheduler_info(self):
            return {"workers": {}}

        scheduler = type("Scheduler", (), {"address": "tcp://fake:8786"})()

    distributed = pytest.importorskip("distributed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(distributed, "as_completed", lambda futures: iter(futures))
        with pytest.raises(SweepError, match=r"computed by optical 'unknown \(before 2026-12-06\)' "
                                             r"\(results version 1\)"):
            optical.sweep(WL, {"adc.bits": [4]}, seeds=1, out=tmp_path / "s", base=BASE,
                          executor=_executors.DaskExecutor(Client()), progress=False)


@dataclasses.dataclass(frozen=True)
class Batchable:
    """A workload whose runs all batch together; each metric names its run."""

    label = "batchable"

    def batch_key(self, config):
        return "all"

    def run(self, config, seed):
        return self.run_batch([config], [seed])[0]

    def run_batch(self, configs, seeds):
        return [{"bits": float(c.adc.bits), "seed_metric": float(s)}
                for c, s in zip(configs, seeds, strict=True)]

    def to_dict(self):
        return {"kind": "batchable"}


def test_vmap_batches_of_any_size_run_every_task_once():
    """Five batchable tasks in batches of 2 (2 + 2 + 1): every task comes back
    once, with its own result; none is dropped at a batch's edge."""
    from optical._executors import Task, VmapExecutor

    configs = [BASE.replace({"adc.bits": b}) for b in (3, 4, 5, 6, 7)]
    tasks = [Task(f"r{i}", i, 10 + i, Batchable(), c) for i, c in enumerate(configs)]
    for size in (1, 2, 4, 5, 64):
        runner = VmapExecutor(batch_size=size)
        out = list(runner.run(tasks))
        assert [t.run_id for t, _ in out] == [t.run_id for t in tasks], size
        assert [(o["metrics"]["bits"], o["metrics"]["seed_metric"]) for _, o in out] == \
            [(float(b), float(10 + i)) for i, b in enumerate((3, 4, 5, 6, 7))]
        assert (runner.batched, runner.single) == (5, 0)


@dataclasses.dataclass(frozen=True)
class Tagged(Batchable):
    """Batchable workloads that differ (by tag) but share a batch key."""

    tag: int = 0

    def run_batch(self, configs, seeds):
        return [{"tag": float(self.tag)} for _ in configs]

    def to_dict(self):
        return {"kind": "tagged", "tag": self.tag}


def test_vmap_batches_only_runs_of_one_workload():
    """One batch runs one workload's data: tasks of two workloads with the
    same batch key (a swept data_seed or workload.tokens) are batched apart,
    each run getting its own workload's result, as a serial run gives it."""
    from optical._executors import SerialExecutor, Task, VmapExecutor

    tasks = [Task(f"r{i}", i, 0, Tagged(tag=i % 2), BASE) for i in range(4)]
    for runner in (VmapExecutor(), SerialExecutor()):
        out = {t.run_id: o["metrics"]["tag"] for t, o in runner.run(tasks)}
        assert out == {"r0": 0.0, "r1": 1.0, "r2": 0.0, "r3": 1.0}, type(runner).__name__


@dataclasses.dataclass(frozen=True)
class ShortBatch(Batchable):
    """A run_batch that returns one result too few, or one dict, or lists in
    place of dicts, or (valid) an iterator of the right length."""

    give: str = "short"

    def run_batch(self, configs, seeds):
        results = super().run_batch(configs, seeds)
        return {"short": results[:-1], "dict": results[0], "iterator": iter(results),
                "lists": [[r] for r in results]}[self.give]

    def to_dict(self):
        return {"kind": "short-batch", "give": self.give}


@pytest.mark.parametrize(("give", "got"), [("short", "3 results for 4 runs"),
                                           ("dict", "a dict for 4 runs"),
                                           ("lists", r"a list among its results \(4 of 4 not dicts\)")])
def test_a_run_batch_returning_the_wrong_number_of_results_is_named(tmp_path, give, got):
    """A coverage audit: a custom run_batch returning one result too few
    escaped the sweep as zip()'s bare "argument 2 is shorter than argument
    1"; it is a failed run naming the workload's run_batch and what it
    returns, with the finished runs kept. A list of lists was reported as
    "ShortBatch.run returned list" (naming run, not run_batch)."""
    out = tmp_path / "s"
    with pytest.raises(SweepError, match=rf"ShortBatch\.run_batch returned {got}: "
                                         r"it returns a list of metrics dicts, one per config "
                                         r"and seed.*runs finished so far are kept"):
        optical.sweep(ShortBatch(give=give), {"adc.bits": [4, 6]}, seeds=2, out=out, base=BASE,
                      executor="vmap", progress=False)
    frame = optical.sweep(ShortBatch(give="iterator"), {"adc.bits": [4, 6]}, seeds=2,
                          out=tmp_path / "it", base=BASE, executor="vmap", progress=False)
    assert sorted(zip(frame["bits"], frame["seed_metric"], strict=True)) == [(4, 0), (4, 1), (6, 0), (6, 1)]


@dataclasses.dataclass(frozen=True)
class NumpyBatchable(Batchable):
    """A batching workload described with a numpy integer, as the store allows."""

    def to_dict(self):
        return {"kind": "numpy-batchable", "tokens": np.int64(8)}


def test_vmap_groups_a_workload_described_with_numpy_scalars(tmp_path):
    """The review of the day's diff: the vmap executor grouped tasks by
    json.dumps of the workload's to_dict without the store's encoding, so a
    numpy integer in it (which the manifest and run ids take) failed with a
    bare "Object of type int64 is not JSON serializable" after the manifest
    was written."""
    frame = optical.sweep(NumpyBatchable(), {"adc.bits": [4, 6]}, seeds=2, out=tmp_path / "s",
                          base=BASE, executor="vmap", progress=False)
    assert sorted(zip(frame["bits"], frame["seed_metric"], strict=True)) == \
        [(4, 0), (4, 1), (6, 0), (6, 1)]


def test_an_executor_that_drops_runs_fails_the_sweep_and_keeps_the_rest(tmp_path):
    """A custom executor that returns fewer outcomes than it was given runs
    must not leave a sweep that looks finished: the sweep fails naming how
    many were lost, keeps the finished ones, and a rerun completes it."""
    from optical._executors import Executor, SerialExecutor

    class Lossy(Executor):
        def run(self, tasks):
            yield from SerialExecutor().run(list(tasks)[:-1])

        def describe(self):
            return "lossy"

    definition = SweepDefinition.build(WL, {"adc.bits": [4, 8]}, seeds=2, base=BASE)
    with pytest.raises(SweepError, match=r"the executor \(lossy\) returned no outcome for 1 of "
                                         r"the 4 runs it was given\. The 3 runs finished so far "
                                         r"are kept"):
        execute(definition, tmp_path / "s", executor=Lossy(), progress=False)
    assert len(load(tmp_path / "s")) == 3
    summary = execute(definition, tmp_path / "s", executor="serial", progress=False)
    assert (summary.already_done, summary.ran) == (3, 1)

    class Twice(Executor):  # every outcome yielded twice: written and counted once
        def run(self, tasks):
            for pair in SerialExecutor().run(list(tasks)):
                yield pair
                yield pair

        def describe(self):
            return "twice"

    summary = execute(definition, tmp_path / "t", executor=Twice(), progress=False)
    assert summary.ran == 4 and len(load(tmp_path / "t")) == 4

    # ... and counted once where the count is told: a run failing after the
    # first, twice-yielded, one leaves 1 finished run, not 2.
    failing = SweepDefinition.build(SignalledRun(WL, None, after="fail"), {"adc.bits": [4, 8]},
                                    seeds=2, base=BASE)
    with pytest.raises(SweepError, match=r"ImportError: .* The 1 runs? finished so far"):
        execute(failing, tmp_path / "u", executor=Twice(), progress=False)
    assert len(load(tmp_path / "u")) == 1

    class Foreign(Executor):  # an outcome for a run it was not given
        def run(self, tasks):
            task, outcome = next(iter(SerialExecutor().run(list(tasks)[:1])))
            yield dataclasses.replace(task, run_id="not-a-run"), outcome

        def describe(self):
            return "foreign"

    with pytest.raises(SweepError, match=r"the executor \(foreign\) returned an outcome for "
                                         r"run not-a-run, which it was not given\. The 0 runs"):
        execute(definition, tmp_path / "f", executor=Foreign(), progress=False)
    assert not list((tmp_path / "f" / "runs").glob("not-a-run*"))

    # An executor yielding what the run returned (the metrics), not what
    # evaluate() returns, was told the workload "returned NoneType, not a dict
    # of metrics" (an extension audit); evaluate is exported beside Executor.
    from optical.sweep import evaluate

    class Bare(Executor):
        def run(self, tasks):
            for task in tasks:
                yield task, task.workload.run(task.config, task.seed)

        def describe(self):
            return "bare"

    with pytest.raises(SweepError, match=r"the executor \(bare\) gave run \w+ dict .*not an "
                                         r"outcome: an executor yields \(task, evaluate\(task\)\)"):
        execute(definition, tmp_path / "b", executor=Bare(), progress=False)

    class HalfBuilt(Bare):  # {"metrics": ...} alone: named too, not KeyError('elapsed_s')
        def run(self, tasks):
            for task in tasks:
                yield task, {"metrics": task.workload.run(task.config, task.seed)}

    with pytest.raises(SweepError, match=r"not an outcome: an executor yields"):
        execute(definition, tmp_path / "h", executor=HalfBuilt(), progress=False)

    class Evaluating(Executor):
        def run(self, tasks):
            for task in tasks:
                yield task, evaluate(task)

        def describe(self):
            return "evaluating"

    assert execute(definition, tmp_path / "e", executor=Evaluating(), progress=False).ran == 4


def test_the_executor_argument_maps_as_documented():
    """None or "processes": a pool on every core; 1: this process (no pool);
    n > 1: a pool of n; "serial", "vmap"; an Executor is used as given and
    not closed by the sweep."""
    from optical._executors import (
        ProcessExecutor,
        SerialExecutor,
        VmapExecutor,
        _available_cores,
        make_executor,
    )

    for arg in (None, "processes"):
        runner, owned = make_executor(arg)
        assert type(runner) is ProcessExecutor and runner.jobs == _available_cores() and owned
    runner, owned = make_executor(1)
    assert type(runner) is SerialExecutor and owned
    runner, owned = make_executor(3)
    assert type(runner) is ProcessExecutor and runner.jobs == 3 and owned
    assert type(make_executor("serial")[0]) is SerialExecutor
    assert type(make_executor("vmap")[0]) is VmapExecutor
    mine = VmapExecutor(batch_size=2)
    assert make_executor(mine) == (mine, False)
    for bad in (True, 2.0, "threads"):
        with pytest.raises(TypeError, match="executor: .* is not valid"):
            make_executor(bad)


def test_a_finished_sweep_keeps_none_of_its_runs_data(tmp_path):
    """The workloads' caches (a matmul's operands and truth; a layer's model
    and its last layer, 0.9 GB for Llama-3.1-8B) outlived the sweep that
    filled them, for the life of the process."""
    import gc
    import tracemalloc

    small = optical.MatmulWorkload(tokens=8, k=16, n=8, dtype="float64")
    optical.sweep(small, {"adc.bits": [6]}, seeds=1, out=tmp_path / "warm", executor=1,
                  progress=False)  # imports and first-use state, outside the measurement
    wl = optical.MatmulWorkload(tokens=64, k=256, n=256, dtype="float64")
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        frame = optical.sweep(wl, {"adc.bits": [6]}, seeds=1, out=tmp_path / "s", executor=1,
                              progress=False)
        del frame
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    data = (64 * 256 + 256 * 256 + 64 * 256) * 8  # x, w and the float64 truth
    assert after - before < data / 4, f"{(after - before) / 2**20:.2f} MiB kept"


def test_a_run_records_the_library_versions_it_ran_on(tmp_path):
    """The numba backend's float32 GEMMs run in XLA where JAX is installed,
    else in BLAS, which round differently (0.017 dB on a Llama-3.2-1B layer's
    SQNR, same seed, same run id): a run file names the numpy, numba and JAX
    it ran with, so runs from two environments can be told apart."""
    import json

    import numba

    optical.sweep(WL, {"adc.bits": [8]}, seeds=1, out=tmp_path / "s", base=BASE,
                  executor="serial", progress=False)
    (run,) = (tmp_path / "s" / "runs").glob("*.json")
    env = json.loads(run.read_text())["environment"]
    try:
        import jax
    except ImportError:
        jax = None
    assert env == {"numpy": np.__version__, "numba": numba.__version__,
                   "jax": None if jax is None else jax.__version__,
                   "jaxlib": None if jax is None else env["jaxlib"],
                   "jax_cpu": None if jax is None else True,
                   # the device a JAX run computes on: this CPU (a GPU's kind where one is)
                   "jax_device": None if jax is None else (
                       "cpu" if jax.default_backend() == "cpu" else env["jax_device"]),
                   "python": platform.python_version(), "machine": platform.machine(),
                   "optical_commit": optical._version.source_commit(),
                   "cpu": env["cpu"], "blas": env["blas"]}
    # The CPU and numpy's BLAS kernel, which move a run's last bits too (left
    # unrecorded by seven stops): as the system and threadpoolctl name them.
    import threadpoolctl

    if os.path.exists("/proc/cpuinfo"):
        found = re.search(r"^model name\s*:\s*(.+?)\s*$",
                          pathlib.Path("/proc/cpuinfo").read_text(), re.M)
        assert env["cpu"] == (found.group(1) if found else platform.processor() or None)
    numpy_blas = [i for i in threadpoolctl.threadpool_info()
                  if i["user_api"] == "blas" and "numpy" in i["filepath"]]
    if numpy_blas:  # a wheel's bundled OpenBLAS: its version and the kernel it picked
        assert env["blas"].split() == [numpy_blas[0]["internal_api"], numpy_blas[0]["version"],
                                       *([numpy_blas[0]["architecture"]]
                                         if numpy_blas[0].get("architecture") else [])]


def test_a_run_records_when_it_finished_by_the_clock_of_its_worker(tmp_path):
    """An observability audit: run files said how long a run took, not when
    it finished. Each records finished_at, UTC to the second, taken by the
    process that ran it (two worker processes here), between the sweep's
    start and end; a custom executor's outcome without one gets the
    driver's clock."""
    import datetime
    import json

    from optical._executors import SerialExecutor

    def utc_now():
        return datetime.datetime.now(datetime.UTC).replace(microsecond=0)

    class Bare(SerialExecutor):  # outcomes without finished_at, as a custom one may give
        def run(self, tasks):
            for task, outcome in super().run(tasks):
                if isinstance(outcome, dict):
                    outcome = {k: v for k, v in outcome.items() if k != "finished_at"}
                yield task, outcome

    for name, executor in (("pool", 2), ("bare", Bare())):
        before = utc_now()
        optical.sweep(WL, {"adc.bits": [6, 8]}, seeds=1, out=tmp_path / name, base=BASE,
                      executor=executor, progress=False)
        after = utc_now()
        for run in (tmp_path / name / "runs").glob("*.json"):
            stamp = json.loads(run.read_text())["finished_at"]
            assert stamp.endswith("Z")
            finished = datetime.datetime.fromisoformat(stamp)
            assert before <= finished <= after, (name, stamp)


def test_the_results_frame_carries_each_runs_finish_time_and_commit(tmp_path):
    """A backlog item: run files recorded when a run finished and the commit
    of optical that ran it, the results frame (and results.parquet) neither.
    Both are columns now, read from each run's file; a run stored before
    they were recorded reads None."""
    out = tmp_path / "s"
    frame = optical.sweep(WL, {"adc.bits": [6, 8]}, seeds=2, out=out, base=BASE,
                          progress=False)
    records = {run.stem: json.loads(run.read_text()) for run in (out / "runs").glob("*.json")}
    assert len(records) == len(frame) == 4
    for _, row in frame.iterrows():
        record = records[row["run_id"]]
        assert row["finished_at"] == record["finished_at"] and row["finished_at"].endswith("Z")
        assert row["optical_commit"] == record["environment"]["optical_commit"]
        assert row["optical_commit"] == optical._version.source_commit()
    assert list(pd.read_parquet(out / "results.parquet")["finished_at"]) == \
        list(frame["finished_at"])

    old = out / "runs" / f"{frame['run_id'][0]}.json"  # as a run of an earlier version
    record = records[old.stem]
    del record["finished_at"], record["environment"]
    old.write_text(json.dumps(record))
    reread = load(out)
    assert reread["finished_at"][0] is None and reread["optical_commit"][0] is None
    assert list(reread["finished_at"][1:]) == list(frame["finished_at"][1:])


def test_the_caches_are_cleared_when_the_last_running_sweep_ends():
    """Sweeps in two threads of one process: the first to end leaves the
    caches the other still uses; the last clears them."""
    from optical import workloads
    from optical.sweep import _sweeping

    wl = optical.MatmulWorkload(tokens=4, k=8, n=4)
    with _sweeping():
        with _sweeping():
            wl.data()
        assert workloads._matmul_data.cache_info().currsize == 1
    assert workloads._matmul_data.cache_info().currsize == 0


def test_a_sweep_begun_by_another_results_version_is_not_finished_here(tmp_path):
    """A run id hashed the workload, config and seed, not the code: a sweep an
    older version began (a layer run of 4491fa0 and of today: output SQNR
    7.568 against 7.540 dB under one id) was finished by this version without
    a word, mixing runs computed two ways. Manifests and runs record the
    results version, run ids hash it, and a resume of another is refused;
    the runs it has still load."""
    from optical._version import RESULTS_VERSION

    out = sweep_dir(tmp_path, runs=3)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["results_version"] == RESULTS_VERSION
    for run in (out / "runs").glob("*.json"):
        assert json.loads(run.read_text())["results_version"] == RESULTS_VERSION
    definition = SweepDefinition.from_dict(manifest["definition"])
    config = definition.configs(definition.points())[0]
    assert manifest["run_ids"][0][0] == content_hash(
        {"workload": WL.to_dict(), "config": json.loads(config.to_json()), "seed": 0,
         "results_version": RESULTS_VERSION})
    for older in ({"results_version": 1}, {}):  # recorded, or from before it was
        manifest.pop("results_version")
        manifest.update(older)  # (not part of the definition's hash)
        (out / "manifest.json").write_text(json.dumps(manifest))
        message = (rf"begun by a version of optical whose runs give other numbers or "
                   rf"other metrics \(results version 1; this version's is "
                   rf"{RESULTS_VERSION}\)")
        with pytest.raises(ValueError, match=message):
            resume(out, executor="serial", progress=False)
        with pytest.raises(ValueError, match=message):  # the same command again
            optical.sweep(WL, PARAMS, seeds=2, out=out, base=BASE, executor="serial",
                          progress=False)
        frame = load(out)
        assert len(frame) == 3 and frame.attrs["sweep"]["results_version"] == 1
    assert len(list((out / "runs").glob("*.json"))) == 3  # nothing run, nothing lost


def test_a_manifest_of_the_first_sweep_layout_is_an_early_version_s_not_damaged(tmp_path):
    """The first sweeps wrote no run ids (the format string unchanged since):
    that is an older version's layout, not a damaged file, and the advice to
    delete the manifest and start again would orphan every finished run."""
    out = sweep_dir(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["run_ids"], manifest["results_version"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="a sweep manifest of an early version of optical, "
                                         "which did not record its runs' ids") as info:
        load(out)
    assert "damaged" not in str(info.value) and "delete" not in str(info.value)


@pytest.mark.parametrize("results", ["same", "other"])
def test_a_run_a_worker_of_another_optical_computed_is_named(tmp_path, results):
    """A Dask worker with another optical installed ran its runs with its own
    code, recorded under the driver's version (an audit's mixed cluster: 1 of
    6 rows silently differed). Outcomes carry the worker's versions: another
    results version fails the sweep naming it, another release with the same
    results is recorded as the worker's."""
    from optical._version import RESULTS_VERSION

    class OtherWorker(_executors.Executor):
        def run(self, tasks):
            for task in tasks:
                outcome = _executors.evaluate(task)
                assert outcome["optical_version"] == optical.__version__
                assert outcome["results_version"] == RESULTS_VERSION
                outcome["optical_version"] = "0.0.9"
                if results == "other":
                    outcome["results_version"] = RESULTS_VERSION + 1
                yield task, outcome

    out = tmp_path / "s"
    run = functools.partial(optical.sweep, WL, {"adc.bits": [4]}, seeds=1, out=out, base=BASE,
                            executor=OtherWorker(), progress=False)
    if results == "same":
        assert run()["optical_version"].tolist() == ["0.0.9"]
        return
    with pytest.raises(SweepError, match=rf"computed by optical '0.0.9' \(results version "
                                         rf"{RESULTS_VERSION + 1}\), whose numbers or "
                                         r"metrics differ"):
        run()
    assert not list((out / "runs").glob("*.json"))


@pytest.mark.parametrize("when", ["before", "finished"])
def test_a_closed_dask_client_fails_the_sweep_clearly(tmp_path, when):
    """The executor's description read the client's scheduler address, None
    once the client is closed: a sweep ended in AttributeError in place of
    the error naming the run (and a finished sweep, with nothing to run,
    failed); cancelling on the closed client raised too."""
    distributed = pytest.importorskip("distributed")
    out = tmp_path / "s"
    if when == "finished":
        optical.sweep(WL, {"adc.bits": [4]}, seeds=1, out=out, base=BASE, executor="serial",
                      progress=False)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster:
        client = distributed.Client(cluster)
        client.close()
        run = functools.partial(optical.sweep, WL, {"adc.bits": [4]}, seeds=1, out=out,
                                base=BASE, executor=client, progress=False)
        if when == "before":
            with pytest.raises(SweepError, match=r"run failed at point adc.bits=4, seed 0: "):
                run()
        else:
            assert len(run()) == 1


RANDOM_PARAMS = {"adc.bits": Range(3, 6), "adc.headroom": Range(1.0, 8.0),
                 "source.photons_per_mac": Range(1e2, 1e5, log=True),
                 "encoding.inputs": ["offset", "split"]}


def test_ranges_are_independent_and_log_ranges_uniform_in_log():
    """Each Range uniform on its scale, every parameter independent of the
    others (an audit's mutant drawing every parameter of a point from one
    generator state passed every other test): 2000 points, a fixed seed,
    each p-value above 1e-4 / 7 (false alarms at most 1e-4 in all)."""
    from scipy import stats

    points = SweepDefinition.build(WL, RANDOM_PARAMS, seeds=1, base=RMS_BASE, samples=2000,
                                   sample_seed=1).points()
    assert len(points) == 2000
    col = {p: np.array([pt[p] for pt in points]) for p in RANDOM_PARAMS}
    log_photons = np.log10(col["source.photons_per_mac"].astype(float))
    assert stats.kstest(log_photons, stats.uniform(2.0, 3.0).cdf).pvalue > 1e-4 / 7
    binned = {"bits": col["adc.bits"].astype(int) - 3,
              "headroom": np.digitize(col["adc.headroom"].astype(float), [2.75, 4.5, 6.25]),
              "photons": np.digitize(log_photons, [2.75, 3.5, 4.25]),
              "inputs": (col["encoding.inputs"] == "split").astype(int)}
    names = list(binned)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            table = np.zeros((binned[a].max() + 1, binned[b].max() + 1))
            np.add.at(table, (binned[a], binned[b]), 1)
            assert stats.chi2_contingency(table)[1] > 1e-4 / 7, (a, b)


def test_the_same_sample_seed_draws_the_same_points_in_another_process():
    """Points depend on sample_seed alone, not on the process's string hashing
    (a draw order by hash(path) passed the in-process order test)."""
    here = SweepDefinition.build(WL, RANDOM_PARAMS, seeds=1, base=RMS_BASE, samples=20,
                                 sample_seed=9).points()
    code = (
        "import json, optical; from optical.sweep import Range, SweepDefinition\n"
        "wl = optical.MatmulWorkload(tokens=16, k=64, n=32)\n"
        "base = optical.presets.get('iris-like').replace({'core.inputs': 32, "
        "'core.outputs': 16, 'adc.full_scale': 'rms'})\n"
        "p = {'adc.bits': Range(3, 6), 'adc.headroom': Range(1.0, 8.0), "
        "'source.photons_per_mac': Range(1e2, 1e5, log=True), "
        "'encoding.inputs': ['offset', 'split']}\n"
        "print(json.dumps(SweepDefinition.build(wl, p, seeds=1, base=base, samples=20, "
        "sample_seed=9).points()))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONHASHSEED": "12345"}, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-500:]
    assert json.loads(done.stdout) == here


@pytest.mark.parametrize("seed", range(6))
def test_a_range_past_what_the_base_config_allows_is_refused_whatever_the_seed(seed):
    """Photon counts past 1e30 and ADC bits at or below iris-like's ENOB loss
    are invalid: a Range reaching them was accepted or refused by where the
    sample_seed's draws landed. Its ends are checked against the base (unless
    another swept path of its section may make them valid)."""
    for path, values in (("source.photons_per_mac", Range(1e3, 1e31, log=True)),
                         ("adc.bits", Range(1, 8))):
        with pytest.raises(ValueError, match=rf"{path}: the Range \[.*\] reaches .*, which the "
                                             "base config does not allow"):
            SweepDefinition.build(WL, {path: values}, seeds=1, base=BASE, samples=3,
                                  sample_seed=seed)
    SweepDefinition.build(WL, {"adc.bits": Range(1, 8), "adc.enob_loss": [0.0]}, seeds=1,
                          base=BASE, samples=3, sample_seed=seed)
    if seed == 0:  # a stored sweep whose draws were all valid still reads back to resume
        SweepDefinition.build(WL, {"source.photons_per_mac": Range(1e3, 1e31, log=True)},
                              seeds=1, base=BASE, samples=3, sample_seed=seed,
                              check_points=False)


@dataclasses.dataclass(frozen=True)
class KLMatmul(optical.MatmulWorkload):
    """A researcher's subclass of a built-in workload that adds a metric."""

    def run(self, config, seed):
        return {**super().run(config, seed), "extra": 1.0}


def test_a_subclass_of_a_built_in_workload_needs_a_kind_of_its_own(tmp_path):
    """An extension audit's subclass inherited kind "matmul": its runs took
    MatmulWorkload's ids (a built-in sweep into its directory was "the same
    sweep"), and `optical sweep --out DIR` resumed it by running the
    built-in (its runs without the metric). A kind of its own gives its runs
    their own ids, and the resume from the directory alone points to Python."""
    from optical.cli import main

    with pytest.raises(TypeError, match=r"KLMatmul, a subclass of MatmulWorkload that changes "
                                        r"run, describes itself as the built-in 'matmul' "
                                        r"workload"):
        SweepDefinition.build(KLMatmul(tokens=4, k=8, n=4), {}, seeds=1)

    @dataclasses.dataclass(frozen=True)
    class Wider(optical.MatmulWorkload):  # a field added, run inherited (coverage audit)
        spread: float = 1.0

    with pytest.raises(TypeError, match=r"Wider, a subclass of MatmulWorkload that changes its "
                                        r"fields, describes itself as the built-in 'matmul'"):
        SweepDefinition.build(Wider(tokens=4, k=8, n=4), {}, seeds=1)

    @dataclasses.dataclass(frozen=True)
    class OwnKind(KLMatmul):
        kind = "kl-matmul"

    own = OwnKind(tokens=4, k=8, n=4)
    built_in = optical.MatmulWorkload(tokens=4, k=8, n=4)
    base = optical.presets.get("iris-like")
    assert (SweepDefinition.build(own, {}, seeds=1).run_id(base, 0)
            != SweepDefinition.build(built_in, {}, seeds=1).run_id(base, 0))
    out = tmp_path / "s"
    optical.sweep(own, {"adc.bits": [4, 6]}, seeds=1, out=out, executor="serial",
                  progress=False)
    next((out / "runs").glob("*.json")).unlink()
    with pytest.raises(ValueError, match=r"of kind 'kl-matmul', is not one its manifest can "
                                         r"rebuild.*resumes from Python with the workload object"):
        resume(out)
    assert main(["sweep", "--out", str(out), "--quiet"]) != 0
    summary = optical.resume_sweep(out, workload=own, executor="serial", progress=False)
    assert summary.ran == 1 and (load(out)["extra"] == 1.0).all()


def test_a_subclass_sweep_stored_before_the_kind_check_resumes_with_its_object(tmp_path,
                                                                                monkeypatch):
    """The diff review: a sweep a KLMatmul made before the check (kind
    "matmul") could not be resumed with its object, only from the directory
    alone, which runs the built-in. A subclass that changes defaults alone
    is the built-in's runs and passes."""
    out = tmp_path / "old"
    with monkeypatch.context() as m:  # as an earlier version wrote it
        m.setattr(_sweep_definition, "check_own_kind", lambda workload: None)
        optical.sweep(KLMatmul(tokens=4, k=8, n=4), {"adc.bits": [4, 6]}, seeds=1, out=out,
                      executor="serial", progress=False)
    next((out / "runs").glob("*.json")).unlink()
    summary = optical.resume_sweep(out, workload=KLMatmul(tokens=4, k=8, n=4),
                                   executor="serial", progress=False)
    assert summary.ran == 1 and (load(out)["extra"] == 1.0).all()

    @dataclasses.dataclass(frozen=True)
    class Wide(optical.MatmulWorkload):
        tokens: int = 8
        k: int = 16
        n: int = 8

    assert (SweepDefinition.build(Wide(), {}, seeds=1).run_id(BASE, 0)
            == SweepDefinition.build(optical.MatmulWorkload(8, 16, 8), {}, seeds=1)
            .run_id(BASE, 0))
