"""``optical sweep`` and ``optical plot``: end to end, resume, bad options,
SIGTERM mid-sweep."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import optical
from optical._sweep_store import content_hash
from optical._version import RESULTS_VERSION
from optical.cli import build_parser, main
from optical.sweep import load

pd = pytest.importorskip("pandas")
MODELS = Path(__file__).resolve().parent.parent / "models"

SWEEP = ["sweep", "--matmul", "16x64x32", "--param", "adc.bits=4,8",
         "--param", "source.photons_per_mac=1e4,1e6", "--seeds", "2",
         "--set", "core.inputs=32", "--jobs", "1", "--quiet"]


def test_sweep_then_resume_from_the_manifest_alone(tmp_path, capsys):
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out), "--json", str(tmp_path / "a.json")]) == 0
    first = json.loads((tmp_path / "a.json").read_text())
    assert (first["runs"], first["already_done"], first["ran"]) == (8, 0, 8)
    frame = load(out)
    # its wall time (an observability audit: the summary had none), at least
    # its serial runs' own
    assert first["elapsed_s"] >= frame["elapsed_s"].sum() > 0
    assert frame["adc.bits"].tolist() == [4, 4, 4, 4, 8, 8, 8, 8]
    cfg = optical.OpticalConfig.from_json(frame["config"].iloc[-1])
    assert cfg == optical.presets.get("iris-like").replace(
        {"core.inputs": 32, "adc.bits": 8, "source.photons_per_mac": 1e6})
    capsys.readouterr()
    assert main(["sweep", "--out", str(out), "--json", "-"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert (second["already_done"], second["ran"]) == (8, 0)
    # the whole command again is the same sweep: resumed too
    assert main([*SWEEP, "--out", str(out)]) == 0


def test_summary_table_and_progress(tmp_path, capsys):
    argv = [a for a in SWEEP if a != "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "s")]) == 0
    captured = capsys.readouterr()
    assert "8 runs (0 already done, 8 run now on this process)" in captured.out
    assert "sqnr_db mean" in captured.out and "8/8" in captured.err
    assert main([*argv, "--out", str(tmp_path / "s")]) == 0  # finished: resumes nothing
    captured = capsys.readouterr()
    assert "8 runs, all done already (nothing run now)" in captured.out
    assert "sqnr_db mean" in captured.out


def test_csv_results(tmp_path):
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out), "--format", "csv"]) == 0
    table = pd.read_csv(out / "results.csv")
    assert len(table) == 8 and {"adc.bits", "seed", "sqnr_db", "config"} <= set(table.columns)


@pytest.mark.parametrize(("extra", "message"), [
    (["--param", "adc.bitz=4,6"], "--param 'adc.bitz=4,6': unknown config path 'adc.bitz'"),
    (["--param", "adc.bits=4,six"], "--param 'adc.bits=4,six': adc.bits: cannot parse 'six'"),
    (["--param", "adc.bits=4,0"], "--param 'adc.bits=4,0': adc.bits: 0 is out of range"),
    (["--param", "adc.bits"], "--param 'adc.bits': expected PATH=VALUES"),
    (["--param", "adc.bits=4", "--param", "adc.bits=6"], "adc.bits is given twice"),
    (["--param", "source.photons_per_mac=1:10:cubic"], "must be LO:HI or LO:HI:log"),
    (["--param", "adc.bits=4", "--set", "adc.enob_loss=5"],
     "point adc.bits=4: adc.enob_loss: 5.0 leaves no effective bits"),
    # No point took the --set's value, yet the manifest's base recorded it.
    (["--param", "adc.bits=4,6", "--set", "adc.bits=5"],
     "--set 'adc.bits=5': --param sweeps adc.bits, so no point takes this value"),
    (["--matmul", "16x64"], "matmul shape '16x64': expected TxKxN"),
    (["--matmul", "4x32x0"], "matmul shape '4x32x0': T, K and N must be positive"),
    (["--model", "nowhere", "--param", "adc.bits=4"], "nowhere: no such model directory"),
    (["--matmul", "4x4x4", "--jobs", "0"], "--jobs: 0 must be a positive integer"),
    (["--param", "adc.bits=4"], "give a workload (--matmul TxKxN or --model DIR)"),
    (["--seeds", "0"], "--seeds: 0 must be a positive integer"),
    (["--samples", "2", "--sample-seed", "-1"], "--sample-seed: -1 must be a non-negative"),
    (["--sample-seed", "3"], "--sample-seed applies only with --samples"),
    (["--data-seed", "-2"], "--data-seed: -2 must be a non-negative integer"),
    (["--data-seed", str(2**64)], f"--data-seed: {2**64} is out of range; valid: [0, 2**64)"),
    (["--outlier-scale", "inf"], "--outlier-scale: inf must be a positive finite number"),
    (["--layer", "1", "--tokens", "8"], "--layer, --tokens apply to --model, not to --matmul"),
    (["--local"], "--local applies to --model, not to --matmul"),
    (["--model", "models/llama-3.1-8b", "--inputs", "laplace"],
     "--inputs applies to --matmul, not to --model"),
    (["--model", "models/llama-3.1-8b", "--tokens", "0"], "--tokens: 0 must be a positive"),
    (["--vmap"], "--vmap: none of this sweep's runs can be vmapped"),
    (["--json", "."], "--json .: is a directory"),
])
def test_malformed_options_fail_before_any_work(tmp_path, capsys, extra, message):
    out = tmp_path / "never"
    argv = ["sweep", "--out", str(out), "--quiet", *extra]
    if "--matmul" not in extra and "--model" not in extra and "give a workload" not in message:
        argv += ["--matmul", "4x8x4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()



def test_a_set_of_a_swept_path_the_base_needs_is_kept(tmp_path):
    """The refusal of a --set the sweep overrides spares one the base config
    is invalid without: iris-like's "static" outlier policy with its
    threshold unset needs a top_k, here the swept one's."""
    out = tmp_path / "s"
    argv = ["sweep", "--matmul", "4x8x4", "--param", "outliers.top_k=1,2", "--set",
            "outliers.threshold=none", "--quiet", "--out", str(out)]
    assert main(argv) == 2 and not out.exists()  # the base alone is invalid
    assert main([*argv, "--set", "outliers.top_k=2"]) == 0
    assert sorted(load(out)["outliers.top_k"]) == [1, 2]

def test_sweep_prints_its_summary_table_and_results_file(tmp_path, capsys):
    """Without --quiet: the run count on the executor asked for (--jobs 2:
    worker processes), one row per point with its seed mean, std and count
    (pandas' over the stored results), and the results file (parquet by
    default) that --json names. A sweep of one point without --param is
    still tabled, by point."""
    from optical.sweep import load

    out = tmp_path / "s"
    assert main(["sweep", "--matmul", "4x8x4", "--param", "adc.bits=4,6", "--seeds", "2",
                 "--jobs", "2", "--out", str(out), "--json", str(tmp_path / "s.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["executor"] == "2 local worker processes"
    assert summary["results_path"] == str(out / "results.parquet")
    assert (out / "results.parquet").is_file() and lines[-1] == f"results: {out}/results.parquet"
    assert lines[0] == f"{out}: 4 runs (0 already done, 4 run now on 2 local worker processes)"
    assert lines[1].split() == ["adc.bits", "sqnr_db", "mean", "std", "n"]
    by = load(out).groupby("adc.bits")["sqnr_db"]
    for line, (bits, mean, std) in zip(lines[2:4], zip(by.mean().index, by.mean(), by.std(),
                                                         strict=True), strict=True):
        assert line.split() == [str(bits), f"{mean:.3f}", f"{std:.3f}", "2"]
    one = tmp_path / "one"
    assert main(["sweep", "--matmul", "4x8x4", "--jobs", "1", "--out", str(one)]) == 0
    lines = capsys.readouterr().out.splitlines()
    value = load(one)["sqnr_db"].iloc[0]
    assert lines[1].split() == ["point", "sqnr_db", "mean", "std", "n"]
    assert lines[2].split() == ["0", f"{value:.3f}", "1"]  # no std of one seed
    # an infinite mean over several seeds has no std: "-", not the blank of one
    # seed (a metrics audit; the ideal preset's exact float64 matmul)
    exact = tmp_path / "exact"
    assert main(["sweep", "--matmul", "1x1x1", "--dtype", "float64", "--preset", "ideal",
                 "--seeds", "2", "--jobs", "1", "--out", str(exact)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split() == ["0", "inf", "-", "2"]


def test_quiet_sweep_prints_nothing(tmp_path, capfd):
    """--quiet: no progress bar (stderr) and no summary (stdout); the results
    are written all the same."""
    out = tmp_path / "q"
    assert main(["sweep", "--matmul", "4x8x4", "--param", "adc.bits=4,6", "--jobs", "1",
                 "--quiet", "--out", str(out)]) == 0
    assert capfd.readouterr() == ("", "")
    assert (out / "results.parquet").is_file()


def test_resume_needs_a_sweep(tmp_path, capsys):
    assert main(["sweep", "--out", str(tmp_path / "none")]) == 2
    assert "no sweep here" in capsys.readouterr().err


def test_changed_sweep_is_refused(tmp_path, capsys):
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    changed = [a.replace("adc.bits=4,8", "adc.bits=4,6,8") for a in SWEEP]
    assert main([*changed, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "holds a different sweep" in err and "adc.bits: [4, 8] -> [4, 6, 8]" in err


def test_failed_run_exits_1_and_keeps_finished_runs(tmp_path, capsys, monkeypatch):
    from optical import workloads

    real = workloads.MatmulWorkload.run

    def flaky(self, config, seed):
        if config.adc.bits == 8:
            raise FloatingPointError("overflow in the ADC")
        return real(self, config, seed)

    monkeypatch.setattr(workloads.MatmulWorkload, "run", flaky)
    for out in (tmp_path / "s", tmp_path / "s."):  # a name ending in a dot keeps it
        assert main([*SWEEP, "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert "FloatingPointError: overflow in the ADC" in err
        # how to go on, as a Ctrl-C or a full disk says it (an observability audit)
        assert err.rstrip().endswith(f"runs finished so far are kept in {out}; run `optical "
                                     f"sweep --out {out}` to run the rest once that is mended")
        assert len(load(out)) == 4


def test_sweep_on_a_dask_scheduler(tmp_path):
    distributed = pytest.importorskip("distributed")
    argv = [a for a in SWEEP if a not in ("--jobs", "1")]
    assert main([*argv, "--out", str(tmp_path / "local")]) == 0
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster:
        assert main([*argv, "--out", str(tmp_path / "dask"), "--scheduler",
                     cluster.scheduler_address, "--json", str(tmp_path / "d.json")]) == 0
    assert "Dask cluster" in json.loads((tmp_path / "d.json").read_text())["executor"]
    local, dask = load(tmp_path / "local"), load(tmp_path / "dask")
    pd.testing.assert_frame_equal(local.drop(columns=["elapsed_s", "finished_at"]), dask.drop(columns=["elapsed_s", "finished_at"]))


def test_every_command_has_help_with_examples(capsys):
    from optical.cli import COMMANDS

    parser = build_parser()
    commands = [module.__name__.rsplit(".", 1)[1] for module in COMMANDS]
    assert set(commands) >= {"config", "validate", "sweep", "plot", "energy"}
    for command in commands:
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        text = capsys.readouterr().out
        assert "--json" in text
        if command != "config":
            assert "examples:" in text and f"optical {command} " in text


def test_plot_writes_labelled_png_and_svg(tmp_path):
    from optical.commands.plot import make_figure

    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    argv = ["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db",
            "--hue", "source.photons_per_mac", "--json", str(tmp_path / "p.json")]
    assert main(argv) == 0
    files = [tmp_path / f for f in json.loads((tmp_path / "p.json").read_text())["files"]]
    png, svg = files
    assert png.suffix == ".png" and png.stat().st_size > 1000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert svg.read_text().lstrip().startswith("<?xml") and "<svg" in svg.read_text()
    fig, name = make_figure(load(out), build_parser().parse_args(argv))
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("adc.bits",
                                                  "sqnr_db (dB)\nmean ± std over 2 seeds")
    assert ax.get_legend().get_title().get_text() == "source.photons_per_mac\n(photons)"
    assert png.name == name + ".png"


def test_plot_heatmap_and_where(tmp_path):
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    stem = tmp_path / "heat"
    assert main(["plot", str(out), "--kind", "heatmap", "--x", "adc.bits", "--y",
                 "source.photons_per_mac", "--z", "cosine", "--output", str(stem),
                 "--formats", "png"]) == 0
    assert (tmp_path / "heat.png").stat().st_size > 1000
    assert not (tmp_path / "heat.svg").exists()
    # --x along the columns, --y along the rows (a transposed figure would
    # keep its file name).
    from optical.cli import build_parser
    from optical.commands.plot import make_figure

    args = build_parser().parse_args(["plot", str(out), "--kind", "heatmap", "--x", "adc.bits",
                                      "--y", "source.photons_per_mac", "--z", "cosine"])
    fig, name = make_figure(load(out), args)
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("adc.bits",
                                                  "source.photons_per_mac (photons)")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "8"]
    assert name == "cosine-over-adc.bits-source.photons_per_mac"
    # A line with a hue gets its own file, not the one without.
    assert main(["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db", "--hue",
                 "source.photons_per_mac", "--formats", "png"]) == 0
    assert (out / "plots" / "sqnr_db-vs-adc.bits-by-source.photons_per_mac.png").is_file()
    assert main(["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db", "--where",
                 "source.photons_per_mac=1e6"]) == 0
    assert list((out / "plots").glob("sqnr_db-vs-adc.bits-source.photons_per_mac=1000000.0.png"))


@pytest.mark.parametrize(("extra", "message"), [
    (["--x", "adc.bits", "--y", "sqnr_db"], "parameter source.photons_per_mac also varies"),
    (["--x", "adc.bit", "--y", "sqnr_db"], "x 'adc.bit' is not a swept parameter"),
    (["--x", "adc.bits", "--y", "sqnr"], "y 'sqnr' is not a metric of this sweep"),
    (["--x", "adc.bits"], "--kind line needs --y"),
    (["--x", "adc.bits", "--y", "sqnr_db", "--where", "source.photons_per_mac=5"],
     "where source.photons_per_mac=5.0: no runs match"),
    (["--kind", "bars"], "no per-matmul columns sqnr_db.<matmul>"),
    (["--kind", "heatmap", "--x", "adc.bits", "--y", "source.photons_per_mac", "--z", "snr"],
     "z 'snr' is not a metric of this sweep"),
    (["--x", "adc.bits", "--y", "sqnr_db", "--formats", "gif"], "--formats: 'gif' is not valid"),
    # one value per held parameter, as --set takes one per path
    (["--x", "adc.bits", "--y", "sqnr_db", "--where", "source.photons_per_mac=1e4", "--where",
      "source.photons_per_mac=1e6"], "--where source.photons_per_mac: given twice"),
    # an option the kind would ignore
    (["--kind", "bars", "--x", "adc.bits"], "--x: --kind bars does not use it"),
    (["--x", "adc.bits", "--y", "sqnr_db", "--z", "cosine", "--hue", "source.photons_per_mac"],
     "--z: --kind line does not use it (it uses --x, --y, --hue and --where)"),
    (["--kind", "heatmap", "--x", "adc.bits", "--y", "source.photons_per_mac", "--z", "cosine",
      "--hue", "adc.bits"], "--hue: --kind heatmap does not use it"),
])
def test_bad_plot_options_are_named(tmp_path, capsys, extra, message):
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["plot", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (out / "plots").exists()


def test_plot_output_that_cannot_be_written_is_named_before_the_work(tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    for stem in (tmp_path / "file" / "fig", tmp_path / "file" / "fig.svg"):
        assert main(["plot", str(tmp_path / "nowhere"), "--x", "adc.bits", "--y", "sqnr_db",
                     "--output", str(stem)]) == 2  # 2, not an OS error's 1
        err = capsys.readouterr().err
        assert f"--output {stem.with_suffix('')}." in err and "is a file, not a directory" in err
        assert "no sweep" not in err  # refused before the sweep was read


def test_plot_formats_naming_no_format_are_refused(tmp_path, capsys):
    assert main(["plot", str(tmp_path), "--x", "adc.bits", "--y", "sqnr_db",
                 "--formats", " , "]) == 2
    err = capsys.readouterr().err
    assert "--formats: ' , ' names no format" in err and "Traceback" not in err
    assert not (tmp_path / "plots").exists()


def _pool_sweep_argv(out):
    """A 60-run matmul sweep on two worker processes, long enough to stop mid-way."""
    return ["sweep", "--matmul", "64x1024x512", "--param", "adc.bits=4,6,8",
            "--param", "source.photons_per_mac=1e4,1e5,1e6,1e7", "--seeds", "5",
            "--out", str(out), "--jobs", "2", "--quiet"]


def _started(args, runs, finished):
    """``python ARGS`` started, once ``finished`` runs are in ``runs`` (or
    it ended, or two minutes passed)."""
    process = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if runs.is_dir() and len(list(runs.glob("*.json"))) >= finished:
            break
        time.sleep(0.01)
    return process


@pytest.mark.slow
def test_sigterm_mid_sweep_then_rerun_completes_every_run_once(tmp_path):
    """SIGTERM to a running `optical sweep`: it stops, keeps what finished, and
    the same command finishes the rest, each (point, seed) exactly once."""
    out = tmp_path / "s"
    argv = _pool_sweep_argv(out)
    total = 3 * 4 * 5
    process = _started(["-m", "optical.cli", *argv], out / "runs", finished=4)
    runs = out / "runs"
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr.decode()
    assert f"run `optical sweep --out {out}` to resume" in stderr.decode()
    kept = {p.name: p.stat().st_mtime_ns for p in runs.glob("*.json")}
    assert 4 <= len(kept) < total
    assert not list(runs.glob(".*.tmp"))

    assert main([*argv, "--json", str(tmp_path / "r.json")]) == 0
    summary = json.loads((tmp_path / "r.json").read_text())
    assert (summary["already_done"], summary["ran"]) == (len(kept), total - len(kept))
    workers = min(2, total - len(kept))  # --jobs 2 ran in worker processes
    assert summary["executor"] == f"{workers} local worker process{'es' * (workers > 1)}"
    frame = load(out)
    assert len(frame) == total and not frame.duplicated(["point", "seed"]).any()
    assert sorted(frame["run_id"]) == sorted(p.stem for p in runs.glob("*.json"))
    assert {n: (runs / n).stat().st_mtime_ns for n in kept} == kept
    assert os.path.getsize(out / "results.parquet") > 0


_HANGUP = """
import json, os, pty, select, signal, sys, time
out, argv = sys.argv[1], sys.argv[2:]
pid, fd = pty.fork()
if pid == 0:  # the child: the sweep, on the pty as its terminal
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # (under `nohup make test`)
    os.execv(sys.executable, [sys.executable, "-m", "optical.cli", *argv])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    if select.select([fd], [], [], 0.1)[0]:
        try:
            os.read(fd, 65536)  # its progress bar
        except OSError:
            break
    runs = os.path.join(out, "runs")
    if os.path.isdir(runs) and sum(n.endswith(".json") for n in os.listdir(runs)) >= 3:
        break
os.close(fd)  # the terminal closes: the kernel sends SIGHUP
_, status = os.waitpid(pid, 0)
print(json.dumps([os.WIFEXITED(status) and os.WEXITSTATUS(status),
                  os.WIFSIGNALED(status) and os.WTERMSIG(status)]))
"""


@pytest.mark.slow
def test_a_closed_terminal_stops_a_sweep_with_129_though_its_stderr_is_gone(tmp_path):
    """A review: SIGHUP from a terminal that really closed (the sweep on a
    pty whose other end is closed) exited 1 with a traceback, not 129: the
    one line went to a stderr that was the hung-up terminal, and its EIO
    escaped. The line is dropped where it cannot be written; the finished
    runs are kept, no temporary file is left. (The pty is driven from a
    fresh interpreter: forking this one, which has imported JAX, warns.)"""
    out = tmp_path / "s"
    argv = ["sweep", "--matmul", "16x64x64", "--param", "adc.bits=4,5", "--seeds", "2000",
            "--jobs", "1", "--out", str(out)]
    done = subprocess.run([sys.executable, "-c", _HANGUP, str(out), *argv],
                          capture_output=True, text=True, timeout=180)
    assert json.loads(done.stdout) == [128 + signal.SIGHUP, False], done.stderr
    kept = list((out / "runs").glob("*.json"))
    assert 3 <= len(kept) < 4000
    assert not list(out.rglob("*.tmp"))


@pytest.mark.slow
def test_a_hangup_of_the_whole_process_group_prints_the_sweeps_one_line_alone(tmp_path):
    """A review: SIGHUP to a sweep's whole process group (what a shell does
    to its jobs when its terminal closes) with worker processes killed
    multiprocessing's resource tracker too (it ignores SIGINT and SIGTERM,
    not SIGHUP): a warning and five KeyError tracebacks followed the
    sweep's line. The tracker starts with SIGHUP blocked now."""
    out = tmp_path / "s"
    program = ("import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
               "sys.argv[0] = 'optical'; runpy.run_module('optical.cli', run_name='__main__')")
    process = subprocess.Popen([sys.executable, "-c", program, *_pool_sweep_argv(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if (out / "runs").is_dir() and len(list((out / "runs").glob("*.json"))) >= 2:
            break
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGHUP)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGHUP, stderr.decode()
    assert stderr.decode().splitlines() == [
        f"optical sweep: terminated (SIGHUP); finished runs are kept in {out}; run `optical "
        f"sweep --out {out}` to resume"]


_PROGRAM = """
import signal, sys
from optical import cli

if __name__ == "__main__":  # not in the spawned workers
    # SIGINT may be inherited ignored (a background `make test &`): this test's must land.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = ["optical", *sys.argv[1:]]
    sys.exit(cli.main())
"""


@pytest.mark.slow
def test_ctrl_c_mid_process_pool_sweep_prints_its_one_line_alone(tmp_path):
    """An observability audit: Ctrl-C to a sweep on worker processes printed
    its one line, then Python's resource tracker's "UserWarning: ... 5 leaked
    semaphore objects to clean up at shutdown": the process died of SIGINT
    while the pool's manager thread still held the pool's queues."""
    script = tmp_path / "program.py"
    script.write_text(_PROGRAM)
    out = tmp_path / "s"
    process = _started([str(script), *_pool_sweep_argv(out)], out / "runs", finished=2)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == -signal.SIGINT, stderr.decode()
    assert stderr.decode().splitlines() == [
        f"optical sweep: interrupted; finished runs are kept in {out}; run `optical sweep "
        f"--out {out}` to resume"]


_SWALLOWING = """
import ctypes, os, signal, sys, time
import optical.sweep, optical.transformer
from optical import cli

SIGNUM = getattr(signal, sys.argv[1])
# Python leaves SIGINT ignored where it starts so (a background job of a
# shell script, as `make test &` runs this suite): this test's Ctrl-C must land.
signal.signal(signal.SIGINT, signal.default_int_handler)


def swallowing(*args, **kwargs):
    @ctypes.CFUNCTYPE(None)
    def compiling():  # numba's compiler calls back into Python as this does
        os.kill(os.getpid(), SIGNUM)
        time.sleep(0.5)  # the handler runs in here: Python ignores what it raises
    compiling()
    time.sleep(60)  # the rest of a long compile
    raise SystemExit(3)


if __name__ == "__main__":
    sys.modules["optical.sweep"].execute = optical.transformer.validate = swallowing
    sys.argv = ["optical", *sys.argv[2:]]
    sys.exit(cli.main())
"""


_TERMINATED = """
import os, signal, sys, time
from optical import cli


def terminated(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
    raise SystemExit(3)


if __name__ == "__main__":
    sys.modules["optical.sweep"].execute = terminated
    sys.argv = ["optical", *sys.argv[1:]]
    sys.exit(cli.main())
"""


def test_sigterm_to_a_vmap_sweep_dies_of_the_signal(tmp_path):
    """A --vmap sweep's SIGTERM became a normal interpreter exit, which
    crashed (a segmentation fault) where XLA was still compiling the batch in
    its threads: it now dies of SIGTERM after its one line, as the process
    workers' sweeps need not (they exit 143 with their pool seen off)."""
    pytest.importorskip("jax")
    script = tmp_path / "terminated.py"
    script.write_text(_TERMINATED)
    argv = ["sweep", "--matmul", "8x64x16", "--backend", "jax", "--vmap", "--param",
            "source.photons_per_mac=1e3,1e5", "--seeds", "2", "--out", str(tmp_path / "s"),
            "--quiet"]
    done = subprocess.run([sys.executable, str(script), *argv], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "optical sweep: terminated (SIGTERM); finished runs are kept in " in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("signame", "command", "message"), [
    ("SIGTERM", "sweep", "optical sweep: terminated (SIGTERM); finished runs are kept in "),
    ("SIGINT", "sweep", "optical sweep: interrupted; finished runs are kept in "),
    ("SIGINT", "validate", "optical validate: interrupted"),
])
def test_a_stop_signal_python_ignores_still_stops_the_command_at_once(tmp_path, signame,
                                                                       command, message):
    """A signal that lands while numba compiles has its exception raised in
    LLVM's callback into Python, which ignores it: a serial sweep went on
    for 73-82 s (past a batch scheduler's grace period), `optical validate`
    failed later with numba's "no compiled object yet". The command now says
    so in one line and dies of the signal there, as a shell expects."""
    script = tmp_path / "swallowing.py"
    script.write_text(_SWALLOWING)
    argv = (["sweep", "--matmul", "4x8x8", "--param", "adc.bits=4", "--seeds", "1",
             "--out", str(tmp_path / "s")] if command == "sweep"
            else ["validate", "--model", str(MODELS / "llama-3.2-1b"), "--tokens", "4"])
    signum = getattr(signal, signame)
    done = subprocess.run([sys.executable, str(script), signame, *argv, "--quiet"],
                          capture_output=True, text=True, timeout=40)
    assert done.returncode == -signum, done.stderr
    assert message in done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_vmap_option_batches_jax_runs(tmp_path):
    pytest.importorskip("jax")
    argv = ["sweep", "--matmul", "8x64x16", "--backend", "jax", "--vmap", "--set",
            "adc.full_scale=rms", "--param", "source.photons_per_mac=1e3,1e5", "--seeds", "2",
            "--quiet", "--out", str(tmp_path / "v"), "--json", str(tmp_path / "v.json")]
    assert main(argv) == 0
    assert "vmapped" in json.loads((tmp_path / "v.json").read_text())["executor"]
    assert len(load(tmp_path / "v")) == 4



@pytest.mark.slow
def test_vmap_option_batches_the_jax_points_of_a_backend_sweep(tmp_path):
    """``--param workload.backend=jax,numba --vmap`` was refused ("none of
    this sweep's runs can be vmapped"): the check asked the base workload
    (backend auto), where the executor asks each point's. Now the JAX
    point's two seeds run as one batch, the numba point's one by one."""
    pytest.importorskip("jax")
    argv = ["sweep", "--matmul", "8x64x16", "--param", "workload.backend=jax,numba",
            "--set", "adc.full_scale=rms", "--seeds", "2", "--vmap", "--quiet",
            "--out", str(tmp_path / "v")]
    assert main(argv) == 0
    runs = [json.loads(f.read_text()) for f in (tmp_path / "v" / "runs").glob("*.json")]
    batches = sorted((r["params"]["workload.backend"], r["vmap_batch"]) for r in runs)
    assert batches == [("jax", 2), ("jax", 2), ("numba", None), ("numba", None)]

def _definition_options():
    """Every option of the sweep's definition, with a valid value: each is
    refused when the sweep is resumed from --out alone (it would be ignored)."""
    parser = build_parser()
    sweep = parser._subparsers._group_actions[0].choices["sweep"]
    groups = [g for g in sweep._action_groups
              if g.title.startswith(("workload", "parameters"))]
    options = [a for g in groups for a in g._group_actions
               if a.dest not in ("matmul", "model")]
    options += [a for a in sweep._actions if a.dest in ("preset", "config_file", "overrides")]
    values = {"param": "adc.bits=4", "overrides": "adc.bits=6", "preset": "ideal",
              "config_file": "machine.json"}
    cases = []
    for action in options:
        if action.nargs == 0:  # a flag (--local): no value
            cases.append((action.option_strings[0], None))
            continue
        value = values.get(action.dest) or (action.choices[-1] if action.choices else
                                            "3" if action.type in (int, float) else None)
        assert value is not None, action.dest
        cases.append((action.option_strings[0], value))
    return cases


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweeps") / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize(("option", "value"), _definition_options())
def test_resume_refuses_options_it_would_ignore(finished_sweep, capsys, option, value):
    """`optical sweep --out DIR --seeds 5` used to resume the old sweep with its
    old seeds, saying nothing."""
    stamps = {p.name: p.stat().st_mtime_ns for p in finished_sweep.rglob("*")}
    capsys.readouterr()
    given = [option] if value is None else [option, value]
    assert main(["sweep", "--out", str(finished_sweep), *given, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{option} given without a workload" in err and "Traceback" not in err
    assert {p.name: p.stat().st_mtime_ns for p in finished_sweep.rglob("*")} == stamps


def test_resume_takes_execution_options(finished_sweep, tmp_path):
    assert main(["sweep", "--out", str(finished_sweep), "--jobs", "1", "--format", "csv",
                 "--quiet", "--json", str(tmp_path / "r.json")]) == 0
    summary = json.loads((tmp_path / "r.json").read_text())
    assert (summary["already_done"], summary["ran"]) == (8, 0)
    assert len(pd.read_csv(finished_sweep / "results.csv")) == 8


def test_vmap_on_resume_of_a_sweep_it_cannot_batch(finished_sweep, capsys):
    assert main(["sweep", "--out", str(finished_sweep), "--vmap", "--quiet"]) == 2
    assert "--vmap: none of this sweep's runs can be vmapped" in capsys.readouterr().err


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_prints_how_to_resume_and_keeps_finished_runs(tmp_path, capsys, monkeypatch,
                                                              signame):
    """SIGTERM, and SIGHUP (a closed terminal or ssh session, whose default
    action killed the sweep without a word: left by six stops), stop the
    sweep after its finished runs, say how to resume and exit 128 + the
    signal's number."""
    from optical import workloads

    if not hasattr(signal, signame):  # pragma: no cover (Windows has no SIGHUP)
        pytest.skip(f"no {signame} on this platform")
    signum = getattr(signal, signame)
    real, calls = workloads.MatmulWorkload.run, []

    def terminated_at_the_third_run(self, config, seed):
        calls.append(seed)
        if len(calls) == 3:
            signal.raise_signal(signum)  # in this (the main) thread
        return real(self, config, seed)

    monkeypatch.setattr(workloads.MatmulWorkload, "run", terminated_at_the_third_run)
    out = tmp_path / "s"
    # `nohup make test` starts the suite with SIGHUP ignored, which the
    # command leaves ignored: give it the default for this test alone (not
    # the whole suite's, which nohup is there to keep alive).
    before = signal.signal(signum, signal.SIG_DFL)
    try:
        assert main([*SWEEP, "--out", str(out)]) == 128 + signum
    finally:
        signal.signal(signum, before)
    err = capsys.readouterr().err
    assert f"terminated ({signame}); finished runs are kept in {out}" in err
    assert f"`optical sweep --out {out}` to resume" in err and "Traceback" not in err
    assert len(load(out)) == 2
    monkeypatch.setattr(workloads.MatmulWorkload, "run", real)
    assert main(["sweep", "--out", str(out), "--jobs", "1", "--quiet", "--json",
                 str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["ran"] == 6



@pytest.mark.parametrize("resume", [False, True])
def test_sigterm_while_the_sweep_is_defined_says_so_and_exits_143(tmp_path, capsys,
                                                                  monkeypatch, resume):
    """Building the definition (a million random points, a model's digest)
    ran before the sweep's signal handling: a SIGTERM there killed the
    command without a word (an audit), where ``optical --help`` promises
    one line and 143. Nothing in --out is touched, so there is nothing to
    resume: the line says only what stopped it."""
    sweep_module = sys.modules["optical.sweep"]  # (optical.sweep is also the function)
    out = tmp_path / "s"
    if resume:
        assert main([*SWEEP, "--out", str(out), "--quiet"]) == 0
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    real_build, real_stored = (sweep_module.SweepDefinition.build.__func__,
                               sweep_module.stored_definition)

    def build(cls, *args, **kwargs):
        signal.raise_signal(signal.SIGTERM)  # in this (the main) thread
        return real_build(cls, *args, **kwargs)

    def stored(*args, **kwargs):
        signal.raise_signal(signal.SIGTERM)
        return real_stored(*args, **kwargs)

    if resume:
        monkeypatch.setattr(sweep_module, "stored_definition", stored)
    else:
        monkeypatch.setattr(sweep_module.SweepDefinition, "build", classmethod(build))
    capsys.readouterr()
    argv = ["sweep", "--out", str(out)] if resume else [*SWEEP, "--out", str(out)]
    assert main(argv) == 143
    assert capsys.readouterr().err == "optical sweep: terminated (SIGTERM)\n"
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before

def test_corrupt_manifest_advice_from_the_cli_works(tmp_path, capsys):
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    before = load(out)
    manifest = out / "manifest.json"
    manifest.write_text(manifest.read_text()[:50])
    capsys.readouterr()
    assert main(["sweep", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"optical sweep: error: {manifest}: not valid JSON")
    assert "delete" in err and "not only --out" in err and len(err.splitlines()) == 1
    manifest.unlink()  # as advised
    assert main([*SWEEP, "--out", str(out), "--json", str(tmp_path / "r.json")]) == 0
    summary = json.loads((tmp_path / "r.json").read_text())
    assert (summary["already_done"], summary["ran"]) == (8, 0)
    pd.testing.assert_frame_equal(load(out), before)


def test_damaged_run_file_is_one_line_naming_it(tmp_path, capsys):
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    run = sorted((out / "runs").glob("*.json"))[0]
    record = json.loads(run.read_text())
    del record["seed"]
    run.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db", "--where",
                 "source.photons_per_mac=1e6"]) == 2
    err = capsys.readouterr().err
    assert f"optical plot: error: {run}: not a run record of this sweep: missing key 'seed'" \
        in err


def test_sweep_without_pandas_is_one_line_with_the_install_command(tmp_path, capsys,
                                                                    monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas: ImportError
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("optical sweep: error: ") and "pip install 'optical[sweep]'" in err
    assert "Traceback" not in err and not out.exists()


def test_a_package_that_fails_to_import_is_not_called_missing(tmp_path, capsys, monkeypatch):
    """pyarrow 14 under numpy 2 is installed but fails to import: "sweeps
    need 'pyarrow': pip install" sent the user to install what they had."""
    import importlib

    real = importlib.import_module

    def broken(name, *args, **kwargs):
        if name == "pyarrow":
            raise ImportError("numpy.core.multiarray failed to import")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib, "import_module", broken)
    assert main([*SWEEP, "--out", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert "sweeps need 'pyarrow', which is installed but failed to import (ImportError: " \
        "numpy.core.multiarray failed to import)" in err
    assert "pip install" not in err


def test_unreachable_scheduler_is_one_line_naming_it(tmp_path, capsys, monkeypatch):
    pytest.importorskip("distributed")
    from optical.commands import sweep as sweep_command

    monkeypatch.setattr(sweep_command, "SCHEDULER_TIMEOUT_S", 1)
    out = tmp_path / "s"
    argv = [a for a in SWEEP if a not in ("--jobs", "1")]
    assert main([*argv, "--out", str(out), "--scheduler", "tcp://127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("optical sweep: error: --scheduler tcp://127.0.0.1:1: no Dask "
                          "scheduler answered within 1 s")
    assert "Traceback" not in err and not out.exists()


def test_a_tls_scheduler_without_tls_settings_is_one_line_naming_it(tmp_path, capsys):
    """Dask refuses tls:// without an SSL context with a TypeError; the error
    line names the option and the address, as for any other bad address."""
    pytest.importorskip("distributed")
    out = tmp_path / "s"
    argv = [a for a in SWEEP if a not in ("--jobs", "1")]
    assert main([*argv, "--out", str(out), "--scheduler", "tls://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("optical sweep: error: --scheduler tls://127.0.0.1:1: ")
    assert "TLS" in err and "Traceback" not in err and not out.exists()


def test_plot_of_a_sweep_without_finished_runs_says_so(tmp_path, capsys):
    from tests.test_sweep import Interruptible

    out = tmp_path / "s"
    with pytest.raises(KeyboardInterrupt):
        optical.sweep(Interruptible(optical.MatmulWorkload(4, 8, 4), stop_after=0),
                      {"adc.bits": [4, 8]}, seeds=1, out=out, executor="serial",
                      progress=False)
    for extra in (["--x", "adc.bits", "--y", "sqnr_db"],
                  ["--kind", "heatmap", "--x", "adc.bits", "--y", "adc.bits", "--z", "cosine"],
                  ["--kind", "bars"]):
        assert main(["plot", str(out), *extra]) == 2
        assert "optical plot: error: no finished runs to plot" in capsys.readouterr().err


def test_plot_of_an_unfinished_sweep_says_how_many_runs_it_shows(tmp_path, capsys, monkeypatch):
    """3 of 4 runs finished: the figure is drawn from those 3, and stderr and
    --json say 3 of 4; once the sweep is finished, no note. The command that
    finishes it is quoted for the shell, as the sweep's own resume hint (a
    directory name with a space was not)."""
    import shlex

    from tests.test_sweep import Interruptible

    out = tmp_path / "my sweep"
    workload = optical.MatmulWorkload(4, 8, 4)
    with pytest.raises(KeyboardInterrupt):
        optical.sweep(Interruptible(workload, stop_after=3), {"adc.bits": [4, 8]}, seeds=2,
                      out=out, executor="serial", progress=False)
    argv = ["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db", "--json", "-"]
    capsys.readouterr()
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "note: 3 of the sweep's 4 runs are finished" in captured.err
    assert f"`optical sweep --out {shlex.quote(str(out))}` finishes the rest" in captured.err
    assert (json.loads(captured.out)["runs"], json.loads(captured.out)["planned_runs"]) == (3, 4)
    # --json names the sweep it drew, and what computed it (an observability
    # audit: a figure's JSON written elsewhere could not be traced back)
    assert {k: json.loads(captured.out)[k] for k in ("sweep", "results_version")} == {
        "sweep": str(out), "results_version": RESULTS_VERSION}
    # and the commits of optical its runs were computed by (the backlog: the
    # JSON named only the plotting optical's version)
    assert json.loads(captured.out)["run_commits"] == (
        [] if optical._version.source_commit() is None else [optical._version.source_commit()])
    monkeypatch.chdir(out.parent)  # a relative sweep directory is recorded absolute
    assert main(["plot", out.name, *argv[2:]]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["sweep"] == str(out)
    assert written["files"] == [str(out / "plots" / f"sqnr_db-vs-adc.bits.{ext}")
                                for ext in ("png", "svg")]
    # --json names the metric its means are of, and the values held
    assert {k: json.loads(captured.out)[k] for k in ("kind", "metric", "where")} == {
        "kind": "line", "metric": "sqnr_db", "where": {}}
    # and which parameters it drew on which axis, of which sweep definition
    # (the reproduction audit: a JSON read alone could not say)
    assert {k: json.loads(captured.out)[k] for k in ("x", "hue", "definition_hash")} == {
        "x": "adc.bits", "hue": None,
        "definition_hash": json.loads((out / "manifest.json").read_text())["definition_hash"]}
    # --json holds what the figure draws: each point's mean, std and seeds
    frame = load(out)
    data = json.loads(captured.out)["data"]
    assert [(d["adc.bits"], d["seeds"]) for d in data] == [(4, 2), (8, 1)]
    for d in data:
        values = frame.loc[frame["adc.bits"] == d["adc.bits"], "sqnr_db"]
        assert d["mean"] == pytest.approx(values.mean(), rel=1e-12)
        assert d["std"] == pytest.approx(values.std() if len(values) > 1 else 0.0, rel=1e-12)
    optical.sweep(workload, {"adc.bits": [4, 8]}, seeds=2, out=out, executor="serial",
                  progress=False)
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "note" not in captured.err
    assert (json.loads(captured.out)["runs"], json.loads(captured.out)["planned_runs"]) == (4, 4)


def test_a_sweep_s_figure_names_its_workload_base_config_and_unfinished_runs(tmp_path):
    """The figure's first title line says what was swept (the workload, the
    preset the base config equals, else the nearest with the fields it
    changes, else "custom config") and, while the sweep
    is unfinished, how many of its runs the figure holds, counted over the
    whole sweep whatever `where` selects."""
    pytest.importorskip("matplotlib")
    from optical import plots
    from tests.test_sweep import Interruptible

    out = tmp_path / "s"
    workload = optical.MatmulWorkload(4, 8, 4)
    params = {"adc.bits": [4, 8], "dac.bits": [6, 8]}
    with pytest.raises(KeyboardInterrupt):
        optical.sweep(Interruptible(workload, stop_after=3), params, seeds=1, out=out,
                      executor="serial", progress=False)
    frame = load(out)
    assert (frame.attrs["sweep"]["workload"], frame.attrs["sweep"]["base"]) == \
        ("matmul 4x8x4", "iris-like")
    for fig in (plots.line(frame, "adc.bits", "sqnr_db", hue="dac.bits"),
                plots.line(frame, "adc.bits", "sqnr_db", where={"dac.bits": 6}),
                plots.heatmap(frame, "adc.bits", "dac.bits", "sqnr_db")):
        title = fig.axes[0].get_title().split("\n")
        assert title[0] == "matmul 4x8x4; iris-like; unfinished: 3 of 4 runs"
    assert title[1:] == []  # heatmap: no where, no NaN seed
    optical.sweep(workload, params, seeds=1, out=out, executor="serial", progress=False)
    title = plots.line(load(out), "adc.bits", "sqnr_db", where={"dac.bits": 6}).axes[0]
    assert title.get_title().split("\n") == ["matmul 4x8x4; iris-like", "dac.bits=6"]
    # A slice of a finished sweep (pandas keeps its attrs) is not "unfinished".
    frame = load(out)
    part = frame[frame["dac.bits"] == 6]
    assert len(part) < part.attrs["sweep"]["runs"]
    assert plots.line(part, "adc.bits", "sqnr_db").axes[0].get_title() == \
        "matmul 4x8x4; iris-like"
    # A manifest of another version (a config field this one lacks) still loads.
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["definition"]["base_config"]["adc"]["gone_field"] = 1
    manifest["definition_hash"] = content_hash(manifest["definition"])  # as it wrote it
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert load(out).attrs["sweep"]["base"] == "custom config"
    custom = optical.presets.get("iris-like").replace({"adc.full_scale": "rms"})
    optical.sweep(workload, {"adc.bits": [4]}, seeds=1, out=tmp_path / "c", base=custom,
                  executor="serial", progress=False)
    assert load(tmp_path / "c").attrs["sweep"]["base"] == "iris-like with adc.full_scale='rms'"
    # A swept path's base value is never run: not named (it said "adc.bits=6" of
    # a sweep over 4 and 8).
    six = optical.presets.get("iris-like").replace({"adc.bits": 6})
    optical.sweep(workload, {"adc.bits": [4, 8]}, seeds=1, out=tmp_path / "six", base=six,
                  executor="serial", progress=False)
    assert load(tmp_path / "six").attrs["sweep"]["base"] == "iris-like"


@pytest.mark.parametrize(("output", "formats", "written"), [
    ("fig.png", None, ["fig.png"]),
    ("fig.svg", None, ["fig.svg"]),
    ("fig.png", "png,svg", ["fig.png", "fig.svg"]),
    ("fig", None, ["fig.png", "fig.svg"]),
    ("fig.v2", "pdf", ["fig.v2.pdf"]),
])
def test_plot_output_suffix_names_the_format(finished_sweep, tmp_path, output, formats,
                                             written):
    argv = ["plot", str(finished_sweep), "--x", "adc.bits", "--y", "sqnr_db", "--where",
            "source.photons_per_mac=1e6", "--output", str(tmp_path / "figs" / output)]
    assert main(argv + (["--formats", formats] if formats else [])) == 0
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == written
    magic = {".png": b"\x89PNG", ".svg": b"<?xml", ".pdf": b"%PDF"}
    for name in written:
        path = tmp_path / "figs" / name
        assert path.read_bytes().startswith(magic[path.suffix])


def test_plot_output_suffix_against_formats_is_refused(finished_sweep, tmp_path, capsys):
    assert main(["plot", str(finished_sweep), "--x", "adc.bits", "--y", "sqnr_db", "--where",
                 "source.photons_per_mac=1e6", "--output", str(tmp_path / "fig.svg"),
                 "--formats", "png"]) == 2
    assert "names the format svg, but --formats is png" in capsys.readouterr().err
    assert not list(tmp_path.glob("fig*"))
    assert main(["plot", str(finished_sweep), "--x", "adc.bits", "--y", "sqnr_db", "--where",
                 "source.photons_per_mac=1e6", "--output", str(tmp_path / "fig.jpg")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"optical plot: error: --output {tmp_path / 'fig.jpg'}: .jpg figures are not written "
        "here; valid: .png, .svg, .pdf, or a name without a suffix (then every format asked "
        "for)")
    assert not list(tmp_path.glob("fig*"))


@pytest.mark.parametrize("missing", ["matplotlib", "pandas"])
def test_plot_without_its_packages_is_one_line_with_the_install_command(finished_sweep, capsys,
                                                                        monkeypatch, missing):
    # optical[sweep] installs both: naming optical[plot] for matplotlib sent
    # a user without pandas round twice.
    monkeypatch.setitem(sys.modules, missing, None)
    assert main(["plot", str(finished_sweep), "--x", "adc.bits", "--y", "sqnr_db"]) == 1
    err = capsys.readouterr().err
    assert err == (f"optical plot: error: optical plot needs {missing}, which is not "
                   "installed: pip install 'optical[sweep]'\n")


# --------------------------------------------------------------------------- #
# Each option of the sweep's definition against what it stands for in the API
# --------------------------------------------------------------------------- #

#: SWEEP's machine: iris-like on a 32-input core.
BASE = optical.presets.get("iris-like").replace({"core.inputs": 32})
SMALL = ["sweep", "--matmul", "16x64x32", "--param", "adc.bits=6,8", "--seeds", "2",
         "--set", "core.inputs=32", "--jobs", "1", "--quiet"]


def _stored_workload(out):
    return json.loads((out / "manifest.json").read_text())["definition"]["workload"]


def _assert_runs_are(frame, run, base, paths):
    """Each row's metrics are ``run(config, seed)`` at its point, computed here."""
    assert len(frame) > 0
    for row in frame.to_dict("records"):
        expected = run(base.replace({path: row[path] for path in paths}), row["seed"])
        assert {name: row[name] for name in expected} == expected, row["run_id"]


@pytest.mark.parametrize(("options", "fields"), [
    (["--inputs", "uniform"], {"inputs": "uniform"}),
    (["--inputs", "laplace"], {"inputs": "laplace"}),
    (["--outlier-channels", "3"], {"outlier_channels": 3}),
    (["--outlier-channels", "3", "--outlier-scale", "2.5"],
     {"outlier_channels": 3, "outlier_scale": 2.5}),
    (["--data-seed", "7"], {"data_seed": 7}),
])
def test_matmul_options_are_the_workload_fields(tmp_path, options, fields):
    """Each --matmul option sets the MatmulWorkload field of its name: the
    manifest holds that workload, and every run's metrics are its run(config,
    seed) computed here, which the default workload's are not."""
    out = tmp_path / "s"
    assert main([*SMALL, "--out", str(out), *options]) == 0
    workload = optical.MatmulWorkload(16, 64, 32, **fields)
    assert _stored_workload(out) == json.loads(json.dumps(workload.to_dict()))
    frame = load(out)
    _assert_runs_are(frame, workload.run, BASE, ["adc.bits"])
    default = optical.MatmulWorkload(16, 64, 32).run(BASE.replace({"adc.bits": 6}), 0)
    assert frame["sqnr_db"].iloc[0] != default["sqnr_db"]


@pytest.mark.parametrize(("options", "digital"), [
    ([], 0),
    (["--outlier-channels", "3"], 3),
    (["--outlier-channels", "5", "--outlier-scale", "50"], 5),
    (["--outlier-channels", "3", "--outlier-scale", "2"], 0),
])
def test_outlier_channels_over_the_threshold_go_around_the_optics(tmp_path, options, digital):
    """iris-like sends around the optics the input channels whose abs-max
    exceeds 6x the median channel's (outliers.threshold). A Gaussian channel's
    abs-max over 16 tokens is about 2 (1 to 4): channels scaled by 20 (the
    default --outlier-scale) or 50 are all over 12, channels scaled by 2 all under."""
    assert BASE.outliers.policy == "static" and BASE.outliers.threshold == 6
    out = tmp_path / "s"
    assert main([*SMALL, "--out", str(out), *options]) == 0
    frame = load(out)
    assert (frame["digital_channels"] == digital).all()
    assert (frame["digital_macs"] == 16 * digital * 32).all()
    assert (frame["digital_mac_fraction"] == digital / 64).all()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.transformer_helpers import TINY_LLAMA, write_model

    return write_model(tmp_path_factory.mktemp("tiny"), TINY_LLAMA)


def test_model_sweep_validates_the_layer_and_weights_asked_for(tiny_model, tmp_path):
    """--model DIR --layer L --weights-seed W: each run is layer_metrics of
    transformer.validate of layer L of DIR loaded with seed W, at the run's
    noise seed; defaults layer 0, weights seed 0."""
    from optical import transformer
    from optical.workloads import LayerWorkload, layer_metrics

    base = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
    argv = ["sweep", "--model", str(tiny_model), "--tokens", "6", "--set", "core.inputs=48",
            "--set", "core.outputs=40", "--jobs", "1", "--quiet"]

    def validate(layer, weights_seed):
        model = transformer.load(tiny_model, seed=weights_seed)
        return lambda config, seed: layer_metrics(transformer.validate(
            model, layer=layer, tokens=6, config=config, seed=seed))

    out = tmp_path / "s"
    assert main([*argv, "--layer", "2", "--weights-seed", "5", "--param", "adc.bits=6,8",
                 "--seeds", "2", "--out", str(out)]) == 0
    assert _stored_workload(out) == LayerWorkload(str(tiny_model), layer=2, tokens=6,
                                                  weights_seed=5).to_dict()
    frame = load(out)
    assert len(frame) == 4
    _assert_runs_are(frame, validate(2, 5), base, ["adc.bits"])
    first = base.replace({"adc.bits": 6})
    for layer, weights_seed in ((1, 5), (2, 0)):  # another layer, other weights
        assert validate(layer, weights_seed)(first, 0)["sqnr_db"] != frame["sqnr_db"].iloc[0]

    out = tmp_path / "defaults"
    assert main([*argv, "--out", str(out)]) == 0
    assert _stored_workload(out) == LayerWorkload(str(tiny_model), layer=0, tokens=6).to_dict()
    _assert_runs_are(load(out), validate(0, 0), base, [])


def test_a_model_sweep_s_defaults_are_its_help_s(tmp_path):
    """`--model DIR` alone: layer 0, 512 tokens (validate's default is 256),
    weights seed 0, each run's seed its data seed, one seed, iris-like."""
    from optical.commands.sweep import _definition

    args = build_parser().parse_args(["sweep", "--model", "models/llama-3.2-1b", "--out",
                                      str(tmp_path / "s")])
    definition = _definition(args)
    workload = definition.workload
    assert (workload.layer, workload.tokens, workload.weights_seed, workload.local,
            workload.data_seed) == (0, 512, 0, False, None)
    assert definition.seeds == (0,) and definition.base == optical.presets.get("iris-like")
    assert not (tmp_path / "s").exists()  # a definition only: nothing run, nothing written


def test_model_sweep_data_seed_gives_every_seed_the_same_input(tiny_model, tmp_path):
    """--data-seed D with --model: the workload validates with data_seed=D,
    so on a machine without noise every seed gives the same figures (each
    seed's own input gave others), and each run is validate(seed, data_seed=D)."""
    from optical.workloads import LayerWorkload

    argv = ["sweep", "--model", str(tiny_model), "--tokens", "6", "--preset", "ideal",
            "--set", "core.inputs=48", "--set", "core.outputs=40", "--param", "mask.bits=4,6",
            "--seeds", "2", "--jobs", "1", "--quiet"]
    held, free = tmp_path / "held", tmp_path / "free"
    assert main([*argv, "--data-seed", "3", "--out", str(held)]) == 0
    assert main([*argv, "--out", str(free)]) == 0
    workload = LayerWorkload(str(tiny_model), layer=0, tokens=6, data_seed=3)
    assert _stored_workload(held) == workload.to_dict()
    assert "data_seed" not in _stored_workload(free)  # a sweep without it: as before
    base = optical.presets.get("ideal").replace({"core.inputs": 48, "core.outputs": 40})
    _assert_runs_are(load(held), workload.run, base, ["mask.bits"])
    for out, same in ((held, True), (free, False)):
        by_seed = load(out).pivot(index="mask.bits", columns="seed", values="sqnr_db")
        assert (by_seed[0] == by_seed[1]).all() == same, out.name


def test_model_sweep_local_records_each_products_own_error(tiny_model, tmp_path):
    """--local: the workload validates with local=True, so the table gains
    local_sqnr_db.<product> columns (refused with --matmul, which has no
    upstream: test_malformed_options_fail_before_any_work)."""
    from optical.workloads import LayerWorkload

    out = tmp_path / "s"
    assert main(["sweep", "--model", str(tiny_model), "--tokens", "6", "--set",
                 "core.inputs=48", "--set", "core.outputs=40", "--param", "adc.bits=6",
                 "--local", "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    workload = LayerWorkload(str(tiny_model), layer=0, tokens=6, local=True)
    assert _stored_workload(out) == workload.to_dict()
    base = optical.presets.get("iris-like").replace({"core.inputs": 48, "core.outputs": 40})
    _assert_runs_are(load(out), workload.run, base, ["adc.bits"])
    assert "local_sqnr_db.down_proj" in load(out).columns


RANDOM = ["sweep", "--matmul", "16x64x32", "--param", "source.photons_per_mac=1e3:1e6:log",
          "--param", "adc.bits=4,6,8", "--set", "core.inputs=32", "--jobs", "1", "--quiet"]


@pytest.mark.parametrize(("samples", "sample_seed"), [(5, None), (7, 3)])
def test_samples_are_the_python_api_s_random_points(tmp_path, capsys, samples, sample_seed):
    """--samples N [--sample-seed S]: the table of optical.sweep(..., samples=N,
    sample_seed=S) (default 0): N points (a continuous range never draws a
    point twice), photons per MAC in [1e3, 1e6], bits from the list; the same
    options again are the same sweep (all resumed)."""
    from optical.sweep import Range

    options = ["--samples", str(samples)]
    options += [] if sample_seed is None else ["--sample-seed", str(sample_seed)]
    out = tmp_path / "cli"
    assert main([*RANDOM, *options, "--out", str(out)]) == 0
    frame = load(out)
    expected = optical.sweep(optical.MatmulWorkload(16, 64, 32),
                             {"source.photons_per_mac": Range(1e3, 1e6, log=True),
                              "adc.bits": [4, 6, 8]},
                             seeds=1, base=BASE, samples=samples, sample_seed=sample_seed or 0,
                             out=tmp_path / "api", executor="serial", progress=False)
    pd.testing.assert_frame_equal(frame.drop(columns=["elapsed_s", "finished_at"]),
                                  expected.drop(columns=["elapsed_s", "finished_at"]))
    definition = json.loads((out / "manifest.json").read_text())["definition"]
    assert (definition["sampling"], definition["samples"], definition["sample_seed"]) == \
        ("random", samples, sample_seed or 0)
    assert len(frame) == samples and frame["source.photons_per_mac"].between(1e3, 1e6).all()
    assert set(frame["adc.bits"]) <= {4, 6, 8}
    capsys.readouterr()
    assert main([*RANDOM, *options, "--out", str(out), "--json", "-"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["already_done"], summary["ran"]) == (samples, 0)


def test_sample_seed_draws_other_points(tmp_path):
    photons = []
    for sample_seed in ("0", "3"):
        out = tmp_path / sample_seed
        assert main([*RANDOM, "--samples", "5", "--sample-seed", sample_seed,
                     "--out", str(out)]) == 0
        photons.append(set(load(out)["source.photons_per_mac"]))
    assert photons[0].isdisjoint(photons[1])


def test_samples_of_a_list_are_its_distinct_draws(tmp_path):
    """Identical draws are one point: 20 draws from 3 values give those 3 points
    (all 3 drawn but with probability 3 (2/3)**20 < 0.1%)."""
    out = tmp_path / "s"
    assert main(["sweep", "--matmul", "16x64x32", "--param", "adc.bits=4,6,8", "--samples",
                 "20", "--set", "core.inputs=32", "--jobs", "1", "--quiet",
                 "--out", str(out)]) == 0
    frame = load(out)
    assert sorted(frame["adc.bits"]) == [4, 6, 8] and frame["point"].tolist() == [0, 1, 2]


@contextlib.contextmanager
def _listening():
    """A TCP server socket on a free local port, listening, and its address
    as --scheduler takes it."""
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server, f"tcp://127.0.0.1:{server.getsockname()[1]}"


def test_a_scheduler_port_that_never_answers_is_one_line_not_a_hang(tmp_path, capsys,
                                                                     monkeypatch):
    """Something accepts the connection and says nothing (the dashboard's port
    given for the scheduler's, say): Client's timeout covers the connect
    only, and the sweep hung for good."""
    import time

    pytest.importorskip("distributed")
    from optical.commands import sweep as sweep_command

    monkeypatch.setattr(sweep_command, "SCHEDULER_TIMEOUT_S", 1)
    with _listening() as (server, address):
        out = tmp_path / "s"
        argv = [a for a in SWEEP if a not in ("--jobs", "1")]
        start = time.monotonic()
        assert main([*argv, "--out", str(out), "--scheduler", address]) == 1
        assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert err.startswith(f"optical sweep: error: --scheduler {address}: no Dask scheduler "
                          "answered within 1 s")
    assert "Traceback" not in err


@pytest.mark.parametrize("banner", [b"HTTP/1.1 400 Bad Request\r\n\r\n",
                                    b"SSH-2.0-OpenSSH_9.6\r\n"])
def test_a_scheduler_port_that_speaks_something_else_is_one_line_naming_it(
        tmp_path, capsys, monkeypatch, banner):
    """A port that answers first in another protocol (the epilog's example
    address hit a proxy's): Dask read its bytes as a frame length, asked for
    3 EiB, and the sweep said "out of memory"."""
    pytest.importorskip("distributed")
    from optical.commands import sweep as sweep_command

    monkeypatch.setattr(sweep_command, "SCHEDULER_TIMEOUT_S", 5)
    with _listening() as (server, address):

        def talk():
            with contextlib.suppress(OSError):
                connection, _ = server.accept()
                with connection:
                    connection.sendall(banner)
                    connection.recv(1 << 16)  # until the client gives up

        thread = threading.Thread(target=talk, daemon=True)
        thread.start()
        out = tmp_path / "s"
        argv = [a for a in SWEEP if a not in ("--jobs", "1")]
        assert main([*argv, "--out", str(out), "--scheduler", address]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"optical sweep: error: --scheduler {address}: ")
    assert "out of memory" not in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def _table(out):
    return load(out).drop(columns=["elapsed_s", "finished_at"]).sort_values(["adc.bits", "source.photons_per_mac",
                                                              "seed"]).reset_index(drop=True)


def test_a_full_disk_names_the_file_keeps_finished_runs_and_resumes(tmp_path, capsys,
                                                                    monkeypatch):
    """A write that fails (ENOSPC) stops the sweep with exit 1, naming the run
    file, leaving no temporary file, and saying how to resume; the resumed
    sweep equals one that never stopped."""
    import errno
    from pathlib import Path

    real_write = Path.write_text
    written = []

    def filling(self, text, *args, **kwargs):
        if self.parent.name == "runs":
            if len(written) == 3:
                raise OSError(errno.ENOSPC, "No space left on device")
            written.append(self)
        return real_write(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", filling)
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{out / 'runs'}/" in err and ".json: No space left on device while writing it; " \
        f"finished runs are kept in {out}; run `optical sweep --out {out}` to resume" in err
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(
        p.name.split(".")[1] + ".json" for p in written)  # 3 runs, no temporary file
    monkeypatch.setattr(Path, "write_text", real_write)
    assert main(["sweep", "--out", str(out), "--json", str(tmp_path / "r.json")]) == 0
    assert json.loads((tmp_path / "r.json").read_text())["already_done"] == 3
    assert main([*SWEEP, "--out", str(tmp_path / "whole")]) == 0
    pd.testing.assert_frame_equal(_table(out), _table(tmp_path / "whole"))


def test_a_full_disk_before_the_manifest_advises_the_whole_command(tmp_path, capsys,
                                                                   monkeypatch):
    """The disk filling as the manifest is written: the error said to run
    `optical sweep --out DIR`, which finds no sweep there to resume (exit
    2); it now says to run the whole command again, which completes it."""
    import errno
    from pathlib import Path

    real_write = Path.write_text

    def full(self, text, *args, **kwargs):
        if self.name.startswith(".manifest.json."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, text, *args, **kwargs)

    out = tmp_path / "s"
    monkeypatch.setattr(Path, "write_text", full)
    assert main([*SWEEP, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "manifest.json: No space left on device while writing it" in err
    assert "run the same `optical sweep` command (workload, --param, ... and --out) again " \
           "to resume" in err and f"--out {out}`" not in err
    monkeypatch.setattr(Path, "write_text", real_write)
    assert main(["sweep", "--out", str(out)]) == 2  # what the old advice ran
    assert "no sweep manifest" in capsys.readouterr().err
    assert main([*SWEEP, "--out", str(out)]) == 0  # what the advice says now


def test_a_reader_that_left_while_the_table_prints_is_not_a_failed_sweep(tmp_path, capsys,
                                                                          monkeypatch):
    """`optical sweep ... | head`: the broken pipe is the CLI's quiet exit 1,
    not an error telling the user to resume a sweep that finished."""
    from optical.commands import sweep as command

    def gone(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(command, "_print_table", gone)
    assert main([*[a for a in SWEEP if a != "--quiet"], "--out", str(tmp_path / "s")]) == 1
    assert "error" not in capsys.readouterr().err
    assert len(load(tmp_path / "s")) == 8


def test_the_resume_hint_is_quoted_for_the_shell(tmp_path, capsys, monkeypatch):
    import shlex

    from optical import workloads

    real = workloads.MatmulWorkload.run
    calls = []

    def interrupted(self, config, seed):
        calls.append(seed)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, config, seed)

    monkeypatch.setattr(workloads.MatmulWorkload, "run", interrupted)
    out = tmp_path / "a dir with space" / "s"
    assert main([*SWEEP, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    command = err.split("`")[1]
    assert shlex.split(command) == ["optical", "sweep", "--out", str(out)]


def test_plot_refuses_a_json_path_that_is_its_figure_and_writes_each_format_once(tmp_path,
                                                                                capsys,
                                                                                monkeypatch):
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    capsys.readouterr()
    base = ["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db", "--where",
            "source.photons_per_mac=1e6"]
    fig = tmp_path / "fig.png"
    assert main([*base, "--output", str(fig), "--json", str(fig)]) == 2
    assert "is also the figure" in capsys.readouterr().err and not fig.exists()
    # The same file spelt another way: relative against absolute, through "..".
    monkeypatch.chdir(tmp_path)
    for figure, json_path in (("fig.png", str(fig)), (str(fig), "s/../fig.png")):
        assert main([*base, "--output", figure, "--json", json_path]) == 2
        assert "is also the figure" in capsys.readouterr().err and not fig.exists()
    assert main([*base, "--output", str(tmp_path / "two"), "--formats", "png,svg,png",
                 "--json", str(tmp_path / "p.json")]) == 0
    files = json.loads((tmp_path / "p.json").read_text())["files"]
    assert files == [str(tmp_path / "two.png"), str(tmp_path / "two.svg")]
    # Without --output the figure goes to DIR/plots/<name>.png and .svg: a
    # --json naming either is refused too, before it replaces the figure.
    assert main([*base, "--json", str(tmp_path / "d.json")]) == 0
    default = [Path(f) for f in json.loads((tmp_path / "d.json").read_text())["files"]]
    assert [f.parent for f in default] == [out / "plots"] * 2
    assert [f.suffix for f in default] == [".png", ".svg"]
    for figure in default:
        figure.unlink()
        assert main([*base, "--json", str(figure)]) == 2
        assert "is also the figure" in capsys.readouterr().err and not figure.exists()


def test_plot_refuses_a_json_path_hard_linked_to_its_figure(tmp_path, capsys):
    """A --json file with another hard link is written in place (a new file
    would break the link): one that is a hard link of the figure is the
    figure under another name, which resolving the paths does not see, and
    the JSON replaced it."""
    out = tmp_path / "s"
    assert main([*SWEEP, "--out", str(out)]) == 0
    fig = tmp_path / "fig.png"
    base = ["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db", "--where",
            "source.photons_per_mac=1e6", "--output", str(fig)]
    assert main(base) == 0
    figure = fig.read_bytes()
    os.link(fig, tmp_path / "fig-link.json")
    capsys.readouterr()
    assert main([*base, "--json", str(tmp_path / "fig-link.json")]) == 2
    assert f"--json {tmp_path / 'fig-link.json'}: is also the figure {fig}" in \
        capsys.readouterr().err
    assert fig.read_bytes() == figure


def test_a_sweep_from_a_config_file_is_the_sweep_of_its_preset(tmp_path):
    """--config FILE stands for the preset and overrides it was written from:
    the same runs, configs and numbers."""
    config = tmp_path / "machine.json"
    assert main(["config", "--preset", "iris-like", "--set", "core.inputs=32",
                 "--json", str(config)]) == 0
    grid = ["sweep", "--matmul", "8x64x16", "--param", "adc.bits=4,8", "--jobs", "1",
            "--quiet", "--format", "csv"]
    assert main([*grid, "--preset", "iris-like", "--set", "core.inputs=32",
                 "--out", str(tmp_path / "p")]) == 0
    assert main([*grid, "--config", str(config), "--out", str(tmp_path / "f")]) == 0
    by_preset, by_file = load(tmp_path / "p"), load(tmp_path / "f")
    for column in ("run_id", "config", "sqnr_db"):
        assert by_file[column].tolist() == by_preset[column].tolist()


def test_plot_where_takes_spaces_around_the_path(tmp_path):
    pytest.importorskip("matplotlib")
    from optical.cli import build_parser
    from optical.commands.plot import make_figure
    from tests.test_sweep_store_contracts import _Toy

    out = tmp_path / "s"
    optical.sweep(_Toy(), {"adc.bits": [4, 6], "adc.headroom": [2.0, 4.0]}, seeds=1, out=out,
                  base=BASE, executor="serial", progress=False, results_format="csv")
    figures = {}
    for where in ("adc.headroom=4", " adc.headroom = 4"):
        args = build_parser().parse_args(["plot", str(out), "--x", "adc.bits", "--y", "m",
                                          "--where", where])
        fig, name = make_figure(load(out), args)
        figures[where] = (name, fig.axes[0].lines[0].get_ydata().tolist())
    assert figures["adc.headroom=4"] == figures[" adc.headroom = 4"]
    assert figures["adc.headroom=4"][1] == [0.04, 0.06]
