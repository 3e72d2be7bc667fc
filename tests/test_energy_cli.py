import itertools
import json
import math
import pathlib
import re

import pytest

import optical
from optical.cli import main
from optical.energy import gpu
from optical.transformer import read_spec

DOCS = pathlib.Path(__file__).resolve().parents[1] / "docs"


def test_energy_command_prints_the_breakdown_and_writes_json_and_plot(tmp_path, capsys):
    out, fig = tmp_path / "energy.json", tmp_path / "energy.png"
    assert main(["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "256",
                 "--preset", "iris-like", "--gpu", "h200", "--set", "energy.cores=4",
                 "--json", str(out), "--plot", str(fig)]) == 0
    text = capsys.readouterr().out
    assert "laser" in text and "mask_load" in text and "H200" in text
    data = json.loads(out.read_text())
    # as typed, and resolved, as validate's JSON names it (a provenance audit)
    assert data["model"] == "models/llama-3.2-1b"
    assert data["model_dir"] == str(pathlib.Path("models/llama-3.2-1b").resolve())
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
    # What computed it and what it read of config.json (a reproduction audit:
    # an energy-model change moved the numbers under the same results_version)
    from optical._version import source_commit

    assert data["optical_commit"] == source_commit()
    assert data["model_spec"] == {
        "architecture": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_layers": 16, "num_heads": 32, "num_kv_heads": 8, "head_dim": 64,
        "vocab_size": 128256, "max_positions": 131072, "tie_word_embeddings": True}
    # and it re-runs the estimate: a spec of these fields gives the same joules
    record = dict(data["model_spec"])
    tied, positions = record.pop("tie_word_embeddings"), record.pop("max_positions")
    again = optical.transformer.ModelSpec(**record, raw={
        "tie_word_embeddings": tied, "max_position_embeddings": positions})
    assert optical.energy.prefill(again, 256, cfg).total == opt["energy_j"]["total"]


@pytest.mark.parametrize(("value", "text"), [(1.0023, "1.002"), (0.99951, "0.9995"),
                                           (1.0, "1"), (2.97, "2.97"), (0.00934, "0.00934"),
                                           (1.00004, "1.00004"), (1 + 2**-52, repr(1 + 2**-52))])
def test_a_ratio_near_one_keeps_the_digit_that_says_which_side_wins(value, text):
    """The disaggregated ratio 1.0023 was printed "1x"."""
    from optical.commands.energy import _ratio

    assert _ratio(value) == text


@pytest.mark.parametrize(("options", "hardware"), [
    (["--preset", "iris-like", "--set", "adc.bits=6"], "preset iris-like + adc.bits=6"),
    (["--config", "{tmp}/m.json"], "config {tmp}/m.json"),
])
def test_energy_plot_is_titled_with_the_hardware_priced(tmp_path, monkeypatch, capsys,
                                                       options, hardware):
    pytest.importorskip("matplotlib")
    from optical.energy import plot

    (tmp_path / "m.json").write_text(optical.presets.get("iris-like").to_json())
    drawn = []
    real = plot.plot_breakdown
    monkeypatch.setattr(plot, "plot_breakdown",
                        lambda *a, **kw: drawn.append(kw["hardware"]) or real(*a, **kw))
    options = [o.format(tmp=tmp_path) for o in options]
    assert main(["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "64",
                 *options, "--plot", str(tmp_path / "e.png")]) == 0
    assert drawn == [hardware.format(tmp=tmp_path)]


@pytest.mark.parametrize(("argv", "message"), [
    (["energy", "--model", "models/nope"], "models/nope: no such model directory"),
    (["energy", "--model", "models/llama-3.2-1b", "--plot", "{tmp}/e.png", "--json",
      "{tmp}/e.png"], "--json {tmp}/e.png: is also the figure {tmp}/e.png of --plot"),
    (["energy", "--model", "models/llama-3.2-1b", "--preset", "ideal"],
     "source.photons_per_mac is inf"),
    (["energy", "--model", "models/llama-3.2-1b", "--gpu-utilization", "2"],
     "--gpu-utilization: 2.0 is out of range"),
    (["energy", "--model", "models/llama-3.2-1b", "--set", "energy.cores=0"], "energy.cores"),
    (["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "2048",
      "--output-tokens", "129025"], "--output-tokens: 2048 prompt + 129025 output tokens "
     "exceed max_position_embeddings 131072"),
    (["energy", "--model", "models/llama-3.2-1b", "--requests-per-s", "1e308"],
     "--requests-per-s x --output-tokens: 1e+308 requests/s of 256 output tokens need inf "
     "decode instances"),
])
def test_energy_command_errors_are_one_clear_line(argv, message, capsys, tmp_path):
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # nothing written


def test_energy_command_rejects_bad_counts(capsys):
    """One line naming the option, as validate and sweep refuse theirs (it
    was argparse's five lines of usage before the error)."""
    for option in ("--prompt-tokens", "--batch", "--output-tokens"):
        assert main(["energy", "--model", "models/llama-3.2-1b", option, "0"]) == 2
        assert capsys.readouterr().err == (f"optical energy: error: {option}: 0 must be a "
                                           "positive integer\n")
    for option in ("--requests-per-s", "--gpu-utilization"):
        for value in ("0", "-1", "inf", "nan"):
            assert main(["energy", "--model", "models/llama-3.2-1b", option, value]) == 2
            assert capsys.readouterr().err == (
                f"optical energy: error: {option}: {float(value)} must be a positive finite "
                "number\n")


def test_an_encoder_has_no_disaggregated_decode(capsys):
    """all-MiniLM-L6-v2 generates nothing: no GPU decode is priced (it was 99 % of
    both per-request figures), while its prefill is estimated as a decoder's."""
    from optical.energy import workload

    argv = ["energy", "--model", "models/all-minilm-l6-v2", "--prompt-tokens", "128"]
    assert main([*argv, "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["disaggregated"] is None
    spec = read_spec("models/all-minilm-l6-v2")
    cfg = optical.presets.get("iris-like")
    assert data["optical"]["energy_j"]["total"] == pytest.approx(
        optical.energy.prefill(spec, 128, cfg).total)
    assert main(argv) == 0
    assert ("disaggregated: none (all-minilm-l6-v2 is an encoder: it generates no tokens to "
            "decode)") in capsys.readouterr().out
    with pytest.raises(ValueError, match="a bert model is an encoder and generates no tokens"):
        workload.disaggregated(spec, workload.Workload(128, 16, 1.0), cfg, gpu.get_gpu("h100"))


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


def test_energy_plot_suffix_decides_the_format(tmp_path, capsys):
    argv = ["energy", "--model", "models/llama-3.2-1b", "--json", str(tmp_path / "e.json")]
    assert main([*argv, "--plot", str(tmp_path / "fig.v1")]) == 2  # named, before the work
    assert (f"--plot {tmp_path / 'fig.v1'}: unknown figure format '.v1'; valid: .png, .svg, "
            ".pdf" in capsys.readouterr().err)
    assert not (tmp_path / "e.json").exists()
    pytest.importorskip("matplotlib")
    assert main([*argv, "--plot", str(tmp_path / "fig")]) == 0  # no suffix: a PNG
    out = capsys.readouterr().out
    assert f"plot: {tmp_path / 'fig.png'}" in out
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "e.json").read_text())["plot"] == str(tmp_path / "fig.png")
    for suffix, magic in ((".svg", b"<?xml"), (".pdf", b"%PDF-")):  # written as named
        assert main([*argv, "--plot", str(tmp_path / f"fig{suffix}")]) == 0
        assert (tmp_path / f"fig{suffix}").read_bytes()[:5] == magic


# --------------------------------------------------------------------------- #
# --batch, --output-tokens, --requests-per-s against the energy API
# --------------------------------------------------------------------------- #

MODEL = "models/llama-3.2-1b"
PROMPT = 256


def _as_written(data):
    """``data`` as ``--json`` writes it: standard JSON, non-finite floats as strings."""
    return json.loads(json.dumps(data, default=lambda value: value.item()),
                      parse_constant=lambda name: str(float(name)))


def _energy(capsys, *extra):
    """What ``optical energy`` on MODEL writes with ``--json -``."""
    assert main(["energy", "--model", MODEL, "--prompt-tokens", str(PROMPT), *extra,
                 "--json", "-"]) == 0
    return json.loads(capsys.readouterr().out)


def _expected(batch=1, output_tokens=256, requests_per_s=1.0):
    """The command's sections computed with the API, iris-like on an H100."""
    from optical.energy import compare, workload

    spec, cfg, h100 = read_spec(MODEL), optical.presets.get("iris-like"), gpu.get_gpu("h100")
    work = workload.Workload(PROMPT, output_tokens, requests_per_s)
    return _as_written({
        "batch": batch,
        "optical": optical.energy.prefill(spec, PROMPT, cfg, batch=batch,
                                          model="llama-3.2-1b").to_dict(),
        "gpu": gpu.prefill(spec, PROMPT, h100, batch=batch).to_dict(),
        "comparison": compare.compare(spec, PROMPT, cfg, h100, batch=batch),
        "disaggregated": workload.disaggregated(spec, work, cfg, h100, prefill_batch=batch),
    })


def _sections(data):
    return {key: data[key] for key in ("batch", "optical", "gpu", "comparison", "disaggregated")}


def _disaggregated_only(capsys, option, value, **expected):
    """``optical energy`` by default and with ``option value``: the latter is
    the API's sections with ``expected``, and the prefill's sections do not
    move. Both outputs, default first."""
    default, changed = _energy(capsys), _energy(capsys, option, value)
    assert _sections(changed) == _expected(**expected)
    for section in ("optical", "gpu", "comparison"):
        assert changed[section] == default[section], section
    return default, changed


def _littles_law(split):
    """Sequences decoding at once = arrival rate per instance x time in decode
    (output tokens x step time): the disaggregated estimate's decode."""
    work, decode = split["workload"], split["decode"]
    return pytest.approx(work["requests_per_s"] / decode["instances"] * work["output_tokens"]
                         * decode["step_time_s"], rel=1e-12)


def test_energy_batch_is_prefill_of_that_many_prompts(capsys):
    """--batch 4: the API with batch=4 everywhere; the masks are loaded once per
    batch, so what streams (passes, conversions, light) grows 4x and the mask
    loads do not."""
    one, four = _energy(capsys), _energy(capsys, "--batch", "4")
    assert _sections(one) == _expected()
    assert _sections(four) == _expected(batch=4)
    a, b = one["optical"], four["optical"]
    for count in ("passes", "dac_conversions", "adc_conversions", "detector_readouts", "macs"):
        assert b["counts"][count] == 4 * a["counts"][count], count
    assert b["counts"]["weight_loads"] == a["counts"]["weight_loads"]
    assert b["counts"]["rows_per_weight_load"] == 4 * PROMPT
    for part in ("laser", "dac", "adc", "detector"):
        assert b["energy_j"]["components"][part] == pytest.approx(
            4 * a["energy_j"]["components"][part], rel=1e-12), part
    assert b["energy_j"]["components"]["mask_load"] == a["energy_j"]["components"]["mask_load"]
    assert b["energy_j"]["per_request"] == pytest.approx(b["energy_j"]["total"] / 4, rel=1e-12)
    assert four["disaggregated"]["prefill_batch"] == 4
    assert four["disaggregated"]["energy_per_request_j"]["disaggregated"]["prefill"] == \
        pytest.approx(b["energy_j"]["per_request"], rel=1e-12)
    assert main(["energy", "--model", MODEL, "--prompt-tokens", str(PROMPT), "--batch", "4"]) == 0
    assert f"{PROMPT} prompt tokens x batch 4" in capsys.readouterr().out


def test_energy_output_tokens_change_only_the_decode(capsys):
    """--output-tokens N: the disaggregated estimate of N tokens per request;
    its decode energy is N x the energy of an output token, Little's law holds,
    and nothing of the prefill moves."""
    default, short = _disaggregated_only(capsys, "--output-tokens", "64", output_tokens=64)
    for data, tokens in ((default, 256), (short, 64)):
        split = data["disaggregated"]
        assert split["workload"]["output_tokens"] == tokens
        energy = split["energy_per_request_j"]
        per_token = split["decode"]["energy_per_output_token_j"]
        for deployment in ("all_gpu", "disaggregated"):
            assert energy[deployment]["decode"] == pytest.approx(tokens * per_token, rel=1e-12)
        assert split["decode"]["concurrent_sequences"] == _littles_law(split)
    for deployment in ("all_gpu", "disaggregated"):
        assert short["disaggregated"]["energy_per_request_j"][deployment]["prefill"] == \
            default["disaggregated"]["energy_per_request_j"][deployment]["prefill"]
    assert main(["energy", "--model", MODEL, "--prompt-tokens", str(PROMPT),
                 "--output-tokens", "64"]) == 0
    assert "disaggregated (64 output tokens, 1 requests/s)" in capsys.readouterr().out


def test_energy_requests_per_s_set_the_power_and_the_machines(capsys):
    """--requests-per-s R: the disaggregated estimate at R requests/s; power is
    energy per request x R, the optical machines keep up with R prefills/s
    (ceil(R x TTFT)), Little's law holds, and nothing of the prefill moves."""
    default, busy = _disaggregated_only(capsys, "--requests-per-s", "10", requests_per_s=10.0)
    for data, rate in ((default, 1.0), (busy, 10.0)):
        split = data["disaggregated"]
        assert split["workload"]["requests_per_s"] == rate
        for deployment in ("all_gpu", "disaggregated"):
            assert split["power_w"][deployment] == pytest.approx(
                rate * split["energy_per_request_j"][deployment]["total"], rel=1e-12)
        assert split["optical_machines"] == math.ceil(rate * data["optical"]["ttft_s"])
        assert split["decode"]["concurrent_sequences"] == _littles_law(split)
    assert busy["disaggregated"]["optical_machines"] == 10  # a ~0.96 s prefill at 10/s
    assert main(["energy", "--model", MODEL, "--prompt-tokens", str(PROMPT),
                 "--requests-per-s", "2.5"]) == 0
    assert "(256 output tokens, 2.5 requests/s)" in capsys.readouterr().out


@pytest.mark.parametrize("utilization", [0.25, 1.0])
def test_gpu_utilization_is_the_achieved_fraction_of_peak_flops(capsys, utilization):
    """--gpu-utilization U: the GPU baseline at compute utilisation U (up to 1,
    the peak itself), its memory bandwidth utilisation left at 0.8."""
    data = _energy(capsys, "--gpu-utilization", str(utilization))
    spec, h100 = read_spec(MODEL), gpu.get_gpu("h100")
    assert data["gpu"]["spec"]["compute_utilization"] == utilization
    assert data["gpu"]["spec"]["bandwidth_utilization"] == h100.bandwidth_utilization == 0.8
    assert data["gpu"] == _as_written(
        gpu.prefill(spec, PROMPT, h100.replace(compute_utilization=utilization)).to_dict())


def test_energy_table_divides_each_component_by_every_prompt_token(capsys):
    """The printed breakdown of a batch of 4: each component's joules over the
    batch, over 4 x 256 tokens, and as a share of the total, to the 4
    significant digits (one decimal of a percent) printed."""
    assert main(["energy", "--model", MODEL, "--prompt-tokens", str(PROMPT), "--batch", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["component"])
    rows = {line.split()[0]: line.split()[1:] for line in lines[start + 1:start + 11]}
    opt = optical.energy.prefill(read_spec(MODEL), PROMPT, optical.presets.get("iris-like"),
                                 batch=4)
    total = sum(opt.components.values())
    assert list(rows) == [*opt.components, "total"]
    for name, value in [*opt.components.items(), ("total", total)]:
        joules, per_token, share = rows[name]
        assert float(joules) == pytest.approx(value, rel=1e-3, abs=0), name
        assert float(per_token) == pytest.approx(value / (4 * PROMPT), rel=1e-3, abs=0), name
        assert float(share.rstrip("%")) == pytest.approx(100 * value / total, abs=0.051), name
    # Per optical MAC: the total and the laser's, over every weight MAC of the batch.
    spec = read_spec(MODEL)
    macs = spec.num_layers * spec.linear_macs_per_token() * 4 * PROMPT
    words = lines[start + 11].split()
    assert words[:3] == ["per", "optical", "MAC:"]
    assert float(words[-2]) == pytest.approx(macs, rel=1e-3, abs=0)
    assert float(words[3]) == pytest.approx(total / macs * 1e12, rel=1e-3, abs=0)
    assert float(words[6]) == pytest.approx(opt.components["laser"] / macs * 1e12, rel=1e-3,
                                            abs=0)


def test_energy_figure_draws_per_token_energies_and_ttfts(tmp_path):
    """The figure of a batch of 2: the optical bar stacks each component's
    joules over 2 x 256 tokens, up to the total per token; the GPU bar is its
    energy over those tokens; the time panel holds the two TTFTs, each bar
    labelled with its value."""
    pytest.importorskip("matplotlib")
    from optical.energy.plot import breakdown_figure, plot_breakdown

    spec, cfg, h100 = read_spec(MODEL), optical.presets.get("iris-like"), gpu.get_gpu("h100")
    opt = optical.energy.prefill(spec, PROMPT, cfg, batch=2, model="llama-3.2-1b")
    ref = gpu.prefill(spec, PROMPT, h100, batch=2)
    path = plot_breakdown(opt, ref, tmp_path / "fig.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = breakdown_figure(opt, ref)
    energy, times = fig.axes
    bars = {c.get_label(): c.patches for c in energy.containers}
    tokens = 2 * PROMPT
    bottom = 0.0
    for name, value in opt.components.items():
        if value == 0:
            assert name not in bars, name
            continue
        (bar,) = bars[name]
        assert bar.get_y() == pytest.approx(bottom, rel=1e-12, abs=0), name
        assert bar.get_height() == pytest.approx(value / tokens, rel=1e-12, abs=0), name
        bottom += value / tokens
    assert bottom == pytest.approx(sum(opt.components.values()) / tokens, rel=1e-12, abs=0)
    (gpu_bar,) = bars[f"GPU (x{ref.gpus})"]
    assert gpu_bar.get_height() == pytest.approx(ref.energy / tokens, rel=1e-12, abs=0)
    assert [p.get_height() for p in times.patches] == [opt.ttft, ref.time]
    assert [t.get_text() for t in times.texts] == [f"{opt.ttft:.3g} s", f"{ref.time:.3g} s"]
    assert [t.get_text() for t in energy.texts] == [f"{bottom:.3g} J",
                                                    f"{ref.energy / tokens:.3g} J"]
    # the legend reads as the stack, top down, then the GPU
    drawn = [name for name, value in opt.components.items() if value > 0]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == \
        [*drawn[::-1], f"GPU (x{ref.gpus})"]
    # the optical TTFT bar wears no component's colour (the legend is shared)
    colours = {tuple(c.patches[0].get_facecolor()) for c in energy.containers}
    assert tuple(times.patches[0].get_facecolor()) not in colours
    # the title names what was priced, the core count included
    assert energy.get_title() == f"llama-3.2-1b: {PROMPT} tokens x batch 2, 1 core"
    many = optical.energy.prefill(spec, PROMPT, cfg.replace({"energy.cores": 16}), batch=2,
                                  model="llama-3.2-1b")
    assert (many.cores, many.to_dict()["cores"]) == (16, 16)
    assert breakdown_figure(many, ref).axes[0].get_title().endswith("batch 2, 16 cores")
    # and, given, the hardware (the command passes its preset or config file)
    assert breakdown_figure(opt, ref, hardware="preset iris-like + adc.bits=6").axes[0] \
        .get_title() == f"llama-3.2-1b: {PROMPT} tokens x batch 2, 1 core\npreset iris-like " \
        "+ adc.bits=6"


@pytest.mark.parametrize(("model", "tokens", "batch", "cores", "name", "scale"), [
    ("models/llama-3.1-70b", 2048, 8, 64, "h200", "linear"),  # GPU 2.08x the optical TTFT
    (MODEL, PROMPT, 1, 1, "h100", "log"),                   # optical ~800x the GPU's
])
def test_energy_figure_time_bars_keep_the_ratio_of_the_times(model, tokens, batch, cores,
                                                             name, scale):
    """Bar lengths read as the ratio of the TTFTs: a linear axis from 0 when
    the times are within 10x (a log axis whose automatic bottom sat just under
    the smaller bar drew a 2.08x ratio as 21x); past that a log axis whose
    bottom is at least a decade below the smaller time."""
    pytest.importorskip("matplotlib")
    from optical.energy.plot import breakdown_figure

    spec = read_spec(model)
    cfg = optical.presets.get("iris-like").replace({"energy.cores": cores})
    opt = optical.energy.prefill(spec, tokens, cfg, batch=batch)
    ref = gpu.prefill(spec, tokens, gpu.get_gpu(name), batch=batch)
    times = breakdown_figure(opt, ref).axes[1]
    low, high = sorted([opt.ttft, ref.time])
    bottom, top = times.get_ylim()
    assert times.get_yscale() == scale and top > high
    if scale == "linear":
        assert high / low < 10 and bottom == 0
        lengths = [p.get_height() for p in times.patches]  # bars from 0: lengths are times
        assert max(lengths) / min(lengths) == pytest.approx(high / low, rel=1e-12)
    else:
        assert high / low >= 10 and bottom <= low / 10
        assert "log scale" in times.get_ylabel()


@pytest.mark.parametrize(("ratio", "scale"), [(10.0, "log"), (9.99, "linear"), (0.099, "log")])
def test_energy_figure_time_axis_at_the_ten_times_edge(ratio, scale):
    """Within 10x (strictly) the time axis is linear from 0; at exactly 10x
    it is log, from at least a decade below the smaller time (and past 10x
    with the optical bar the taller). The GPU's time is set to ``ratio``
    times the optical TTFT."""
    pytest.importorskip("matplotlib")
    import dataclasses

    from optical.energy.plot import breakdown_figure

    spec = read_spec(MODEL)
    opt = optical.energy.prefill(spec, PROMPT, optical.presets.get("iris-like"))
    ref = dataclasses.replace(gpu.prefill(spec, PROMPT, gpu.get_gpu("h100")),
                              time=ratio * opt.ttft)
    times = breakdown_figure(opt, ref).axes[1]
    assert [p.get_height() for p in times.patches] == [opt.ttft, ratio * opt.ttft]
    bottom, top = times.get_ylim()
    low, high = sorted([opt.ttft, ratio * opt.ttft])
    assert times.get_yscale() == scale and top > high
    if scale == "linear":
        assert bottom == 0
    else:
        assert 0 < bottom <= low / 10


def test_energy_figure_leaves_the_callers_backend_alone(tmp_path, monkeypatch):
    """No pyplot, no matplotlib.use: a notebook's backend survives the figure;
    without matplotlib the error is an ImportError naming the extra."""
    import sys

    matplotlib = pytest.importorskip("matplotlib")
    from optical.energy.plot import plot_breakdown

    spec = read_spec(MODEL)
    opt = optical.energy.prefill(spec, PROMPT, optical.presets.get("iris-like"))
    ref = gpu.prefill(spec, PROMPT, gpu.get_gpu("h100"))
    before = matplotlib.get_backend()
    try:
        matplotlib.use("svg")
        plot_breakdown(opt, ref, tmp_path / "fig.png")
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"pip install 'optical\[plot\]'"):
        plot_breakdown(opt, ref, tmp_path / "other.png")


def test_break_even_line_says_what_each_figure_holds_fixed(capsys):
    """Photons at the given batch, batch at the given photons; 'none' where no
    photon count breaks even (a 64-token prompt: the mask loads alone cost
    more than the GPU's whole prefill)."""
    for tokens in ("2048", "64"):
        argv = ["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", tokens]
        assert main([*argv, "--json", "-"]) == 0
        comparison = json.loads(capsys.readouterr().out)["comparison"]
        assert main(argv) == 0
        line = next(x for x in capsys.readouterr().out.splitlines()
                    if x.startswith("GPU / optical"))
        photons = comparison["break_even_photons_per_mac"]
        assert (photons is None) == (tokens == "64")
        assert "break-even photons/MAC at this batch: " + (
            "none (the rest of the machine alone costs more)" if photons is None
            else f"{photons:.3g}") in line
        assert f"break-even batch at these photons: {comparison['break_even_batch']}" in line
        # the shortest prompt that breaks even, whatever prompt was asked for
        assert (comparison["break_even_tokens"], comparison["break_even_tokens_tried"]) == (437, 8192)
        assert line.endswith("break-even prompt tokens at this batch: 437")


def test_break_even_batch_none_is_said_in_words(capsys):
    """At 1e9 detected photons per MAC the light alone costs more per MAC than
    the GPU's whole MAC at any batch (batching amortises the mask loads, not
    the light): hc/850 nm x 1e9 / (QE 0.8 x half the light x wall-plug 0.3)
    = 1.9 nJ per MAC against 2 x 700 W / (989 TFLOP/s x 0.5) = 2.8 pJ. No
    break-even batch: null in the JSON, 'none' in words (not Python's None)."""
    laser_per_mac = 6.62607015e-34 * 299792458.0 / 850e-9 * 1e9 / (0.8 * 0.5 * 0.3)
    gpu_per_mac = 2 * 700.0 / (989e12 * 0.5)
    assert laser_per_mac > 100 * gpu_per_mac
    argv = ["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "64",
            "--set", "source.photons_per_mac=1e9"]
    assert main([*argv, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["comparison"]["break_even_batch"] is None
    assert main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("GPU / optical"))
    assert line.endswith("break-even batch at these photons: none; break-even prompt tokens at "
                         "this batch: none up to 8192")
    # all-MiniLM-L6-v2 has 512 positions: the break-even is tried up to 512
    assert main(["energy", "--model", "models/all-minilm-l6-v2", "--json", "-"]) == 0
    comparison = json.loads(capsys.readouterr().out)["comparison"]
    assert (comparison["break_even_tokens"], comparison["break_even_tokens_tried"]) == (None, 512)
    assert main(["energy", "--model", "models/all-minilm-l6-v2"]) == 0
    assert capsys.readouterr().out.count("break-even prompt tokens at this batch: none up to 512")


def test_the_table_says_outlier_channels_are_priced_as_optical(capsys):
    """The estimate counts every channel on the optics (which channels bypass
    depends on the data); with an outlier policy on, the table says so."""
    argv = ["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "128"]
    assert main(argv) == 0  # iris-like: static bypass
    assert "outlier channels (outliers.policy = 'static') priced as optical" in \
        capsys.readouterr().out
    assert main([*argv, "--set", "outliers.policy=none"]) == 0
    assert "outlier channels" not in capsys.readouterr().out


def test_prompt_length_defaults_to_what_the_model_holds(capsys, tmp_path):
    """The default prompt (2048 tokens) is cut to a model's
    max_position_embeddings (all-MiniLM-L6-v2: 512), which refused it before;
    a prompt given explicitly is still checked against it."""
    assert main(["energy", "--model", "models/all-minilm-l6-v2", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == 512
    assert main(["energy", "--model", "models/llama-3.2-1b", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == 2048
    assert main(["energy", "--model", "models/all-minilm-l6-v2", "--prompt-tokens", "513"]) == 2
    assert "--prompt-tokens: 513 exceed max_position_embeddings 512" in capsys.readouterr().err
    # A decoder's context also holds the tokens it generates: a Llama of
    # 2100 positions defaults to 2100 - 256 output tokens of prompt.
    config = json.loads(pathlib.Path("models/llama-3.2-1b/config.json").read_text())
    short = tmp_path / "short"
    short.mkdir()
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2100}))
    assert main(["energy", "--model", str(short), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == 2100 - 256
    # Without the key there is no limit: 2048 whatever the output.
    del config["max_position_embeddings"]
    (short / "config.json").write_text(json.dumps(config))
    for output in ("256", "4096"):
        assert main(["energy", "--model", str(short), "--output-tokens", output,
                     "--json", "-"]) == 0
        assert json.loads(capsys.readouterr().out)["prompt_tokens"] == 2048


def test_every_printed_figure_is_the_reports(tmp_path, capsys):
    """The lines after the table, on the 70B (two H100s hold its weights) with a
    batch of 2: each printed figure, to its 4 significant digits, is the
    written report's, and the per-token, per-MAC and throughput figures are
    those totals over every prompt token, GPU MAC and second."""
    path = tmp_path / "e.json"
    assert main(["energy", "--model", "models/llama-3.1-70b", "--prompt-tokens", "256",
                 "--batch", "2", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    opt, ref, cmp, split = data["optical"], data["gpu"], data["comparison"], data["disaggregated"]
    number = r"([-+0-9.e]+)"
    # Which version's numbers these are (GPU figures have changed between versions).
    from optical._version import RESULTS_VERSION

    assert (data["optical_version"], data["results_version"]) == (optical.__version__,
                                                                  RESULTS_VERSION)

    def figures(pattern):
        match = re.search(pattern, out)
        assert match, pattern
        return [float(v) for v in match.groups()]

    def close(value, expected):
        return value == pytest.approx(expected, rel=6e-4, abs=0)

    (power,) = figures(rf"lasers while streaming: {number} W electrical \(average\)")
    assert close(power, opt["laser_power_w"])
    assert close(power, opt["energy_j"]["components"]["laser"] / opt["time_s"]["streaming"])
    loads, streaming, digital, ttft, rate = figures(
        rf"time: mask loads {number} s \+ streaming {number} s \+ digital {number} s = "
        rf"TTFT {number} s; {number} tokens/s")
    for value, key in ((loads, "mask_load"), (streaming, "streaming"), (digital, "digital")):
        assert close(value, opt["time_s"][key]), key
    assert close(ttft, opt["ttft_s"]) and close(rate, 2 * 256 / opt["ttft_s"])
    tiles, rows = figures(rf"weight tiles: {number} \(reloaded every prefill\); "
                          rf"{number} rows per weight load")
    assert (tiles, rows) == (opt["counts"]["weight_tiles"], 2 * 256)
    (gpus,) = figures(r"GPU: H100 SXM x(\d+),")
    assert gpus == ref["gpus"] == 2
    flops, traffic = figures(rf"compute-bound: {number} FLOP, {number} B")
    assert close(flops, ref["flops"]) and close(traffic, ref["bytes"])
    energy, per_token, per_mac, macs, optical_per_mac, gpu_ttft = figures(
        rf"energy {number} J \({number} J/token, {number} pJ per MAC over its {number} MACs; "
        rf"optical {number} pJ over the same\), TTFT {number} s")
    assert close(energy, ref["energy_j"]["total"])
    assert close(per_token, ref["energy_j"]["total"] / (2 * 256))
    assert close(macs, ref["flops"] / 2)
    assert close(per_mac, ref["energy_j"]["total"] / (ref["flops"] / 2) * 1e12)
    assert f"{per_mac:.4g}" == "2.831"  # 700 W / (989 TFLOP/s x 50 %) x 2 FLOP per MAC
    assert close(optical_per_mac, opt["energy_j"]["total"] / (ref["flops"] / 2) * 1e12)
    assert close(gpu_ttft, ref["ttft_s"])
    e_ratio, t_ratio = figures(rf"GPU / optical: energy {number}x, TTFT {number}x")
    # Ratios are printed to 3 significant digits.
    assert e_ratio == pytest.approx(cmp["energy_ratio_gpu_over_optical"], rel=6e-3)
    assert t_ratio == pytest.approx(cmp["ttft_ratio_gpu_over_optical"], rel=6e-3)
    assert figures(r"break-even prompt tokens at this batch: (\d+)") == [cmp["break_even_tokens"]]
    all_gpu, disaggregated, ratio, gpus_all, gpus_split, machines = figures(
        rf"J/request all-GPU {number}, optical prefill \+ GPU decode {number} "
        rf"\(all-GPU / this {number}x\); GPUs (\d+) vs (\d+) \+ (\d+) optical machine")
    per = split["energy_per_request_j"]
    assert close(all_gpu, per["all_gpu"]["total"])
    assert close(disaggregated, per["disaggregated"]["total"])
    assert ratio == pytest.approx(split["ratio"], rel=6e-3)
    assert [gpus_all, gpus_split, machines] == [split["gpus"]["all_gpu"],
                                                split["gpus"]["disaggregated"],
                                                split["optical_machines"]]


def test_docs_energy_worked_example_is_what_the_command_prints(capsys, monkeypatch):
    """docs/energy.md's "Worked example" block is the output of the command it
    shows, line for line (the page's prose reads its figures off it)."""
    text = (DOCS / "energy.md").read_text(encoding="utf-8")
    lines = text.split("## Worked example", 1)[1].split("```", 2)[1].strip("\n").splitlines()
    command = lines[0].removeprefix("$ ").split()
    assert command[0] == "optical"
    monkeypatch.chdir(DOCS.parent)
    assert main(command[1:]) == 0
    assert capsys.readouterr().out.splitlines() == lines[1:]


def test_docs_energy_break_even_table_is_what_the_model_gives():
    """docs/energy.md's break-even table (iris-like, H100, one core, batch 1),
    row by row from the energy model."""
    from optical.energy import compare, model

    text = (DOCS / "energy.md").read_text(encoding="utf-8")
    lines = text[text.index("| model | prompt tokens | GPU / optical energy"):].splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in itertools.takewhile(lambda line: line.startswith("|"), lines[2:])]
    cfg, h100 = optical.presets.get("iris-like"), gpu.get_gpu("h100")
    assert len(rows) == 12
    for name, tokens, ratio, photons, batch, mask, laser, digital in rows:
        spec, n = read_spec(DOCS.parent / "models" / name), int(tokens)
        opt, ref = model.prefill(spec, n, cfg), gpu.prefill(spec, n, h100)
        share = {k: f"{100 * v / opt.total:.0f}%" for k, v in opt.components.items()}
        be_photons = compare.break_even_photons(spec, n, cfg, h100)
        assert f"{ref.energy / opt.total:.2f}" == ratio, (name, tokens)
        assert ("none" if be_photons is None else f"{be_photons:.2e}") == photons, (name, tokens)
        assert str(compare.break_even_batch(spec, n, cfg, h100)) == batch, (name, tokens)
        assert (share["mask_load"], share["laser"], share["digital"]) == (mask, laser, digital)


def test_a_faster_reload_is_printed_beside_resident_weights(tmp_path, capsys):
    """960 cores hold Llama-3.2-1B's 960 weight tiles, leaving optical
    attention's masks one core: the resident report (the lower energy) says
    that reloading every prefill would be faster, with its TTFT and energy."""
    path = tmp_path / "e.json"
    assert main(["energy", "--model", "models/llama-3.2-1b", "--prompt-tokens", "128",
                 "--set", "mapping.attention=optical", "--set", "energy.cores=960",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    opt = json.loads(path.read_text())["optical"]
    alt = opt["faster_if_reloaded"]
    assert opt["weights_resident"] and alt["ttft_s"] < opt["ttft_s"]
    assert alt["energy_j"] > opt["energy_j"]["total"]
    line = re.search(r"reloading the weights every prefill would be faster: TTFT ([0-9.e+-]+) s "
                     r"for ([0-9.e+-]+) J \(resident weights leave optical attention's masks "
                     r"1 core\(s\)\)", out)
    assert line, out
    assert float(line[1]) == pytest.approx(alt["ttft_s"], rel=6e-4)
    assert float(line[2]) == pytest.approx(alt["energy_j"], rel=6e-4)


def test_a_json_file_that_cannot_be_written_still_shows_the_report(tmp_path, capsys,
                                                                  monkeypatch):
    """--json is written first (a reader gone loses no report), but a full
    disk there printed nothing of the report: it is shown, then the error."""
    import errno

    from optical.commands import _common

    def full(path, write):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(_common, "write_output", full)
    argv = ["energy", "--model", "models/all-minilm-l6-v2", "--json",
            str(tmp_path / "e.json")]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert "optical prefill" in captured.out and "GPU / optical" in captured.out
    assert "No space left on device" in captured.err and "e.json" in captured.err


def test_a_report_is_read_only_and_shows_every_component_it_counts():
    """A style audit's `report.components["laser"] += 1` moved the frozen
    report's total from 1.151 to 2.151 J; an extension audit's component
    added with dataclasses.replace was in the total and left out of the
    figure's stack, which was labelled with the smaller sum."""
    import dataclasses
    import pickle

    pytest.importorskip("matplotlib")
    from optical.energy.plot import breakdown_figure

    spec, cfg = read_spec(MODEL), optical.presets.get("iris-like")
    opt = optical.energy.prefill(spec, PROMPT, cfg, model="llama-3.2-1b")
    total = opt.total
    with pytest.raises(TypeError):
        opt.components["laser"] += 1.0
    with pytest.raises(TypeError):  # nested mappings too
        opt.by_matmul["q_proj"]["laser"] = 1e9
    assert opt.total == total
    # still a dict to json, pandas and |: the read-only mappings are dict subclasses
    assert json.loads(json.dumps(opt.components)) == dict(opt.components)
    assert (opt.time | {"extra": 1.0})["extra"] == 1.0
    assert pickle.loads(pickle.dumps(opt)) == opt and hash(opt) == hash(pickle.loads(
        pickle.dumps(opt)))
    thermal = dataclasses.replace(opt, components={**opt.components, "thermal": total})
    assert thermal.total == pytest.approx(2 * total, rel=1e-12)
    assert thermal.component_names[-1] == "thermal"
    assert any(line.split()[0] == "thermal" for line in thermal.table().splitlines())
    assert str(thermal) == thermal.table()  # print(report): the table, as the CLI's
    assert repr(thermal).startswith("PrefillEnergy(model='llama-3.2-1b'")  # every field
    ref = gpu.prefill(spec, PROMPT, gpu.get_gpu("h100"))
    energy = breakdown_figure(thermal, ref).axes[0]
    (bar,) = {c.get_label(): c.patches for c in energy.containers}["thermal"]
    assert bar.get_height() == pytest.approx(total / PROMPT, rel=1e-12)
    assert energy.texts[0].get_text() == f"{thermal.per_token:.3g} J"


def test_the_gpu_presets_are_read_only():
    """A style finding carried for a dozen stops: ``energy.GPUS`` was a
    plain dict, so ``GPUS["h100"] = ...`` (a board of one's own written over
    the datasheet's) changed every later ``get_gpu("h100")`` and ``optical
    energy --gpu h100`` in the process. Another board is a GPUSpec of its own."""
    h100 = gpu.get_gpu("h100")
    slower = h100.replace(peak_flops=h100.peak_flops / 2)
    with pytest.raises(TypeError, match="read-only"):
        optical.energy.GPUS["h100"] = slower
    with pytest.raises(TypeError, match="read-only"):
        optical.energy.GPUS.pop("h200")
    assert gpu.get_gpu("h100") == h100 and set(optical.energy.GPUS) == {"h100", "h200"}
    spec = read_spec(MODEL)
    assert (gpu.prefill(spec, PROMPT, slower).time
            > gpu.prefill(spec, PROMPT, h100).time)  # a GPUSpec of one's own is used as given
