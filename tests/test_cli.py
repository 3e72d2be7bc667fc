import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import optical
from optical.cli import build_parser, main


def test_config_command_applies_overrides_and_writes_json(tmp_path, capsys):
    out = tmp_path / "cfg.json"
    assert main(["config", "--preset", "iris-like", "--set", "adc.bits=6", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert optical.OpticalConfig.from_dict(data) == optical.presets.get("iris-like").replace(
        {"adc.bits": 6})
    assert "adc.bits" in capsys.readouterr().out


COMMANDS_VALIDATE = ["validate", "--model", "models/llama-3.2-1b", "--tokens", "4", "--quiet"]


@pytest.mark.parametrize(("argv", "message"), [
    (["config", "--set", "adc.bitz=6"], "unknown config path 'adc.bitz'"),
    (["config", "--set", "adc.bits=six"], "adc.bits: cannot parse 'six'"),
    # --param's comma list given to --set: not its first value.
    (["config", "--set", "adc.bits=4,6"], "adc.bits: cannot parse '4,6'"),
    (["config", "--set", "adc.bits=6.9"], "adc.bits: cannot parse '6.9'"),
    (["config", "--set", "adc.bits="], "adc.bits: cannot parse ''"),
    (["config", "--set", "adc.bits"], "expected PATH=VALUE"),
    (["config", "--preset", "nope"], "unknown preset 'nope'"),
    (["config", "--set", "adc.bits=6", "--set", " adc.bits=8"],
     "--set adc.bits: given twice; set each path once"),
    (["config", "--set", "source.photons_per_mac=1e400"],
     "source.photons_per_mac: '1e400' overflows a float (write inf for infinity)"),
    (["config", "--set", "source.photons_per_mac=1e-400"],
     "source.photons_per_mac: '1e-400' underflows to 0"),
    (["energy", "--model", "models/all-minilm-l6-v2", "--prompt-tokens", "513"],
     "--prompt-tokens: 513 exceed max_position_embeddings 512"),
    # Named as the option, not as load()'s `seed` (walkthrough audit).
    ([*COMMANDS_VALIDATE, "--weights-seed", "-2"],
     "--weights-seed: -2 is out of range; valid: integer in [0, 2**64)"),
    ([*COMMANDS_VALIDATE, "--seed", str(2**64)], f"--seed: {2**64} is out of range"),
    ([*COMMANDS_VALIDATE, "--layer", "-1"],
     "--layer: -1 is out of range; llama-3.2-1b has 16 layers (0..15)"),
    ([*COMMANDS_VALIDATE, "--layer", "16"],
     "--layer: 16 is out of range; llama-3.2-1b has 16 layers (0..15)"),
    (["sweep", "--matmul", "4x8x4", "--samples", "0", "--param", "adc.bits=4:8",
      "--out", "never-written"], "--samples: 0 must be a positive integer"),
    # The layer workload's checks, named as the sweep's options (were "layer: 99").
    (["sweep", "--model", "models/llama-3.2-1b", "--layer", "99", "--param", "adc.bits=4",
      "--out", "never-written"], "error: --layer: 99 is out of range; llama-3.2-1b has 16 layers "
                                 "(0..15)"),
    # -1 was "must be a non-negative integer" here, "out of range" in validate.
    (["sweep", "--model", "models/llama-3.2-1b", "--layer", "-1", "--param", "adc.bits=4",
      "--out", "never-written"], "error: --layer: -1 is out of range; llama-3.2-1b has 16 layers "
                                 "(0..15)"),
    (["sweep", "--model", "models/llama-3.2-1b", "--tokens", "0", "--param", "adc.bits=4",
      "--out", "never-written"], "error: --tokens: 0 must be a positive integer"),
    (["sweep", "--matmul", "4x8x4", "--param", "source.photons_per_mac=10:1e5:log", "--out",
      "never-written"],
     "a Range needs random sampling (samples=N; CLI: --samples N)"),
])
def test_bad_options_fail_with_one_clear_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_top_level_help_is_the_usage_and_exit_0(capsys):
    for flag in ("--help", "-h"):
        with pytest.raises(SystemExit) as done:
            main([flag])
        assert done.value.code == 0
        printed = capsys.readouterr()
        assert printed.out.startswith("usage: optical") and printed.err == ""
        assert all(c in printed.out for c in ("validate", "sweep", "energy", "plot", "config"))


def test_the_help_names_the_error_lines_the_commands_print(capsys):
    """The help's exit statuses say how an error line begins: "optical
    COMMAND: error:" for a command's, "optical: error:" before a command is
    known (the help gave only the first, a review found)."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "'optical COMMAND: error: ...'" in text and "'optical: error: ...'" in text
    with pytest.raises(SystemExit) as done:
        main(["--frob", "config"])
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("optical: error: ")
    assert main(["config", "--set", "adc.bits=frob"]) == 2
    assert capsys.readouterr().err.startswith("optical config: error: ")


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_sigterm_mid_write_is_one_line_and_leaves_no_temporary_file(tmp_path, signame):
    """A backlog audit: SIGTERM to `optical plot`, `validate --json` or
    `energy --json` died silently and left a hidden `.NAME.<pid>.<...>.tmp`
    beside the output (Python's default action skips the cleanup). Run as
    the program, every command but sweep (which says where to resume) now
    takes it as an exit: one line, status 143, the temporary removed, the old
    output kept. SIGHUP (the terminal closed) the same, status 129 (it still
    left the file, six stops on). (A child process: the signal is raised
    mid-write there.)"""
    import signal
    import subprocess
    import sys

    if not hasattr(signal, signame):  # pragma: no cover (Windows has no SIGHUP)
        pytest.skip(f"no {signame} on this platform")
    out = tmp_path / "config.json"
    out.write_text("old\n")
    code = ("import pathlib, signal, sys\n"
            # (as a terminal would: `nohup make test` leaves SIGHUP ignored)
            "if hasattr(signal, 'SIGHUP'): signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
            "real = pathlib.Path.write_text\n"
            "def terminated_half_way(self, text, *args, **kwargs):\n"
            "    real(self, text[:10], *args, **kwargs)\n"
            f"    signal.raise_signal(signal.{signame})\n"
            "pathlib.Path.write_text = terminated_half_way\n"
            f"sys.argv = ['optical', 'config', '--json', {str(out)!r}]\n"
            "from optical.cli import main\n"
            "sys.exit(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 128 + getattr(signal, signame), done.stderr
    assert done.stderr == f"optical config: terminated ({signame})\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]
    assert out.read_text() == "old\n"
    # Started with stderr closed (2>&-): the same status, nothing on stdout
    # (a review: the one line's print raised there, and the command exited 1).
    done = subprocess.run(["sh", "-c", 'exec "$0" -c "$1" 2>&-', sys.executable, code],
                          stdout=subprocess.PIPE, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (128 + getattr(signal, signame), "")
    assert out.read_text() == "old\n"


def test_main_called_from_python_leaves_sigterm_to_the_caller(monkeypatch):
    """A review: main() from Python took SIGTERM as an exit too, and a handler's
    exception raised inside JAX's garbage-collection callback is dropped by
    Python, so validate ran on and returned 0 (3 of 5 timed kills). From
    Python the command runs under the caller's SIGTERM handling, untouched."""
    import signal

    from optical.commands import config

    seen = []

    def records_the_handler(args):
        seen.append(signal.getsignal(signal.SIGTERM))
        return 0

    monkeypatch.setattr(config, "run", records_the_handler)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["config"]) == 0
    assert seen == [before]


def test_a_leading_tilde_in_a_path_option_is_the_home_directory(tmp_path, monkeypatch,
                                                                 capsys):
    """An environment audit: `~` was expanded in a sweep's --model only, so
    `--model=~/models/x` (which a shell leaves as it is after `=`) was "no
    such directory" for validate and energy, and `--json=~/r.json` wrote
    into a directory named "~". Every path option expands it; a `~user` with
    no such user stays as given."""
    import shutil

    home = tmp_path / "home"
    (home / "models").mkdir(parents=True)
    shutil.copytree("models/llama-3.2-1b", home / "models" / "m")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert main(["energy", "--model=~/models/m", "--prompt-tokens", "8", "--preset",
                 "iris-like", "--json=~/energy.json"]) == 0
    assert json.loads((home / "energy.json").read_text())["prompt_tokens"] == 8
    assert main(["validate", "--model=~/models/m", "--tokens", "2", "--quiet", "--preset",
                 "ideal", "--json=~/v.json"]) == 0
    assert json.loads((home / "v.json").read_text())["model_dir"] == \
        str((home / "models" / "m").resolve())
    assert not (tmp_path / "~").exists()
    capsys.readouterr()
    assert main(["energy", "--model=~no-such-user-here/m", "--prompt-tokens", "8"]) == 2
    assert "~no-such-user-here/m" in capsys.readouterr().err
    # a sweep's layer workload too (Path.expanduser raised RuntimeError there)
    assert main(["sweep", "--model=~no-such-user-here/m", "--out", "s", "--quiet"]) == 2
    assert "~no-such-user-here/m: no such model directory" in capsys.readouterr().err
    # a directory named "~" (./~/s) is resumed as ./~/s, not as the home's s
    from optical.commands.sweep import _resume_command

    (tmp_path / "~" / "s").mkdir(parents=True)
    (tmp_path / "~" / "s" / "manifest.json").write_text("{}")
    resume = _resume_command(build_parser().parse_args(["sweep", "--out", "./~/s"]).out)
    assert resume == "`optical sweep --out './~/s'`"  # (quoted: ~ is literal there)
    # and "-s" (given as ./-s) as ./-s, which argparse does not take for an option
    (tmp_path / "-s").mkdir()
    (tmp_path / "-s" / "manifest.json").write_text("{}")
    resume = _resume_command(build_parser().parse_args(["sweep", "--out", "./-s"]).out)
    assert resume == "`optical sweep --out ./-s`"
    assert build_parser().parse_args(["sweep", "--out", "./-s"]).out.name == "-s"


def test_the_heading_names_the_preset_and_every_override():
    """Two --set overrides: "ideal + adc.bits=6, dac.bits=6", as the JSON's
    overrides list them."""
    from optical.commands._common import config_label, config_source

    args = build_parser().parse_args([*COMMANDS_VALIDATE, "--preset", "ideal",
                                      "--set", "adc.bits=6", "--set", "dac.bits=6"])
    assert config_source(args)["overrides"] == ["adc.bits=6", "dac.bits=6"]
    assert config_label(args) == "ideal + adc.bits=6, dac.bits=6"


@pytest.mark.parametrize("exists", [True, False])
def test_an_unwritable_json_path_is_refused_before_any_work(tmp_path, monkeypatch, capsys,
                                                            exists):
    """Where this process may not write (as root, os.access is always true,
    so it is made to say no here): exit 2 before any work, naming --json and
    why, not a finished run lost to a failed write."""
    from optical.commands import _common
    from optical.commands import config as config_command

    target = tmp_path / "out.json"
    if exists:
        target.write_text("{}")
    monkeypatch.setattr(_common.os, "access", lambda path, mode: False)
    ran = []
    monkeypatch.setattr(config_command, "run", lambda args: ran.append(args) or 0)
    assert main(["config", "--json", str(target)]) == 2
    err = capsys.readouterr().err
    why = (f"--json {target}: not writable (permission denied)" if exists else
           f"--json {target}: cannot create it in {tmp_path} (permission denied)")
    assert why in err and not ran
    # On a file system mounted read-only, that is the reason given (an
    # environment audit: "permission denied" sent the user to the modes).
    real = os.statvfs(tmp_path)
    monkeypatch.setattr(_common.os, "statvfs", lambda path: os.statvfs_result(
        (*real[:8], real.f_flag | os.ST_RDONLY, *real[9:])))
    assert main(["config", "--json", str(target)]) == 2
    assert why.replace("permission denied", "a read-only file system") in \
        capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["validate", "--tokens", "4", "--quiet", "--preset", "ideal"],
    ["energy", "--prompt-tokens", "8"],
    ["sweep", "--tokens", "4", "--param", "adc.bits=4,6", "--jobs", "1", "--quiet"]])
@pytest.mark.parametrize("target", ["config.json", "model.safetensors",
                                    # not there yet: written, they would be read (or named)
                                    "model-00002-of-00002.safetensors", "pytorch_model.bin"])
def test_json_onto_a_file_of_the_model_is_refused(command, target, tmp_path, capsys):
    # The report would replace the config or the weights, and the model is gone.
    from tests.transformer_helpers import TINY_LLAMA, random_llama_tensors, write_model

    model = write_model(tmp_path / "m", TINY_LLAMA, random_llama_tensors(TINY_LLAMA))
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    out = ["--out", str(tmp_path / "s")] if command[0] == "sweep" else []
    argv = [command[0], "--model", str(model), *command[1:], *out]
    assert main([*argv, "--json", str(model / target)]) == 2
    err = capsys.readouterr().err
    assert f"--json {model / target}: a file of the model in {model}" in err
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
    assert not (tmp_path / "s").exists()  # refused before anything ran
    if target == "config.json" and command[0] == "sweep":  # another file of it is fine
        assert main([*argv, "--json", str(model / "report.json")]) == 0


def test_json_onto_the_model_of_a_resumed_sweep_is_refused(tmp_path, capsys):
    # `optical sweep --out DIR` alone resumes the sweep of its manifest's
    # --model: that model's files are as much refused.
    from tests.transformer_helpers import TINY_LLAMA, random_llama_tensors, write_model

    model = write_model(tmp_path / "m", TINY_LLAMA, random_llama_tensors(TINY_LLAMA))
    out = tmp_path / "s"
    assert main(["sweep", "--model", str(model), "--tokens", "4", "--param", "adc.bits=4,6",
                 "--jobs", "1", "--quiet", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    assert main(["sweep", "--out", str(out), "--jobs", "1", "--quiet",
                 "--json", str(model / "config.json")]) == 2
    assert (f"--json {model / 'config.json'}: a file of the model in {model} (the model of "
            f"the sweep in {out})") in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


def test_a_reader_that_left_ends_the_command_quietly(monkeypatch, capsys):
    # `optical energy ... | head -3`: once the reader has gone, a write fails
    # with EPIPE; no error line, exit 1 (Python's "Note on SIGPIPE"). capsys,
    # not capfd: the command points fd 1 at devnull, which under capfd is
    # pytest's own capture file (pytest < 9.2 then lost all its output).
    from optical.commands import config as config_command

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(config_command, "run", closed_pipe)
    assert main(["config"]) == 1
    assert "error" not in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["config"], ["--help"], ["config", "--json", "-"]])
def test_a_reader_gone_before_the_exit_flush_is_quiet(argv):
    # `optical config | head -0` with stdout block-buffered (a pipe, no
    # PYTHONUNBUFFERED): the write fails at the interpreter's last flush,
    # after main() returned ("Exception ignored ..." and exit 120), unless
    # main() flushes inside its own handler. Also runs `python -m optical`.
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    try:
        done = subprocess.run([sys.executable, "-m", "optical", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, env=env, timeout=120)
    finally:
        os.close(write)
    assert done.stderr == ""
    assert done.returncode == 1  # as an EPIPE inside a command (Python's "Note on SIGPIPE")


class GonePipe:
    """stdout once its reader has left, unbuffered (python -u): every write fails."""

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass

    def fileno(self):
        raise OSError("no descriptor")


def test_a_reader_gone_loses_no_json_report(tmp_path, monkeypatch):
    # `optical validate ... --json r.json | head -1` with stdout unbuffered
    # (python -u, PYTHONUNBUFFERED): the table's print fails, and the report
    # computed before it must still reach r.json.
    import sys

    from tests.transformer_helpers import TINY_LLAMA, random_llama_tensors, write_model

    model = write_model(tmp_path / "m", TINY_LLAMA, random_llama_tensors(TINY_LLAMA))

    monkeypatch.setattr(sys, "stdout", GonePipe())
    for command in (["validate", "--model", str(model), "--tokens", "4", "--quiet"],
                    ["energy", "--model", str(model), "--prompt-tokens", "4"]):
        report = tmp_path / f"{command[0]}.json"
        assert main([*command, "--json", str(report)]) == 1
        assert json.loads(report.read_text())["config"]  # whole, and the run's


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), MemoryError("Unable to allocate 512. GiB"),
                                  RuntimeWarning("numba finds no writable directory")])
def test_ctrl_c_and_out_of_memory_are_one_line_not_a_traceback(stop, monkeypatch, capsys):
    # main()'s contract: one line on stderr, never a traceback; Ctrl-C exits
    # 130 (128 + SIGINT), as `optical sweep` does. A warning raised as an
    # error (`python -W error -m optical`, numba without a cache directory:
    # an environment audit saw its traceback) is one line too.
    import warnings

    from optical.commands import config as config_command

    def stopped(args):
        if isinstance(stop, Warning):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                warnings.warn(str(stop), type(stop), stacklevel=1)
        raise stop

    monkeypatch.setattr(config_command, "run", stopped)
    try:
        code = main(["config"])
    except BaseException as err:  # what Python would print as a traceback
        pytest.fail(f"{type(err).__name__} escaped main(): a traceback")
    assert code == (130 if isinstance(stop, KeyboardInterrupt) else 1)
    err = capsys.readouterr().err
    assert err.startswith("optical config: ") and err.count("\n") == 1
    if isinstance(stop, Warning):  # and where it was raised, as a traceback said
        assert err.startswith("optical config: error: RuntimeWarning: numba finds no writable")
        assert err.rstrip().endswith(f"raised as an error by the warnings filter, at "
                                     f"{__file__}:{stopped.__code__.co_firstlineno + 4})")


def test_an_abbreviated_option_is_refused(tmp_path, capsys):
    # validate --seed N is one seed; sweep --seeds N is N of them. argparse's
    # prefix matching made `sweep --seed 5` mean --seeds 5 (seeds 0..4).
    out = tmp_path / "s"
    with pytest.raises(SystemExit) as done:  # argparse's own error: usage, exit 2
        main(["sweep", "--matmul", "4x8x4", "--param", "adc.bits=4", "--seed", "5",
              "--jobs", "1", "--quiet", "--out", str(out)])
    assert done.value.code == 2
    assert "unrecognized arguments: --seed" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0
                         and os.path.isdir("/sys/kernel")),
                    reason="needs root and sysfs: os.access says yes to root where sysfs "
                           "refuses a new file")
def test_a_json_path_the_file_system_refuses_is_refused_before_any_work(capsys, monkeypatch):
    from optical.commands import config as config_command

    ran = []
    monkeypatch.setattr(config_command, "run", lambda args: ran.append(args) or 0)
    assert main(["config", "--json", "/sys/kernel/optical-test.json"]) == 2
    assert "--json /sys/kernel/optical-test.json: cannot create it in /sys/kernel" in \
        capsys.readouterr().err
    assert not ran


@pytest.mark.parametrize("name", ["manifest.json", "results.parquet", "runs/x.json"])
def test_json_into_the_sweep_s_own_files_is_refused(name, tmp_path, capsys):
    # It would overwrite them: a manifest replaced by the summary loses the sweep.
    out = tmp_path / "s"
    sweep = ["sweep", "--matmul", "4x8x4", "--param", "adc.bits=4,6", "--jobs", "1", "--quiet",
             "--out", str(out)]
    assert main([*sweep, "--json", str(out / name)]) == 2
    assert f"--json {out / name}: a file of the sweep in {out}" in capsys.readouterr().err
    assert not out.exists()  # nothing ran
    assert main(sweep) == 0
    manifest = (out / "manifest.json").read_text()
    assert main(["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db",
                 "--json", str(out / name)]) == 2
    assert (out / "manifest.json").read_text() == manifest
    assert main([*sweep, "--json", str(out / "summary.json")]) == 0  # another file: fine


def test_json_through_a_hard_link_to_a_sweep_or_model_file_is_refused(tmp_path, capsys):
    """An audit: a --json file with another hard link is written in place (a
    new file would break the link), so a hard link to the manifest, a run
    file or the model's config.json rewrote it, where the same target as a
    symlink was refused: the sweep could no longer be read, nor the model
    loaded."""
    from tests.transformer_helpers import TINY_LLAMA, write_model

    out = tmp_path / "s"
    sweep = ["sweep", "--matmul", "4x8x4", "--param", "adc.bits=4,6", "--jobs", "1", "--quiet",
             "--out", str(out)]
    assert main(sweep) == 0
    capsys.readouterr()
    run = next((out / "runs").iterdir())
    for name, original in [("manifest-link.json", out / "manifest.json"),
                           ("run-link.json", run)]:
        before = original.read_bytes()
        os.link(original, tmp_path / name)
        for argv in (sweep, ["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db"]):
            assert main([*argv, "--json", str(tmp_path / name)]) == 2
            assert f"--json {tmp_path / name}: a file of the sweep in {out}" in \
                capsys.readouterr().err
            assert original.read_bytes() == before
    model = write_model(tmp_path / "m", TINY_LLAMA)
    config = (model / "config.json").read_bytes()
    os.link(model / "config.json", tmp_path / "config-link.json")
    assert main(["validate", "--model", str(model), "--tokens", "4", "--quiet", "--json",
                 str(tmp_path / "config-link.json")]) == 2
    assert f"a file of the model in {model}" in capsys.readouterr().err
    assert (model / "config.json").read_bytes() == config
    # A hard link to nothing of theirs is written in place, as before.
    (tmp_path / "mine.json").write_text("{}")
    os.link(tmp_path / "mine.json", tmp_path / "mine-link.json")
    assert main([*sweep, "--json", str(tmp_path / "mine-link.json")]) == 0
    assert json.loads((tmp_path / "mine.json").read_text()) != {}


def test_a_sweep_whose_directory_cannot_be_written_is_plotted_with_output(tmp_path,
                                                                          monkeypatch, capsys):
    """A sweep read where it cannot be written (a read-only mount, another
    user's): plot's default figures in DIR/plots failed with the bare OS
    error; it now says --output writes them elsewhere."""
    import errno
    from pathlib import Path

    out = tmp_path / "s"
    assert main(["sweep", "--matmul", "4x8x4", "--param", "adc.bits=4,6", "--jobs", "1",
                 "--quiet", "--out", str(out)]) == 0
    mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):  # as root, permissions would not bind
        if str(self).startswith(str(out)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    plot = ["plot", str(out), "--x", "adc.bits", "--y", "sqnr_db"]
    assert main(plot) == 1
    assert capsys.readouterr().err == (f"optical plot: error: {out / 'plots'}: Read-only file "
                                       "system; give --output STEM to write the figure "
                                       "elsewhere\n")
    assert not (out / "plots").exists()
    assert main([*plot, "--output", str(tmp_path / "fig.png")]) == 0
    assert (tmp_path / "fig.png").stat().st_size > 0


def test_config_json_to_stdout_is_the_json_alone(capsys):
    assert main(["config", "--set", "adc.bits=6", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert optical.OpticalConfig.from_dict(data) == optical.presets.get("iris-like").replace(
        {"adc.bits": 6})
    # The whole config, every field written (a section left out would read back
    # as its defaults: the file to edit would not hold it).
    written = [f"{section}.{field}" for section, fields in data.items() for field in fields]
    assert sorted(written) == sorted(optical.OpticalConfig.paths())


def test_config_json_writes_infinities_as_strings_that_read_back(tmp_path):
    """Standard JSON has no infinity: the ideal machine's infinite photon count
    and contrast and its -inf RIN are written as "inf" / "-inf"."""
    out = tmp_path / "ideal.json"
    assert main(["config", "--preset", "ideal", "--json", str(out)]) == 0
    text = out.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert data["source"]["photons_per_mac"] == data["mask"]["contrast_ratio"] == "inf"
    assert data["source"]["rin_db_per_hz"] == "-inf"
    assert optical.OpticalConfig.from_dict(data) == optical.presets.get("ideal")


def test_command_json_writes_numpy_scalars_of_every_kind(tmp_path):
    """--json's writer is the run files' encoder: a long double (whose
    item() is a long double again: the commands' own copy recursed until
    RecursionError), a 0-d array, numpy ints and bools, non-finite values
    as strings; strict JSON."""
    from optical.commands._common import write_json

    out = tmp_path / "x.json"
    write_json(out, {"ld": np.longdouble(1.5), "zero_d": np.array(2.5), "i": np.int16(-3),
                     "b": np.bool_(True), "inf": np.float32(np.inf), "nan": math.nan,
                     "rows": (np.float64(-np.inf), [np.uint64(2**63)])})
    data = json.loads(out.read_text(),
                      parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert data == {"ld": 1.5, "zero_d": 2.5, "i": -3, "b": True, "inf": "inf", "nan": "nan",
                    "rows": ["-inf", [2**63]]}
    # What JSON cannot hold is refused by type, not recursed on or made a scalar
    # (a complex long double recursed; a one-element array read as its element).
    for value, kind in ((np.clongdouble(1 + 1j), "clongdouble"), (np.array([5.0]), "ndarray"),
                        (np.ma.masked, "MaskedConstant")):
        with pytest.raises(TypeError, match=f"Object of type {kind} is not JSON serializable"):
            write_json(out, {"v": value})


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_silencing_stdout_after_a_broken_pipe_leaks_no_descriptor(monkeypatch):
    """After a reader leaves, stdout is pointed at /dev/null; the descriptor
    opened for that was never closed (one more per broken pipe in a process
    that calls main() again and again)."""
    from optical import cli

    read, write = os.pipe()
    stream = os.fdopen(write, "w")
    monkeypatch.setattr(sys, "stdout", stream)
    try:
        before = sorted(os.listdir("/proc/self/fd"))
        cli._silence_stdout()
        cli._silence_stdout()
        assert sorted(os.listdir("/proc/self/fd")) == before
        assert os.readlink(f"/proc/self/fd/{write}") == os.devnull
    finally:
        stream.close()
        os.close(read)
    monkeypatch.setattr(sys, "stdout", None)  # closed when Python started (`>&-`)
    cli._silence_stdout()  # (AttributeError before: a traceback from the CLI)


#: Every command, cheap to start, with the options it needs.
COMMANDS = {
    "config": ["config"],
    "validate": ["validate", "--model", "models/llama-3.2-1b", "--tokens", "4"],
    "sweep": ["sweep", "--matmul", "4x8x4", "--jobs", "1", "--quiet"],
    "plot": ["plot", "nowhere", "--x", "adc.bits", "--y", "sqnr_db"],
    "energy": ["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "16"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("where", ["directory", "under a file"])
def test_unwritable_json_path_is_refused_before_any_work(command, where, tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    path = tmp_path if where == "directory" else tmp_path / "file" / "out.json"
    argv = [*COMMANDS[command], "--json", str(path)]
    if command == "sweep":
        argv += ["--out", str(tmp_path / "s")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    expected = "is a directory" if where == "directory" else f"{tmp_path / 'file'} is a file"
    assert err.startswith(f"optical {command}: error: --json {path}: ") and expected in err
    assert len(err.splitlines()) == 1 and capsys.readouterr().out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing ran
    assert (tmp_path / "file").read_text() == "mine"


def test_operating_system_errors_are_one_line(tmp_path, capsys, monkeypatch):
    from optical.commands import config as config_command

    def full_disk(path, data):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(config_command, "write_json", full_disk)
    assert main(["config", "--json", str(tmp_path / "cfg.json")]) == 1
    err = capsys.readouterr().err
    assert err == f"optical config: error: {tmp_path / 'cfg.json'}: No space left on device\n"


def test_set_takes_spaces_around_its_path_and_value(capsys):
    assert main(["config", "--set", " adc.bits = 6 ", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["adc"]["bits"] == 6


def test_json_path_in_directories_not_yet_made(tmp_path):
    out = tmp_path / "new" / "dirs" / "cfg.json"
    assert main(["config", "--json", str(out)]) == 0
    assert optical.OpticalConfig.from_dict(json.loads(out.read_text())) == \
        optical.presets.get("iris-like")


def test_json_of_numpy_scalars_is_standard_json(tmp_path):
    """A result holding numpy scalars (as reductions return them) is written
    as the plain JSON numbers and booleans they equal."""
    from optical.commands._common import write_json

    out = tmp_path / "r.json"
    write_json(out, {"sqnr_db": np.float32(12.5), "passes": np.int64(3),
                     "clipped": np.bool_(True), "worst": [np.float64(-np.inf), np.uint8(7)]})
    assert json.loads(out.read_text(), parse_constant=pytest.fail) == {
        "sqnr_db": 12.5, "passes": 3, "clipped": True, "worst": ["-inf", 7]}


def _fail_after_part(monkeypatch, path_class):
    """Make Path.write_text write the first 10 characters, then fail as a
    full disk does."""
    import errno

    real = path_class.write_text

    def part(self, text, *args, **kwargs):
        real(self, text[:10], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(path_class, "write_text", part)


def test_a_json_report_that_cannot_be_written_whole_keeps_the_previous_one(tmp_path,
                                                                           monkeypatch):
    """A kill or a full disk mid-write left a truncated (or empty) report
    where the previous good one was, and the error named no file: the report
    now goes to a temporary file renamed over it, as the sweep's files do."""
    from pathlib import Path

    from optical.commands._common import write_json

    out = tmp_path / "report.json"
    out.write_text('{"sqnr_db": 31.5}\n')
    _fail_after_part(monkeypatch, Path)
    with pytest.raises(OSError, match=r"No space left on device while writing it.*report\.json"):
        write_json(out, {"values": list(range(100))})
    monkeypatch.undo()
    assert json.loads(out.read_text()) == {"sqnr_db": 31.5}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left
    # Through a symlink the file it names is replaced and the link kept.
    link = tmp_path / "link.json"
    link.symlink_to(out)
    write_json(link, {"sqnr_db": 12.0})
    assert link.is_symlink() and json.loads(out.read_text()) == {"sqnr_db": 12.0}


@pytest.mark.parametrize("mode", ["truncate", "append"])
def test_json_to_a_redirected_stdout_keeps_the_files_order_and_what_it_held(tmp_path, mode):
    """`--json /dev/stdout > file` (or `>> log`): opening /dev/stdout opened
    the file afresh, at offset 0 and truncated, so the table printed after
    it overwrote the JSON, and `>>` lost the lines the file held (an
    environment audit). Through a symlink and /dev/fd/N alike, the JSON is
    written through the shell's own descriptor: what the file held, then the
    JSON, then the table."""
    import os
    import subprocess
    import sys

    held = "line 1\nline 2\n" if mode == "append" else ""
    (tmp_path / "so.json").symlink_to("/dev/stdout")
    names = ["/dev/stdout", str(tmp_path / "so.json"), "/dev/fd/1", "/proc/self/fd/1"]
    for name in names:
        log = tmp_path / "log.txt"
        log.write_text(held)
        with open(log, "ab" if mode == "append" else "wb") as out:
            run = subprocess.run([sys.executable, "-m", "optical.cli", "config", "--preset",
                                  "ideal", "--json", name], stdout=out, stderr=subprocess.PIPE,
                                 text=True, timeout=120, cwd=os.getcwd())
        assert run.returncode == 0, run.stderr
        text = log.read_text()
        assert text.startswith(held), name
        report, end = json.JSONDecoder().raw_decode(text, len(held))
        assert report["adc"]["bits"] is None, name
        table = text[end:].lstrip("\n")
        assert table.startswith("path ") and "\nadc.bits " in table, name


def test_a_descriptor_name_that_cannot_take_the_json_is_refused_before_any_work(
        tmp_path, monkeypatch, capsys):
    """--json /dev/stdin (open for reading) passed the check and lost the
    report after the work ("Bad file descriptor"): refused before any work,
    naming the option; a link to a descriptor number past C's int gave
    OverflowError's traceback (a review), now the name's own error."""
    import os

    from optical.commands import config as config_command

    ran = []
    monkeypatch.setattr(config_command, "run", lambda args: ran.append(args) or 0)
    read_end, write_end = os.pipe()
    try:
        assert main(["config", "--json", f"/dev/fd/{read_end}"]) == 2
        assert capsys.readouterr().err == (f"optical config: error: --json /dev/fd/{read_end}: "
                                           f"descriptor {read_end} is not open for writing\n")
    finally:
        os.close(read_end)
        os.close(write_end)
    assert not ran
    monkeypatch.undo()
    (tmp_path / "big.json").symlink_to("/dev/fd/3000000000")
    assert main(["config", "--json", str(tmp_path / "big.json")]) == 2
    assert capsys.readouterr().err.endswith(f"{tmp_path / 'big.json'}: No such file or "
                                            "directory\n")


def test_a_relative_path_in_a_deleted_directory_says_so(tmp_path, monkeypatch, capsys):
    """A shell left in a directory that was deleted: a relative --out (the
    README's form) or --json failed with a bare "[Errno 2] No such file or
    directory" (a review); the line says why."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert main(["sweep", "--matmul", "4x8x4", "--param", "adc.bits=4", "--jobs", "1",
                 "--quiet", "--out", "runs/x"]) == 2
    assert capsys.readouterr().err == (
        "optical sweep: error: runs/x: No such file or directory (out is relative to the "
        "current directory, which was deleted: cd to a directory that exists, or give an "
        "absolute path)\n")
    assert main(["config", "--json", "c.json"]) == 2
    assert capsys.readouterr().err == (
        "optical config: error: --json c.json: No such file or directory (--json is relative "
        "to the current directory, which was deleted: cd to a directory that exists, or give "
        "an absolute path)\n")
    # A bare ENOENT from elsewhere (numba's compiler takes relative paths) says why.
    from optical.commands import config as config_command

    def bare(args):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(config_command, "run", bare)
    assert main(["config"]) == 2
    assert capsys.readouterr().err == (
        "optical config: error: [Errno 2] No such file or directory (the current directory "
        "was deleted: cd to a directory that exists)\n")


def test_a_path_stdout_cannot_encode_is_printed_escaped_not_an_error(tmp_path):
    """Under PYTHONIOENCODING=ascii (or a console's code page) a model path
    with an é made the command fail after its work, its table unprinted, as
    bad input (exit 2, an environment audit): stdout escapes it, as stderr
    does."""
    import os
    import shutil
    import subprocess
    import sys

    model = tmp_path / "minilm\u00e9"
    model.mkdir()
    shutil.copy("models/all-minilm-l6-v2/config.json", model)
    run = subprocess.run([sys.executable, "-m", "optical.cli", "energy", "--model", str(model)],
                         capture_output=True, timeout=120,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"})
    assert run.returncode == 0, run.stderr.decode()
    assert run.stdout.decode("ascii").startswith("minilm\\xe9: 512 prompt tokens")


def test_outputs_that_are_not_files_are_written_in_place(tmp_path):
    """--json /dev/stdout (a pipe, or a file the shell holds open) and a FIFO
    cannot be replaced by a renamed file: they are written in place."""
    import os
    from pathlib import Path

    from optical._files import replacing_target

    assert replacing_target(Path("/dev/stdout")) is None
    (tmp_path / "out.json").symlink_to("/dev/stdout")  # realpath reaches the shell's file
    assert replacing_target(tmp_path / "out.json") is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert replacing_target(fifo) is None
    plain, absent = tmp_path / "a.json", tmp_path / "new" / "b.json"
    plain.write_text("{}")
    assert replacing_target(plain) == plain and replacing_target(absent) == absent
    (tmp_path / "l.json").symlink_to(plain)
    assert replacing_target(tmp_path / "l.json") == plain


def test_a_replaced_report_keeps_what_the_in_place_write_kept(tmp_path, monkeypatch):
    """The atomic write must not lose what writing in place kept: the
    file's permission bits (a private report became world-readable), a hard
    link's sharing, a long name's legality, and a file the user may write
    but not replace (a directory not theirs: refused after the whole run)."""
    import errno
    import os
    import stat
    from pathlib import Path

    from optical.commands._common import write_json

    private = tmp_path / "private.json"
    private.write_text("{}")
    private.chmod(0o600)
    write_json(private, {"a": 1})
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert json.loads(private.read_text()) == {"a": 1}
    # The new content is private while it is written, whatever the final mode;
    # a new file gets the mode a plain write gives it.
    from optical._files import write_output

    public = tmp_path / "public.json"
    public.write_text("{}")
    public.chmod(0o644)
    seen = []
    write_output(public, lambda p: (seen.append(stat.S_IMODE(p.stat().st_mode)),
                                    p.write_text("[]")))
    assert seen == [0o600] and stat.S_IMODE(public.stat().st_mode) == 0o644
    plain, fresh = tmp_path / "plain.json", tmp_path / "fresh.json"
    plain.write_text("{}")
    write_json(fresh, {})
    assert stat.S_IMODE(fresh.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)
    linked = tmp_path / "linked.json"
    os.link(private, linked)
    write_json(private, {"a": 2})
    assert json.loads(linked.read_text()) == {"a": 2}
    for long in (tmp_path / ("r" * 250 + ".json"), tmp_path / ("é" * 125 + ".json")):
        write_json(long, {"a": 3})  # 255 bytes: the most a name may have
        assert json.loads(long.read_text()) == {"a": 3}
    # A file the user may not write is refused, as a plain write refuses it (a
    # rename needs only the directory). os.access stands in for a non-root user.
    read_only = tmp_path / "read-only.json"
    read_only.write_text("{}")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == read_only
                        else real_access(p, mode))
    with pytest.raises(PermissionError, match="read-only.*read-only.json"):
        write_json(read_only, {"a": 6})
    assert read_only.read_text() == "{}"
    monkeypatch.undo()
    shared = tmp_path / "shared.json"
    shared.write_text("{}")

    def not_ours(src, dst):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "replace", not_ours)
    write_json(shared, {"a": 4})
    assert json.loads(shared.read_text()) == {"a": 4}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(PermissionError, match="while writing it"):  # a new file: nothing to fall back on
        write_json(tmp_path / "new.json", {"a": 5})
    assert not Path(tmp_path / "new.json").exists()


def _validate_json(argv, tmp_path, name):
    out = tmp_path / name
    assert main([*argv, "--quiet", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_a_config_file_runs_as_its_preset_would(tmp_path, capsys):
    """--config FILE (what `optical config --json` writes) gives the same
    validation, bit for bit, as the preset and overrides it was written from;
    the report names the file and keeps the overrides given on top."""
    from tests.transformer_helpers import TINY_LLAMA, write_model

    model = write_model(tmp_path / "tiny", TINY_LLAMA)
    small = ["--set", "core.inputs=48", "--set", "core.outputs=40"]
    config = tmp_path / "machine.json"
    assert main(["config", "--preset", "iris-like", "--set", "adc.bits=6", *small,
                 "--json", str(config)]) == 0
    argv = ["validate", "--model", str(model), "--tokens", "6"]
    by_preset = _validate_json([*argv, "--preset", "iris-like", "--set", "adc.bits=6",
                                "--set", "mask.bits=5", *small], tmp_path, "p.json")
    capsys.readouterr()
    by_file = _validate_json([*argv, "--config", str(config), "--set", "mask.bits=5"],
                             tmp_path, "f.json")
    assert by_file["products"] == by_preset["products"]
    assert by_file["config"] == by_preset["config"]
    assert (by_file["preset"], by_file["config_file"]) == (None, str(config))
    assert (by_preset["preset"], by_preset["config_file"]) == ("iris-like", None)
    assert f"{config} + mask.bits=5" in capsys.readouterr().out
    # A command's own JSON holds the config it ran: it reads back as the file.
    assert main(["config", "--config", str(tmp_path / "f.json"), "--json",
                 str(tmp_path / "again.json")]) == 0
    assert optical.OpticalConfig.from_json((tmp_path / "again.json").read_text()) == \
        optical.presets.get("iris-like").replace(
            {"adc.bits": 6, "mask.bits": 5, "core.inputs": 48, "core.outputs": 40})


def test_a_config_file_leaves_unset_fields_at_the_base_config(tmp_path):
    """A partial file fills the rest from OpticalConfig() (the ideal
    machine), as its --help says, not from the default preset."""
    config = tmp_path / "partial.json"
    config.write_text('{"adc": {"bits": 6}}')
    out = tmp_path / "out.json"
    assert main(["config", "--config", str(config), "--json", str(out)]) == 0
    assert optical.OpticalConfig.from_json(out.read_text()) == optical.OpticalConfig().replace(
        {"adc.bits": 6})


@pytest.mark.parametrize(("content", "message"), [
    (None, "--config {path}: No such file or directory"),
    ("{", "--config {path}: not JSON (Expecting property name"),
    ("[" * 100_000 + "]" * 100_000, "--config {path}: not JSON (nested too deeply"),
    ('{"adc": {"headroom": %s}}' % ("1" * 5000), "--config {path}: not JSON (Exceeds the limit"),
    ('{"adc.bits": 6}', '--config {path}: unknown config section \'adc.bits\' (fields nest in '
                        'their section: {{"adc": {{"bits": ...}}}})'),
    ('{"preset": "iris-like", "adc": {"bits": 6}}',
     "--config {path}: unknown config section 'preset' (a config holds whole sections, missing "
     "fields taking OpticalConfig()'s values, not a preset's: start from "
     "optical.presets.get(NAME).replace(...), --preset NAME --set path=value"),
    ('{"mask": {"compensate": "true"}}', "--config {path}: mask.compensate: 'true' is text, "
                                         "not a boolean"),
    ("[1, 2]", "--config {path}: expected a mapping of sections, got list"),
    (b"\xff\xfe{", "--config {path}: not text"),
])
def test_a_bad_config_file_is_one_line_naming_the_option_and_the_file(content, message,
                                                                       tmp_path, capsys):
    path = tmp_path / "machine.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    for command in (["config"], ["energy", "--model", "models/llama-3.2-1b"],
                    ["sweep", "--matmul", "4x8x4", "--out", str(tmp_path / "never")]):
        assert main([*command, "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert message.format(path=path) in err and "Traceback" not in err
    assert not (tmp_path / "never").exists()


def test_config_file_and_preset_together_are_refused(tmp_path, capsys):
    path = tmp_path / "machine.json"
    assert main(["config", "--json", str(path)]) == 0
    assert main(["config", "--config", str(path), "--preset", "ideal"]) == 2
    assert f"--config {path} and --preset ideal: give one" in capsys.readouterr().err


def test_an_unknown_option_is_named_by_its_command(capsys):
    """CLI conventions: one line `optical CMD: error: ...`, also for an
    option the command does not have (argparse's own message names the
    top-level program)."""
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--model", "models/llama-3.2-1b", "--tokns", "8"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "optical validate: error: unrecognized arguments: --tokns 8" in err
    assert "usage: optical validate" in err


@pytest.mark.parametrize("argv", [
    ["config", "--json", ""], ["config", "--config", " "], ["energy", "--model", ""],
    ["plot", "", "--x", "adc.bits", "--y", "sqnr_db"], ["sweep", "--matmul", "4x8x4", "--out", ""],
    ["energy", "--model", "models/llama-3.2-1b", "--plot", ""], ["validate", "--model", ""],
    ["sweep", "--model", " ", "--tokens", "4", "--out", "never-written"]])
def test_an_empty_path_is_named_as_such(capsys, argv):
    # Path("") is ".": the refusal named "." (a directory) instead.
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    empty = next(a for a in argv if not a.strip())
    assert f"{empty!r} is an empty path" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "option", "command"), [
    (["--quiet", "sweep", "--out", "never-written"], "--quiet", "sweep"),
    # an option with its value: argparse took the value for the command
    (["--out", "runs/x", "sweep", "--matmul", "4x16x8"], "--out", "sweep"),
    (["--preset", "ideal"], "--preset", "COMMAND"),
])
def test_an_option_before_the_command_is_refused_by_the_program(capsys, argv, option,
                                                                command):
    """`optical --quiet sweep ...`: sweep has --quiet, so sweep must not be
    the one that says it does not know it (nor argparse that 'runs/x' is not
    a command)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (f"optical: error: unrecognized arguments: {option} (a command's options go after "
            f"it: optical {command} {option} ...)") in err


def test_version_names_the_release_the_commit_and_the_results_version(capsys):
    """`optical --version`: what a run's report records of the code, asked
    of the command itself (it was refused as a command's option)."""
    from optical._version import RESULTS_VERSION, __version__, source_commit

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    commit = source_commit()
    where = f"commit {commit[:12]}" if commit else "no git commit"
    assert capsys.readouterr().out == (f"optical {__version__} ({where}, results version "
                                       f"{RESULTS_VERSION})\n")


def test_a_config_file_with_a_byte_order_mark_reads(tmp_path):
    """Editors on Windows save UTF-8 with a BOM."""
    path = tmp_path / "machine.json"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"adc": {"bits": 6}}')
    out = tmp_path / "out.json"
    assert main(["config", "--config", str(path), "--json", str(out)]) == 0
    assert optical.OpticalConfig.from_json(out.read_text()).adc.bits == 6


def test_a_dotted_key_of_no_section_gets_no_nesting_hint():
    with pytest.raises(ValueError, match=r"unknown config section 'adcc\.bits'; valid"):
        optical.OpticalConfig.from_dict({"adcc.bits": 6})


def test_a_relative_config_file_is_recorded_resolved(tmp_path, monkeypatch):
    """--config given relative to the working directory is recorded as the
    file it named (as model_dir is), not as typed: read elsewhere, a
    report's relative path would name another file or none."""
    model = Path("models/llama-3.2-1b").resolve()
    monkeypatch.chdir(tmp_path)
    assert main(["config", "--preset", "iris-like", "--json", "machine.json"]) == 0
    assert main(["energy", "--model", str(model), "--prompt-tokens", "64", "--config",
                 "machine.json", "--json", "e.json"]) == 0
    data = json.loads((tmp_path / "e.json").read_text())
    assert data["config_file"] == str((tmp_path / "machine.json").resolve())


def test_energy_names_its_overrides_in_the_heading_and_the_json(tmp_path, capsys):
    out = tmp_path / "e.json"
    assert main(["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "64",
                 "--set", "adc.bits=6", "--json", str(out)]) == 0
    assert "preset iris-like + adc.bits=6, 1 core(s)" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert (data["preset"], data["overrides"], data["config_file"]) == (
        "iris-like", ["adc.bits=6"], None)


@pytest.mark.parametrize("argv", [["config"], ["--help"]])
def test_a_closed_stdout_is_not_a_traceback(argv, monkeypatch):
    # `optical config >&-`: Python starts with sys.stdout None; print() then
    # writes nothing, and before main() flushed stdout itself this exited 0.
    monkeypatch.setattr(sys, "stdout", None)
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    assert code == 0


@pytest.mark.parametrize("argv", [["config"], ["--help"]])
def test_a_full_stdout_fails_once_at_main_s_flush(argv, monkeypatch, capsys):
    # `optical config > /dev/full`, block-buffered: one line, exit 1, and
    # nothing left for the interpreter's last flush to fail on again
    # ("Exception ignored" and exit 120).
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    full = open("/dev/full", "w")  # noqa: SIM115 - closed below
    monkeypatch.setattr(sys, "stdout", full)
    try:
        try:
            code = main(argv)
        except SystemExit as stop:
            code = stop.code
        assert code == 1
        full.flush()  # the interpreter's own flush at exit: must not fail again
    finally:
        monkeypatch.undo()
        full.close()
    err = capsys.readouterr().err
    assert "No space left on device" in err and err.count("\n") == 1


def test_config_writes_its_json_before_its_table(tmp_path, monkeypatch):
    # ARCHITECTURE: "a command writes its --json file before its table".
    report = tmp_path / "c.json"
    monkeypatch.setattr(sys, "stdout", GonePipe())
    assert main(["config", "--preset", "ideal", "--json", str(report)]) == 1
    assert json.loads(report.read_text())["adc"]


@pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0
                         and os.path.isdir("/sys/kernel")),
                    reason="needs root and sysfs, as the test of a refusing file system")
def test_a_json_symlink_into_a_refusing_file_system_is_refused_before_any_work(
        tmp_path, capsys, monkeypatch):
    # The report is written to the link's target (write_output), so that is
    # where the probe must go, not beside the link.
    from optical.commands import config as config_command

    ran = []
    monkeypatch.setattr(config_command, "run", lambda args: ran.append(args) or 0)
    link = tmp_path / "r.json"
    link.symlink_to("/sys/kernel/optical-review8.json")
    assert main(["config", "--json", str(link)]) == 2
    assert "cannot create it in /sys/kernel" in capsys.readouterr().err
    assert not ran


def test_a_sweep_of_a_bundled_model_named_from_elsewhere_says_where_they_are(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", "--model", "models/llama-3.2-1b", "--param", "adc.bits=4",
                 "--jobs", "1", "--quiet", "--out", str(tmp_path / "s")]) == 2
    assert "the bundled models/ directories come with optical's source checkout" in \
        capsys.readouterr().err


def test_ctrl_c_ends_the_command_by_sigint_so_a_shell_loop_stops():
    """Run as the program, a Ctrl-C is reported in one line and the process
    then dies of SIGINT, as Python would die of an uncaught one: a shell
    loop around `optical validate` stops (an exit status of 130 it would
    take as an ordinary failure, and go on). main() called from Python
    returns 130 instead (test_ctrl_c_and_out_of_memory_...)."""
    import signal
    import subprocess
    import sys

    code = ("import sys\nfrom optical.commands import config\n"
            "def stopped(args):\n    raise KeyboardInterrupt\n"
            "config.run = stopped\nsys.argv = ['optical', 'config']\n"
            "from optical.cli import main\nsys.exit(main())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == -signal.SIGINT
    assert done.stderr == "optical config: interrupted\n"


def test_commands_and_units_survive_python_OO():
    """python -OO strips docstrings: every command's help built from its
    module docstring crashed, and the config fields' units (read from the
    sections' docstrings) came back empty, dropping them silently from error
    messages, tables and plot labels. A child under -OO prints what it got;
    the checks run here (-OO strips a child's asserts too)."""
    code = """
import contextlib, io, json
import optical
from optical.cli import build_parser
helps = {}
for command in ("config", "energy", "plot", "sweep", "validate"):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            build_parser().parse_args([command, "--help"])
        except SystemExit as stop:
            helps[command] = (stop.code, out.getvalue())
units = {p: optical.OpticalConfig.field_unit(p) for p in optical.OpticalConfig.paths()}
print(json.dumps({"helps": helps, "units": units}))
"""
    done = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    got = json.loads(done.stdout)
    for command, (code_, text) in got["helps"].items():
        assert code_ == 0 and text.startswith(f"usage: optical {command}"), command
    assert len(got["helps"]) == 5
    units = {p: optical.OpticalConfig.field_unit(p) for p in optical.OpticalConfig.paths()}
    assert got["units"] == units
    assert units["optics.pixel_pitch"] == "m" and units["source.wavelength"] == "m"


def test_an_install_without_sources_still_makes_configs_under_python_OO(tmp_path):
    """Compiled-only installs (frozen apps) under -OO have neither docstrings
    nor sources to read the units from: configs are still made, with blank
    units (reading the source for them first raised for every config)."""
    import compileall
    import shutil

    package = tmp_path / "optical"
    shutil.copytree(os.path.dirname(optical.__file__), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert compileall.compile_dir(package, quiet=1, legacy=True, optimize=2)
    for source in package.rglob("*.py"):
        source.unlink()
    code = "import optical; print(optical.presets.get('iris-like').adc.bits)"
    done = subprocess.run([sys.executable, "-OO", "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path)},
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    assert done.stdout.split() == ["8"]


def test_the_package_version_is_read_without_importing_the_package():
    """pip builds the project in an isolated environment without numpy, where
    setuptools reads the version attribute statically or else imports the
    package (which fails there): the attribute pyproject names must be a
    plain literal assignment in a file setuptools can parse on its own (a
    re-export from optical/__init__.py broke every fresh install)."""
    import ast
    import tomllib
    from pathlib import Path

    root = Path(optical.__file__).parent.parent
    attr = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "dynamic"]["version"]["attr"]
    module, name = attr.rsplit(".", 1)
    source = root.joinpath(*module.split(".")).with_suffix(".py")
    if not source.exists():  # a package: its __init__.py
        source = root.joinpath(*module.split("."), "__init__.py")
    assigned = [node.value.value for node in ast.parse(source.read_text()).body
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)]
    assert assigned == [optical.__version__]
