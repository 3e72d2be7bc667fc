import json

import numpy as np
import pytest

import optical
from optical.cli import main


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
    (["sweep", "--matmul", "4x8x4", "--param", "source.photons_per_mac=10:1e5:log", "--out",
      "never-written"],
     "a Range needs random sampling (samples=N; CLI: --samples N)"),
])
def test_bad_options_fail_with_one_clear_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_reader_that_left_ends_the_command_quietly(monkeypatch, capfd):
    # `optical energy ... | head -3`: once the reader has gone, a write fails
    # with EPIPE; no error line, exit 1 (Python's "Note on SIGPIPE").
    from optical.commands import config as config_command

    def closed_pipe(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(config_command, "run", closed_pipe)
    assert main(["config"]) == 1
    assert "error" not in capfd.readouterr().err


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


def test_config_json_to_stdout_is_the_json_alone(capsys):
    assert main(["config", "--set", "adc.bits=6", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert optical.OpticalConfig.from_dict(data) == optical.presets.get("iris-like").replace(
        {"adc.bits": 6})


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
