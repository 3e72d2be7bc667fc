import json

import pytest

import optical
from optical.cli import main
from optical.energy import gpu
from optical.transformer import read_spec


def test_energy_command_prints_the_breakdown_and_writes_json_and_plot(tmp_path, capsys):
    out, fig = tmp_path / "energy.json", tmp_path / "energy.png"
    assert main(["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "256",
                 "--preset", "iris-like", "--gpu", "h200", "--set", "energy.cores=4",
                 "--json", str(out), "--plot", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "laser" in text and "mask_load" in text and "H200" in text
    data = json.loads(out.read_text())
    opt = data["optical"]
    assert opt["energy_j"]["total"] == pytest.approx(sum(opt["energy_j"]["components"].values()))
    assert opt["ttft_s"] == pytest.approx(sum(opt["time_s"].values()))
    cfg = optical.presets.get("iris-like").replace({"energy.cores": 4})
    assert optical.OpticalConfig.from_dict(data["config"]) == cfg
    spec = read_spec("models/llama-3.2-1b")
    expect = optical.energy.prefill(spec, 256, cfg)
    assert opt["energy_j"]["total"] == pytest.approx(expect.total)
    assert opt["schedule"]["num_layers"] == 16
    assert opt["schedule"]["per_layer"]["q_proj"]["weight_loads"] == 4
    assert opt["counts"]["weight_loads"] == 16 * sum(
        s["weight_loads"] for s in opt["schedule"]["per_layer"].values())
    ref = gpu.prefill(spec, 256, gpu.get_gpu("h200"))
    assert data["gpu"]["energy_j"]["total"] == pytest.approx(ref.energy)
    assert data["gpu"]["ttft_s"] == pytest.approx(ref.time)
    assert "energy_per_request_j" in data["disaggregated"]
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("argv", "message"), [
    (["energy", "--model", "models/nope"], "no config.json"),
    (["energy", "--model", "models/llama-3.2-1b", "--preset", "ideal"],
     "source.photons_per_mac is inf"),
    (["energy", "--model", "models/llama-3.2-1b", "--gpu-utilization", "2"],
     "--gpu-utilization: 2.0 is out of range"),
    (["energy", "--model", "models/llama-3.2-1b", "--set", "energy.cores=0"], "energy.cores"),
])
def test_energy_command_errors_are_one_clear_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_energy_command_rejects_bad_counts(capsys):
    with pytest.raises(SystemExit):
        main(["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "0"])
    assert "must be a positive integer" in capsys.readouterr().err


def test_energy_json_to_stdout_is_the_json_alone(tmp_path, capsys):
    argv = ["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "64"]
    assert main([*argv, "--json", str(tmp_path / "e.json")]) == 0
    capsys.readouterr()
    assert main([*argv, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((tmp_path / "e.json").read_text())


def test_energy_plot_problems_are_named_before_the_work(tmp_path, capsys, monkeypatch):
    import sys

    argv = ["energy", "--model", "models/llama-3.2-1b", "--json", str(tmp_path / "e.json")]
    assert main([*argv, "--plot", str(tmp_path)]) == 2
    assert f"--plot {tmp_path}: is a directory" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main([*argv, "--plot", str(tmp_path / "e.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("optical energy: error: --plot needs matplotlib") and \
        "pip install 'optical[plot]'" in err and "Traceback" not in err
    assert not (tmp_path / "e.json").exists()
