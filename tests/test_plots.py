"""Plots of sweep tables: what is drawn equals the seed averages computed here."""

import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

from matplotlib.container import ErrorbarContainer  # noqa: E402

from optical import plots  # noqa: E402


def data_lines(ax):
    """The data line of each errorbar series (not its caps)."""
    return [container.lines[0] for container in ax.containers]


def frame_of(rows, params):
    frame = pd.DataFrame(rows)
    frame.attrs["sweep"] = {"params": params}
    return frame


@pytest.fixture
def grid():
    rng = np.random.default_rng(0)
    rows = []
    for bits in (4, 6, 8):
        for photons in (10.0, 1e3, 1e5):
            for seed in range(3):
                rows.append({"point": 0, "seed": seed, "adc.bits": bits,
                             "source.photons_per_mac": photons,
                             "sqnr_db": 6.0 * bits + math.log10(photons) + rng.normal()})
    return frame_of(rows, ["adc.bits", "source.photons_per_mac"])


def test_the_y_label_says_over_how_many_seeds_each_point_is_a_mean(grid):
    """A point of one seed (an unfinished sweep) has no error bar; the label
    says so rather than leave it looking like a point without spread. NaN
    seeds do not count."""
    def ylabel(frame, **kwargs):
        fig = plots.line(frame, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 1e3},
                         **kwargs)
        return fig.axes[0].get_ylabel()

    assert ylabel(grid) == "sqnr_db (dB)\nmean ± std over 3 seeds"
    assert ylabel(grid, errorbars=False) == "sqnr_db (dB)\nmean over 3 seeds, no error bars"
    partial = grid[(grid["adc.bits"] != 4) | (grid["seed"] == 0)].copy()
    partial.attrs = grid.attrs
    assert ylabel(partial) == "sqnr_db (dB)\nmean ± std over 1-3 seeds (1 seed: no bar)"
    one_seed = grid[grid["seed"] == 0].copy()
    one_seed.attrs = grid.attrs
    assert ylabel(one_seed) == "sqnr_db (dB)\nmean over 1 seed"
    nan = grid.copy()
    nan.loc[(nan["adc.bits"] == 6) & (nan["seed"] == 2), "sqnr_db"] = np.nan
    assert ylabel(nan) == "sqnr_db (dB)\nmean ± std over 2-3 seeds"
    nan.loc[nan["adc.bits"] == 8, "sqnr_db"] = np.nan  # a point with no seed left: not "0-3"
    assert ylabel(nan) == "sqnr_db (dB)\nmean ± std over 2-3 seeds"


def test_summary_is_the_seed_mean_std_and_count_of_each_point(grid):
    """The numbers the figures draw, against pandas' own groupby: sample std,
    NaN seeds left out and counted, rows in the figures' order."""
    frame = grid.copy()
    frame.loc[(frame["adc.bits"] == 6) & (frame["seed"] == 1), "sqnr_db"] = np.nan
    table = plots.summary(frame, "sqnr_db", ["source.photons_per_mac", "adc.bits"])
    by = frame.groupby(["source.photons_per_mac", "adc.bits"])["sqnr_db"]
    expected = pd.DataFrame({"mean": by.mean(), "std": by.std(ddof=1), "seeds": by.count(),
                             "nan_seeds": by.size() - by.count()}).reset_index()
    pd.testing.assert_frame_equal(table, expected, check_dtype=False, rtol=1e-12)
    one = plots.summary(frame, "sqnr_db", ["adc.bits"], where={"source.photons_per_mac": 10.0})
    assert one["adc.bits"].tolist() == [4, 6, 8] and one["seeds"].tolist() == [3, 2, 3]
    lone = plots.summary(frame[frame["seed"] == 0], "sqnr_db", [],
                         where={"source.photons_per_mac": 10.0, "adc.bits": 8})
    assert lone.to_dict("records") == [{"mean": lone["mean"][0], "std": 0.0, "seeds": 1,
                                        "nan_seeds": 0}]
    with pytest.raises(ValueError, match="parameter source.photons_per_mac also varies"):
        plots.summary(frame, "sqnr_db", ["adc.bits"])
    with pytest.raises(TypeError, match=r"by: expected a sequence .* by=\['adc.bits'\]"):
        plots.summary(frame, "sqnr_db", "adc.bits")


def test_summary_keeps_a_swept_none_and_the_ints_beside_it(grid):
    """adc.bits swept over 4 and None (no ADC): the summary's rows (and
    `optical plot --json`'s data) say None and 4, as the sweep stored them;
    pandas made them NaN and 4.0, so the JSON read "nan" where the sweep
    meant "no ADC", and the field's type changed with the values swept."""
    import json

    from optical._sweep_store import encode

    frame = grid.copy()
    frame["adc.bits"] = frame["adc.bits"].astype(object).where(frame["adc.bits"] != 8, None)
    table = plots.summary(frame, "sqnr_db", ["adc.bits"], where={"source.photons_per_mac": 10.0})
    records = table.to_dict("records")
    assert [r["adc.bits"] for r in records] == [4, 6, None]
    assert [type(r["adc.bits"]) for r in records[:2]] == [int, int]
    assert json.loads(json.dumps(encode(records)))[2]["adc.bits"] is None
    mean = frame[(frame["adc.bits"].isna()) & (frame["source.photons_per_mac"] == 10.0)]
    assert records[2]["mean"] == pytest.approx(mean["sqnr_db"].mean())
    # without None the column keeps its numeric dtype (the figures' axes)
    assert plots.summary(grid, "sqnr_db", ["adc.bits"], where={"source.photons_per_mac": 10.0}
                         )["adc.bits"].dtype.kind == "i"


def test_plot_json_data_is_each_kind_s_summary(grid):
    """`optical plot --json` holds the figure's numbers: a heatmap's per cell,
    the bars' per matmul (the layer output last) and hue."""
    import argparse

    from optical.commands.plot import plotted_data

    def args(**kw):
        base = {"x": None, "y": None, "z": None, "hue": None, "where": []}
        return argparse.Namespace(**{**base, **kw})

    lines = plotted_data(grid, args(kind="line", x="adc.bits", y="sqnr_db",
                                    hue="source.photons_per_mac"))
    assert [(d["source.photons_per_mac"], d["adc.bits"]) for d in lines[:4]] == [
        (10.0, 4), (10.0, 6), (10.0, 8), (1e3, 4)]  # line by line, as drawn
    cells = plotted_data(grid, args(kind="heatmap", x="adc.bits", y="source.photons_per_mac",
                                    z="sqnr_db"))
    assert len(cells) == 9 and cells[1] == {
        "source.photons_per_mac": 10.0, "adc.bits": 6, "seeds": 3, "nan_seeds": 0,
        **plots.summary(grid, "sqnr_db", ["source.photons_per_mac", "adc.bits"])
        .iloc[1][["mean", "std"]].to_dict()}
    rows = [{"seed": seed, "adc.bits": bits, "sqnr_db": 20.0 + bits + seed,
             "sqnr_db.q_proj": 30.0 + bits} for bits in (4, 8) for seed in range(2)]
    bars = plotted_data(frame_of(rows, ["adc.bits"]), args(kind="bars", hue="adc.bits"))
    assert [(b["matmul"], b["adc.bits"], b["mean"]) for b in bars] == [
        ("q_proj", 4, 34.0), ("q_proj", 8, 38.0), ("layer output", 4, 24.5),
        ("layer output", 8, 28.5)]


def test_line_draws_seed_means_per_hue(grid):
    fig = plots.line(grid, "adc.bits", "sqnr_db", hue="source.photons_per_mac")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("adc.bits",
                                                  "sqnr_db (dB)\nmean ± std over 3 seeds")
    # A config field's unit from its docstring (OpticalConfig.field_unit); a
    # count (bits) or a metric has none.
    assert ax.get_legend().get_title().get_text() == "source.photons_per_mac\n(photons)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["10", "1000", "100000"]
    expected = grid.groupby(["source.photons_per_mac", "adc.bits"])["sqnr_db"].mean()
    for line, photons in zip(data_lines(ax), (10.0, 1e3, 1e5), strict=True):
        np.testing.assert_array_equal(line.get_xdata(), [4, 6, 8])
        np.testing.assert_allclose(line.get_ydata(), expected[photons].to_numpy(), rtol=1e-12)
    assert ax.get_xscale() == "linear"


def test_log_axis_for_decades_and_where(grid):
    fig = plots.line(grid, "source.photons_per_mac", "sqnr_db", where={"adc.bits": 6})
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and "adc.bits=6" in ax.get_title()
    assert ax.get_xlabel() == "source.photons_per_mac (photons)"  # the x axis's unit
    means = grid[grid["adc.bits"] == 6].groupby("source.photons_per_mac")["sqnr_db"].mean()
    np.testing.assert_allclose(data_lines(ax)[0].get_ydata(), means.to_numpy(), rtol=1e-12)


def test_error_bars_are_the_sample_standard_deviation_over_seeds(grid):
    """Each bar spans mean -+ the seeds' sample standard deviation (ddof=1, as
    pandas' std), in line plots and per-matmul bars alike."""
    fig = plots.line(grid, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 1e3})
    (container,) = fig.axes[0].containers
    rows = grid[grid["source.photons_per_mac"] == 1e3].groupby("adc.bits")["sqnr_db"]
    lows, highs = zip(*[(seg[0][1], seg[1][1]) for seg in container[2][0].get_segments()],
                      strict=True)
    np.testing.assert_allclose((np.array(highs) - np.array(lows)) / 2, rows.std().to_numpy(),
                               rtol=1e-12)
    np.testing.assert_allclose((np.array(highs) + np.array(lows)) / 2, rows.mean().to_numpy(),
                               rtol=1e-12)
    frame = frame_of([{"seed": s, "adc.bits": 8, "sqnr_db": v, "sqnr_db.q_proj": 2 * v}
                      for s, v in enumerate([1.0, 2.0, 6.0])], ["adc.bits"])
    (bars,) = [c for c in plots.matmul_bars(frame).axes[0].containers
               if isinstance(c, ErrorbarContainer)]
    half = [abs(seg[1][1] - seg[0][1]) / 2 for seg in bars[2][0].get_segments()]
    np.testing.assert_allclose(half, [2 * math.sqrt(7), math.sqrt(7)], rtol=1e-12)


@pytest.mark.parametrize(("path", "xs", "scale"), [
    ("source.photons_per_mac", (1.0, 10.0, 100.0), "log"),
    ("source.photons_per_mac", (2e4, 5e4, 1e5, 5e5), "log"),  # one decade of floats
    ("source.photons_per_mac", (1.0, 5.0, 9.9), "linear"),
    ("adc.bits", (2, 8, 16), "linear"),  # integers: two decades before a log axis
    ("core.inputs", (1, 10, 100), "log"),
])
def test_log_axis_for_two_decades_or_one_of_floats(path, xs, scale):
    """Positive x spanning two decades or more is drawn on a log axis, and so
    is a float parameter spanning one (2e4 and 5e4 photons collided on a
    linear axis up to 5e5); bit counts and other integers stay linear."""
    frame = frame_of([{"seed": 0, path: x, "sqnr_db": float(i)} for i, x in enumerate(xs)],
                     [path])
    ax = plots.line(frame, path, "sqnr_db").axes[0]
    assert ax.get_xscale() == scale, xs


def test_a_varying_parameter_is_never_averaged_silently(grid):
    with pytest.raises(ValueError, match=r"parameter source.photons_per_mac also varies"):
        plots.line(grid, "adc.bits", "sqnr_db")
    with pytest.raises(ValueError, match="no runs match"):
        plots.line(grid, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 7.0})
    with pytest.raises(ValueError, match="hue 'adc.bits' is the x parameter"):
        plots.line(grid, "adc.bits", "sqnr_db", hue="adc.bits")


def test_categorical_axis_for_none_and_inf():
    rows = [{"seed": s, "adc.bits": b, "source.photons_per_mac": p, "sqnr_db": float(i)}
            for i, (b, p) in enumerate([(None, math.inf), (8, math.inf), (None, 1e4), (8, 1e4)])
            for s in range(2)]
    frame = frame_of(rows, ["adc.bits", "source.photons_per_mac"])
    frame["adc.bits"] = pd.Series([r["adc.bits"] for r in rows], dtype=object)
    fig = plots.line(frame, "adc.bits", "sqnr_db", hue="source.photons_per_mac")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "None"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["10000", "inf"]
    np.testing.assert_array_equal(data_lines(ax)[0].get_ydata(), [3.0, 2.0])


def test_heatmap_cells_are_seed_means_with_blanks(grid):
    partial = grid[~((grid["adc.bits"] == 8) & (grid["source.photons_per_mac"] == 10.0))]
    fig = plots.heatmap(partial, "adc.bits", "source.photons_per_mac", "sqnr_db")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("adc.bits", "source.photons_per_mac (photons)")
    assert fig.axes[1].get_ylabel() == "sqnr_db (dB)\nmean over 3 seeds"  # a colour, no spread
    image = ax.get_images()[0].get_array()
    expected = partial.groupby(["source.photons_per_mac", "adc.bits"])["sqnr_db"].mean()
    assert image.mask[0, 2]  # (photons 10, 8 bits): not run
    np.testing.assert_allclose(image[1, 0], expected[(1e3, 4)], rtol=1e-12)
    assert len(ax.texts) == 8


def test_heatmap_cells_sit_under_their_labels_and_read_their_means():
    """Every cell against the records: the row's and column's tick labels
    name its point, the image holds the seed mean there, and its text (at
    column j, row i) reads that mean to three significant figures. An
    infinite mean is blank and annotated "inf"; y values rise upwards."""
    rows = [{"seed": s, "adc.bits": b, "dac.bits": d,
             "sqnr_db": math.inf if (b, d) == (8, 6) else 10.0 * b + 1.7 * d + 0.25 * s}
            for b in (4, 6, 8) for d in (6, 8) for s in (0, 1)]
    frame = frame_of(rows, ["adc.bits", "dac.bits"])
    ax = plots.heatmap(frame, "adc.bits", "dac.bits", "sqnr_db").axes[0]
    means = frame.groupby(["dac.bits", "adc.bits"])["sqnr_db"].mean()
    xs = [int(t.get_text()) for t in ax.get_xticklabels()]
    ys = [int(t.get_text()) for t in ax.get_yticklabels()]
    assert (xs, ys) == ([4, 6, 8], [6, 8])
    assert [t.get_position()[0] for t in ax.get_xticklabels()] == [0, 1, 2]
    assert [t.get_position()[1] for t in ax.get_yticklabels()] == [0, 1]
    image = ax.get_images()[0].get_array()
    texts = {tuple(int(round(c)) for c in t.get_position()): t.get_text() for t in ax.texts}
    assert len(texts) == len(ax.texts) == 6
    for i, d in enumerate(ys):
        for j, b in enumerate(xs):
            mean = means[(d, b)]
            if math.isinf(mean):
                assert image.mask[i, j] and texts[(j, i)] == "inf"
            else:
                assert image[i, j] == pytest.approx(mean, rel=1e-12)
                assert texts[(j, i)] == f"{mean:.3g}"  # e.g. 50.3, not 50
    assert texts[(0, 1)] == "53.7"  # adc 4, dac 8: 40 + 13.6 + 0.125
    low, high = ax.get_ylim()
    assert low < high


@pytest.mark.parametrize(("nx", "ny", "annotated"), [(12, 12, True), (13, 12, False),
                                                     (12, 13, False)])
def test_heatmaps_up_to_12_by_12_are_annotated(nx, ny, annotated):
    rows = [{"seed": 0, "adc.bits": x, "dac.bits": y, "sqnr_db": x + 0.01 * y}
            for x in range(1, nx + 1) for y in range(1, ny + 1)]
    ax = plots.heatmap(frame_of(rows, ["adc.bits", "dac.bits"]),
                       "adc.bits", "dac.bits", "sqnr_db").axes[0]
    assert len(ax.texts) == (nx * ny if annotated else 0)


def test_matmul_bars():
    rows = []
    for bits in (6, 8):
        for seed in range(2):
            rows.append({"seed": seed, "adc.bits": bits, "sqnr_db": 20.0 + bits + seed,
                         "sqnr_db.q_proj": 30.0 + bits, "sqnr_db.down_proj": 10.0 + bits + seed,
                         "cosine.q_proj": 0.9})
    frame = frame_of(rows, ["adc.bits"])
    fig = plots.matmul_bars(frame, "sqnr_db", hue="adc.bits")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["q_proj", "down_proj", "layer output"]
    heights = [p.get_height() for p in ax.patches]
    assert heights == [36.0, 16.5, 26.5, 38.0, 18.5, 28.5]
    assert ax.get_ylabel() == "sqnr_db (dB)\nmean ± std over 2 seeds"
    with pytest.raises(ValueError, match="parameter adc.bits also varies"):
        plots.matmul_bars(frame)


def test_plot_command_draws_the_bars_of_the_metric_asked_for():
    """``optical plot --kind bars --y cosine``: the per-matmul cosines (seed
    means), named after that metric; sqnr_db without --y."""
    import argparse

    from optical.commands.plot import make_figure

    rows = [{"seed": seed, "adc.bits": 6, "sqnr_db": 20.0 + seed, "sqnr_db.q_proj": 30.0,
             "cosine": 0.5 + 0.1 * seed, "cosine.q_proj": 0.9 + 0.02 * seed}
            for seed in range(2)]
    frame = frame_of(rows, ["adc.bits"])

    def bars(y):
        args = argparse.Namespace(kind="bars", x=None, y=y, z=None, hue=None, where=[])
        fig, name = make_figure(frame, args)
        ax = fig.axes[0]
        return name, ax.get_ylabel(), [p.get_height() for p in ax.patches]

    name, label, heights = bars("cosine")
    assert (name, label) == ("cosine-per-matmul", "cosine\nmean ± std over 2 seeds")
    assert heights == pytest.approx([0.91, 0.55], rel=1e-12)
    assert bars(None) == ("sqnr_db-per-matmul", "sqnr_db (dB)\nmean ± std over 2 seeds",
                          [30.0, 20.5])


def test_plot_command_file_names_hold_no_separator_from_a_held_value():
    """A value held with --where may be a path with spaces (a swept
    workload.model_dir): the figure's file name replaces them, so the figure
    lands in the plots directory, not in a subdirectory named after the path."""
    from optical.cli import build_parser
    from optical.commands.plot import make_figure

    rows = [{"seed": 0, "adc.bits": b, "workload.model_dir": m, "sqnr_db": b + len(m)}
            for b in (4, 6) for m in ("/m/a b", "/m/c")]
    args = build_parser().parse_args(["plot", "runs", "--x", "adc.bits", "--y", "sqnr_db",
                                      "--where", "workload.model_dir=/m/a b"])
    fig, name = make_figure(frame_of(rows, ["adc.bits", "workload.model_dir"]), args)
    assert name == "sqnr_db-vs-adc.bits-workload.model_dir=_m_a_b"
    np.testing.assert_array_equal(data_lines(fig.axes[0])[0].get_ydata(), [10, 12])


def test_a_malformed_where_is_refused_naming_it():
    """--where PATH=VALUE: no "=", a path given twice, a value the field does
    not take and an unknown path are each refused with the item quoted (a
    coverage audit found them untested)."""
    from optical.commands.plot import _where

    assert _where([" adc.bits = 8", "source.photons_per_mac=1e3"]) == {
        "adc.bits": 8, "source.photons_per_mac": 1e3}
    for items, message in [
            (["adc.bits"], "--where 'adc.bits': expected PATH=VALUE, e.g. adc.bits=8"),
            (["adc.bits=8", "adc.bits=6"], "--where adc.bits: given twice"),
            (["adc.bits=eight"], "--where 'adc.bits=eight': adc.bits"),
            (["adc.bitz=8"], "--where 'adc.bitz=8': unknown config path 'adc.bitz'")]:
        with pytest.raises(ValueError, match=re.escape(message)):
            _where(items)


def test_where_finds_a_stored_model_directory_given_relative_or_with_a_tilde(
        tmp_path, monkeypatch):
    """A sweep stores workload.model_dir resolved; --where matched that text
    alone, so `--where workload.model_dir=models/a` found no runs. A path
    given relative (to the working directory) or with ~ now selects the runs
    of the directory it names; a value that names none is refused, listing
    the stored ones."""
    a, b = tmp_path / "models" / "a", tmp_path / "models" / "b"
    rows = [{"seed": 0, "adc.bits": bits, "workload.model_dir": str(m), "sqnr_db": bits + i}
            for bits in (4, 6) for i, m in enumerate((a, b))]
    frame = frame_of(rows, ["adc.bits", "workload.model_dir"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "models"))
    for given in ("models/b", "./models/../models/b", "~/b", str(b)):
        fig = plots.line(frame, "adc.bits", "sqnr_db", where={"workload.model_dir": given})
        np.testing.assert_array_equal(data_lines(fig.axes[0])[0].get_ydata(), [5, 7])
    with pytest.raises(ValueError, match=r"where workload.model_dir='models/c': no runs "
                                         r"match; values: "):
        plots.line(frame, "adc.bits", "sqnr_db", where={"workload.model_dir": "models/c"})
    # on the command line, a directory whose name reads as a number or none
    from optical.commands.plot import _where

    (tmp_path / "8").mkdir()
    assert _where(["workload.model_dir=8", "workload.layer=8"]) == {
        "workload.model_dir": "8", "workload.layer": 8}
    assert _where(["workload.model_dir=9"]) == {"workload.model_dir": 9}  # no such directory


def test_save_writes_at_the_dpi_asked_and_needs_a_list_of_formats(grid, tmp_path):
    """A PNG's pixels are the figure's inches times ``dpi``; no format, or
    one format given as a string (whose letters are not formats), is refused
    as such."""
    from matplotlib.image import imread

    fig = plots.line(grid, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 10.0})
    width, height = fig.get_size_inches()
    for dpi in (50, 100):
        (path,) = plots.save(fig, tmp_path / f"fig{dpi}.png", dpi=dpi)
        assert imread(path).shape[:2] == (round(height * dpi), round(width * dpi))
    with pytest.raises(ValueError, match="^formats: no format given$"):
        plots.save(fig, tmp_path / "none", [])
    with pytest.raises(TypeError, match=r"^formats: expected a sequence of formats, got the "
                                        r"string 'png' \(one format: \['png'\]\)$"):
        plots.output_paths(tmp_path / "one", "png")
    assert not list(tmp_path.glob("none*")) and not list(tmp_path.glob("one*"))
    # An image suffix not written here is refused, not taken into the stem
    # (fig.jpg wrote fig.jpg.png and fig.jpg.svg); another dot is a stem's.
    for name in ("fig.jpg", "fig.TIFF", "fig.eps"):
        with pytest.raises(ValueError, match=rf"^{name}: \.{name[4:].lower()} figures are not "
                                             r"written here; valid: \.png, \.svg, \.pdf"):
            plots.output_paths(tmp_path / name)
    assert [p.name for p in plots.output_paths(tmp_path / "run.v2")] == ["run.v2.png",
                                                                         "run.v2.svg"]


def test_save_png_svg_without_pyplot(grid, tmp_path):
    fig = plots.line(grid, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 10.0})
    paths = plots.save(fig, tmp_path / "sub" / "fig")
    assert [p.name for p in paths] == ["fig.png", "fig.svg"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and paths[0].stat().st_size > 1000
    assert "<svg" in paths[1].read_text()
    # pyplot (global figure state, a GUI backend) is never imported: checked in
    # a fresh interpreter, since other tests of this process may import it.
    script = ("import sys, pandas as pd; from optical import plots; "
              "f = pd.DataFrame({'adc.bits': [4, 6], 'sqnr_db': [1.0, 2.0], 'seed': [0, 0]}); "
              "plots.save(plots.line(f, 'adc.bits', 'sqnr_db'), sys.argv[1]); "
              "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot imported'")
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "fresh")], check=True)
    assert (tmp_path / "fresh.png").stat().st_size > 1000


def test_no_finished_runs_is_said_before_any_column_check(grid):
    empty = frame_of([], ["adc.bits", "source.photons_per_mac"])
    for draw in (lambda: plots.line(empty, "adc.bits", "sqnr_db"),
                 lambda: plots.heatmap(empty, "adc.bits", "source.photons_per_mac", "sqnr_db"),
                 lambda: plots.matmul_bars(empty)):
        with pytest.raises(ValueError, match="^no finished runs to plot$"):
            draw()
    with pytest.raises(ValueError, match="^z 'snr' is not a metric of this sweep; metrics: "
                                         "sqnr_db$"):
        plots.heatmap(grid, "adc.bits", "source.photons_per_mac", "snr")
    with pytest.raises(ValueError, match=r"^y 'local_sqnr_db.down_proj' is not a metric of "
                                         r"this sweep \(local_\* metrics are recorded by a "
                                         r"layer sweep run with --local, .*\); metrics: sqnr_db$"):
        plots.line(grid, "adc.bits", "local_sqnr_db.down_proj",
                   where={"source.photons_per_mac": 10.0})
    # A sweep that has local_* metrics gets no --local hint for a misspelt one.
    local = grid.assign(**{"local_sqnr_db.down_proj": grid["sqnr_db"]})
    with pytest.raises(ValueError, match=r"^y 'local_sqnr_db.down' is not a metric of this "
                                         r"sweep; metrics: sqnr_db, local_sqnr_db.down_proj$"):
        plots.line(local, "adc.bits", "local_sqnr_db.down", where={"source.photons_per_mac": 10.0})


def test_a_metric_that_is_not_numbers_and_a_where_that_is_not_a_mapping_are_named(grid):
    # pandas' "could not convert string to float: 'a'" named no column, and
    # where= as (path, value) pairs got as far as the title.
    notes = grid.assign(note="a")
    with pytest.raises(TypeError, match=r"^y 'note': the column holds \w+ values, not real"):
        plots.line(notes.drop(columns="sqnr_db"), "adc.bits", "note",
                   where={"source.photons_per_mac": 10.0})
    with pytest.raises(TypeError, match="^where: expected a mapping of parameter paths"):
        plots.line(grid, "adc.bits", "sqnr_db", where=[("source.photons_per_mac", 10.0)])
    # A metric no finished run gave a value (None: an object column) is still
    # numbers, missing ones: plotted, not refused.
    assert plots.line(grid.assign(empty=None), "adc.bits", "empty",
                      where={"source.photons_per_mac": 10.0}) is not None


def test_save_takes_the_format_from_a_suffix(grid, tmp_path):
    fig = plots.line(grid, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 10.0})
    assert plots.save(fig, tmp_path / "a.pdf") == [tmp_path / "a.pdf"]
    assert (tmp_path / "a.pdf").read_bytes()[:4] == b"%PDF"
    assert plots.save(fig, tmp_path / "b.PNG", ["png", "svg"]) == [tmp_path / "b.png",
                                                                  tmp_path / "b.svg"]
    # Alone, the format its suffix names is written to the stem itself (on a
    # case-sensitive file system f.PNG is not f.png).
    assert plots.save(fig, tmp_path / "f.PNG") == [tmp_path / "f.PNG"]
    assert (tmp_path / "f.PNG").read_bytes()[:4] == b"\x89PNG"
    assert plots.save(fig, tmp_path / "c.v2") == [tmp_path / "c.v2.png", tmp_path / "c.v2.svg"]
    with pytest.raises(ValueError, match="d.png names the format png, but the formats are svg"):
        plots.save(fig, tmp_path / "d.png", ["svg"])
    with pytest.raises(ValueError, match="formats: 'gif' is not valid"):
        plots.save(fig, tmp_path / "e", ["gif"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.pdf", "b.png", "b.svg", "c.v2.png", "c.v2.svg", "f.PNG"]


def test_a_figure_that_cannot_be_written_whole_keeps_the_previous_one(grid, tmp_path,
                                                                      monkeypatch):
    """savefig wrote onto the figure itself: a kill or a full disk mid-write
    left a truncated PNG where the previous one was."""
    import errno

    fig = plots.line(grid, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 10.0})
    [path] = plots.save(fig, tmp_path / "f.png")
    before = path.read_bytes()
    real = type(fig).savefig

    def part(self, fname, **kwargs):  # a few bytes, then a full disk
        pathlib.Path(fname).write_bytes(b"\x89PNG\r\n")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(type(fig), "savefig", part)
    with pytest.raises(OSError, match=r"No space left on device while writing it.*f\.png"):
        plots.save(fig, path)
    monkeypatch.setattr(type(fig), "savefig", real)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["f.png"]  # no temporary file left


def test_missing_matplotlib_names_the_install_command(grid, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ImportError, match=r"plots need matplotlib: pip install 'optical\[plot\]'"):
        plots.line(grid, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 10.0})


def test_heatmap_takes_its_metric_as_z_or_by_its_former_name(grid):
    by_z = plots.heatmap(grid, "adc.bits", "source.photons_per_mac", z="sqnr_db")
    by_value = plots.heatmap(grid, "adc.bits", "source.photons_per_mac", value="sqnr_db")
    a, b = (np.asarray(f.axes[0].images[0].get_array()) for f in (by_z, by_value))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="not both"):
        plots.heatmap(grid, "adc.bits", "source.photons_per_mac", "sqnr_db", value="sqnr_db")
    with pytest.raises(TypeError, match="missing the metric to plot, z"):
        plots.heatmap(grid, "adc.bits", "source.photons_per_mac")


# --------------------------------------------------------------------------- #
# What the reader sees: scales, tick labels, colours, non-finite means


def drawn(fig):
    """Draw ``fig`` (on an Agg canvas of its own, not pyplot's) and return its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def shown_xlabels(fig, ax, renderer=None):
    """(texts, boxes) of the x tick labels drawn with text, left to right."""
    renderer = renderer or drawn(fig)
    labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    return [t.get_text() for t in labels], [t.get_window_extent(renderer) for t in labels]


def one_param(path, xs, metric="sqnr_db", values=None, seeds=1):
    values = values if values is not None else [float(i) for i in range(len(xs))]
    return frame_of([{"seed": s, path: x, metric: v + 0.1 * s}
                     for x, v in zip(xs, values, strict=True) for s in range(seeds)], [path])


@pytest.mark.parametrize(("path", "xs", "scale", "labels"), [
    # 0 beside decades of read noise: symlog, linear below the smallest positive value
    ("detector.read_noise_electrons", [0.0, 10.0, 100.0, 1e3, 1e4, 1e5], "symlog",
     ["0", "10", "100", "1000", "10000", "100000"]),
    # powers of two under two decades: a base-2 log axis spaces them evenly
    ("core.inputs", [8, 16, 32, 64, 128, 256, 512], "log",
     ["8", "16", "32", "64", "128", "256", "512"]),
    ("core.inputs", [1, 2, 4, 8, 16], "log", ["1", "2", "4", "8", "16"]),  # 1 = 2**0
    # even integers that are not powers of two, under two decades: linear
    ("core.inputs", [12, 24, 48, 96, 192], "linear", ["12", "24", "48", "96", "192"]),
    # a log axis with ticks at the values, and no others (no minor ticks)
    ("source.photons_per_mac", [10.0, 30.0, 100.0, 300.0, 1000.0], "log",
     ["10", "30", "100", "300", "1000"]),
    # twelve log-spaced floats: matplotlib's decades, not twelve colliding labels
    ("source.photons_per_mac", list(np.logspace(1, 6, 12)), "log", None),
    # categorical (inf present): values formatted with :g, not str(), in one style:
    # 1e+06 beside 100000 puts every finite one in exponent form
    ("source.photons_per_mac", [100.0, 10 ** 2.5, 1e3, 1e4, 1e5, 1e6, math.inf], "linear",
     ["1e2", "3.16228e2", "1e3", "1e4", "1e5", "1e6", "inf"]),
    ("source.photons_per_mac", [100.0, 10 ** 2.5, 1e3, 1e4, 1e5, math.inf], "linear",
     ["100", "316.228", "1000", "10000", "100000", "inf"]),
    # twelve long labels on a linear axis (under a decade): colliding ones are left out
    ("source.photons_per_mac", [float(v) for v in np.linspace(1e4, 9e4, 12)], "linear", None),
])
def test_x_tick_labels_never_overlap(path, xs, scale, labels):
    """Tick labels as drawn do not overlap their neighbours (read noise 0,
    10, ..., 1e5 on a linear axis, 8 ... 512 inputs and twelve log-spaced
    photon counts all overprinted), and read as the values (":g")."""
    fig = plots.line(one_param(path, xs), path, "sqnr_db")
    ax = fig.axes[0]
    assert ax.get_xscale() == scale
    texts, boxes = shown_xlabels(fig, ax)
    assert len(texts) >= 3
    for left, right in zip(boxes, boxes[1:], strict=False):
        assert left.x1 < right.x0, texts
    if labels is not None:
        assert texts == labels
        assert len(ax.xaxis.get_minorticklocs()) == 0  # ticks at the values alone
    if path == "core.inputs" and scale == "log":
        assert ax.xaxis.get_transform().base == 2
    if scale == "symlog":
        assert ax.xaxis.get_transform().linthresh == 10.0


def test_a_crowded_axis_keeps_its_ends_and_its_inf():
    """Thirteen log-spaced photon counts and inf on a categorical axis: the
    crowded labels are thinned, but the ends stay named, inf above all (kept
    left to right, "100000" hid it, and the infinite-photon point read as one
    more step of the finite sweep)."""
    for tail in (["inf"], ["inf", "None"]):  # inf an end, and not (None is last)
        xs = [*np.geomspace(100, 1e5, 13).tolist(), math.inf, None][:13 + len(tail)]
        fig = plots.line(one_param("source.photons_per_mac", xs), "source.photons_per_mac",
                         "sqnr_db")
        texts, boxes = shown_xlabels(fig, fig.axes[0])
        assert texts[0] == "100" and texts[-len(tail):] == tail, texts
        assert 3 <= len(texts) < len(xs), texts
        for left, right in zip(boxes, boxes[1:], strict=False):
            assert left.x1 < right.x0, texts


def test_a_line_of_only_infinite_means_has_no_y_scale():
    """Every mean infinite (an exact 1 x 1 product): the only marks are the
    "inf" triangles; y tick labels of -0.06 ... 0.06 dB read as data."""
    fig = plots.line(one_param("adc.bits", [2, 4, 8], values=[math.inf] * 3), "adc.bits",
                     "sqnr_db")
    drawn(fig)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()] == []
    assert [t.get_text() for t in fig.axes[0].texts] == ["inf"] * 3
    fig = plots.line(one_param("adc.bits", [2, 4, 8], values=[math.inf, 3.0, 5.0]), "adc.bits",
                     "sqnr_db")
    drawn(fig)
    assert any(t.get_text() for t in fig.axes[0].get_yticklabels())  # a finite mean: a scale
    # Bars and a heatmap's colour bar alike.
    rows = [{"seed": 0, "adc.bits": 4, "sqnr_db": math.inf, "sqnr_db.q_proj": math.inf,
             "sqnr_db.k_proj": math.inf}]
    fig = plots.matmul_bars(frame_of(rows, ["adc.bits"]), "sqnr_db")
    drawn(fig)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()] == []
    rows = [{"seed": 0, "adc.bits": b, "dac.bits": d, "sqnr_db": math.inf}
            for b in (4, 8) for d in (6, 8)]
    fig = plots.heatmap(frame_of(rows, ["adc.bits", "dac.bits"]), "adc.bits", "dac.bits",
                        "sqnr_db")
    drawn(fig)
    assert [t.get_text() for t in fig.axes[1].get_yticklabels() if t.get_text()] == []


def test_heatmap_title_does_not_run_into_the_y_label():
    """Four NaN seeds (a five-line title) over a 2 x 4 grid whose y label is
    a long config path with its unit: the title took the axes' height until
    the y label was taller than the axes and ran into it."""
    nan_at = {(4, 1e4, 0), (8, 1e5, 0), (8, 1e5, 1), (8, 1e3, 0)}
    rows = [{"seed": s, "adc.bits": b, "source.photons_per_mac": p,
             "sqnr_db": math.nan if (b, p, s) in nan_at else 6.0 * b + s}
            for b in (4, 8) for p in (1e3, 1e4, 1e5, math.inf) for s in range(2)]
    frame = frame_of(rows, ["adc.bits", "source.photons_per_mac"])
    # Held values and a stored sweep's heading add lines too long for the
    # figure's width: matplotlib wrapped them when drawn, past the room the
    # layout had made (the first line cut off at the top, the y label run into).
    held = {"source.photons_per_mac": 3000.0, "core.inputs": 64, "core.outputs": 64,
            "adc.full_scale": 2.0, "detector.dark_electrons": 0.0}
    nan_at = {(6, 0.5), (8, 2.5), (4, 2.5)}
    rows = [{"seed": s, "adc.bits": b, "detector.read_noise_electrons": r, **held,
             "sqnr_db": math.nan if (b, r) in nan_at and s == 0 else 30.0 + s + r}
            for b in (4, 6, 8, 10) for r in (0.5, 2.5) for s in range(2)]
    wide = frame_of(rows, ["adc.bits", "detector.read_noise_electrons", *held])
    wide.attrs["sweep"].update(workload="llama-3.2-1b layer 0, 64 tokens, batch 4, data seed 7",
                               base="iris-like")
    for fig in (plots.heatmap(frame, "adc.bits", "source.photons_per_mac", "sqnr_db"),
                plots.heatmap(wide, "adc.bits", "detector.read_noise_electrons", "sqnr_db",
                              where=held)):
        renderer = drawn(fig)
        ax = fig.axes[0]
        assert ax.get_title().count("\n") >= 3
        title = ax.title.get_window_extent(renderer)
        assert not title.overlaps(ax.yaxis.label.get_window_extent(renderer))
        assert fig.bbox.contains(title.x0, title.y1) and fig.bbox.contains(title.x1, title.y0)


def test_log_y_for_a_metric_spanning_decades():
    """Positive means spanning two decades or more get a log y axis (line)
    and a log colour scale (heatmap): relative errors from 1e-3 to 1 sat on
    the floor of a linear axis. One decade, a sign change or decibels (a
    log scale already) stay linear."""
    errors = [1.0, 0.1, 0.01, 0.001]
    frame = one_param("adc.bits", [2, 4, 6, 8], "relative_error", errors)
    ax = plots.line(frame, "adc.bits", "relative_error").axes[0]
    assert ax.get_yscale() == "log"
    np.testing.assert_allclose(data_lines(ax)[0].get_ydata(), errors, rtol=1e-12)
    for metric, values in [("relative_error", [1.0, 0.5, 0.1, 0.02]),  # 1.7 decades
                           ("relative_error", [1.0, 0.1, -0.01, 0.001]),
                           ("sqnr_db", [0.5, 5.0, 30.0, 60.0]),
                           ("update.sqnr_db", [0.4, 12.0, 55.0, 60.0])]:  # validate's update
        frame = one_param("adc.bits", [2, 4, 6, 8], metric, values)
        assert plots.line(frame, "adc.bits", metric).axes[0].get_yscale() == "linear", values
    rows = [{"seed": 0, "adc.bits": b, "source.photons_per_mac": p,
             "relative_error": 10.0 ** -(b / 2) * 1e3 / p}
            for b in (4, 8) for p in (1e3, 1e4, 1e5)]
    fig = plots.heatmap(frame_of(rows, ["adc.bits", "source.photons_per_mac"]),
                        "source.photons_per_mac", "adc.bits", "relative_error")
    from matplotlib.colors import LogNorm

    norm = fig.axes[0].get_images()[0].norm
    assert isinstance(norm, LogNorm)
    assert (norm.vmin, norm.vmax) == pytest.approx((1e-6, 1e-2), rel=1e-12)
    drawn(fig)


def test_numeric_hues_take_distinct_ordered_colours():
    """Twelve hue values: twelve colours (tab10 repeated two of them), from a
    sequential colormap in the order of the values; twelve categorical hues
    likewise differ."""
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    photons = list(np.logspace(1, 6, 12))
    rows = [{"seed": 0, "adc.bits": b, "source.photons_per_mac": p, "sqnr_db": b + i}
            for b in (4, 8) for i, p in enumerate(photons)]
    fig = plots.line(frame_of(rows, ["adc.bits", "source.photons_per_mac"]), "adc.bits",
                     "sqnr_db", hue="source.photons_per_mac")
    colours = [to_rgba(line.get_color()) for line in data_lines(fig.axes[0])]
    assert len(set(colours)) == 12
    viridis = colormaps["viridis"]
    assert colours[0] == pytest.approx(viridis(0.0)) and colours[-1] == pytest.approx(
        viridis(0.85))
    categorical = [*photons[:11], math.inf]  # inf: not all finite numbers, so categorical
    rows = [{"seed": 0, "adc.bits": b, "source.photons_per_mac": p, "sqnr_db": b + i}
            for b in (4, 8) for i, p in enumerate(categorical)]
    fig = plots.line(frame_of(rows, ["adc.bits", "source.photons_per_mac"]), "adc.bits",
                     "sqnr_db", hue="source.photons_per_mac")
    assert len({to_rgba(line.get_color()) for line in data_lines(fig.axes[0])}) == 12


def layer_rows(hues, matmuls, seeds=1, value=lambda h, m, s: 10.0 + h + m):
    return frame_of([{"seed": s, "source.photons_per_mac": h,
                      **{f"sqnr_db.m{m}": value(h, m, s) for m in range(matmuls)},
                      "sqnr_db": value(h, matmuls, s)}
                     for h in hues for s in range(seeds)], ["source.photons_per_mac"])


def test_matmul_bars_count_the_seeds_left_after_nan():
    """The y label counts the seeds each bar averages: a matmul that lost a
    seed to NaN makes it "2-3 seeds", and its bar is the mean of the two."""
    rows = [{"seed": s, "sqnr_db.q_proj": [30.0, 31.0, math.nan][s],
             "sqnr_db.k_proj": 31.0 + s, "sqnr_db": 25.0 + s} for s in range(3)]
    ax = plots.matmul_bars(frame_of(rows, [])).axes[0]
    assert [p.get_height() for p in ax.patches] == [30.5, 32.0, 26.0]
    assert ax.get_ylabel() == "sqnr_db (dB)\nmean ± std over 2-3 seeds"


def test_wrapped_matmul_bars_share_one_y_scale_and_label_the_bottom_row():
    """Rows of wrapped bars share the y axis (bars on two rows compare by
    height), and "matmul" labels the bottom row's x axis alone."""
    hues = list(np.logspace(2, 7, 12))
    rows = layer_rows(hues, 8, value=lambda h, m, s: 10.0 + m if m < 5 else 45.0 + m)
    fig = plots.matmul_bars(rows, hue="source.photons_per_mac")
    assert len(fig.axes) == 2
    assert fig.axes[0].get_ylim() == fig.axes[1].get_ylim()
    assert fig.axes[0].get_ylim()[1] > 53  # the layer output's 53 on the second row
    assert [ax.get_xlabel() for ax in fig.axes] == ["", "matmul"]


def test_a_hue_of_one_value_draws_one_line():
    """A hue held at one value (a sweep narrowed by --where) is one line with
    one legend entry."""
    frame = one_param("adc.bits", [4, 6, 8])
    frame["source.photons_per_mac"] = 1e3
    frame.attrs["sweep"] = {"params": ["adc.bits", "source.photons_per_mac"]}
    ax = plots.line(frame, "adc.bits", "sqnr_db", hue="source.photons_per_mac").axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["1000"]
    np.testing.assert_array_equal(data_lines(ax)[0].get_ydata(), [0.0, 1.0, 2.0])


def test_matmul_bars_with_many_hues_wrap_rather_than_widen():
    """Twelve hue values over nine bars made a 60-inch-wide figure: now at
    most 14 inches, the matmuls wrapped onto rows with bars of one width,
    every matmul still labelled and every bar drawn."""
    hues = list(np.logspace(2, 7, 12))
    fig = plots.matmul_bars(layer_rows(hues, 8), hue="source.photons_per_mac")
    width, _ = fig.get_size_inches()
    assert width <= 14
    shown = [t.get_text() for ax in fig.axes if ax.get_xlabel() or ax.get_ylabel()
             for t in ax.get_xticklabels()]
    assert shown == [f"m{m}" for m in range(8)] + ["layer output"]
    patches = [p for ax in fig.axes for p in ax.patches]
    assert len(patches) == 12 * 9
    renderer = drawn(fig)
    assert len({round(p.get_window_extent(renderer).width, 6) for p in patches}) == 1
    assert min(p.get_window_extent(renderer).width for p in patches) >= 0.09 * fig.dpi


@pytest.mark.parametrize("n_hues", [27, 41])
def test_wrapped_matmul_bars_leave_no_row_empty(n_hues):
    """Rounding the matmuls per row up must not leave a last row of axes
    without bars (10 bars with 41 hues drew 6 axes, one of them empty)."""
    fig = plots.matmul_bars(layer_rows(list(np.logspace(2, 7, n_hues)), 9),
                            hue="source.photons_per_mac")
    rows = [ax for ax in fig.axes if ax.get_ylabel().startswith("sqnr_db (dB)")]
    assert len(rows) > 1 and all(ax.patches for ax in rows)


def test_zero_spreads_draw_no_error_bars():
    """Equal seeds (or one seed) have no spread: no zero-length caps, in bars
    or lines; where some spreads are not zero, only those are drawn."""
    fig = plots.matmul_bars(layer_rows([1e3], 2, seeds=2, value=lambda h, m, s: 1.0 + m))
    assert not [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]
    frame = one_param("adc.bits", [4, 6, 8], values=[1.0, 2.0, 3.0], seeds=2)
    frame.loc[frame["adc.bits"] == 6, "sqnr_db"] = 2.0  # equal seeds at 6 bits
    (container,) = plots.line(frame, "adc.bits", "sqnr_db").axes[0].containers
    segments = container[2][0].get_segments()
    assert [len(s) for s in segments] == [2, 0, 2]
    # equal seeds whose float64 std is not 0 (three of 56.83792588989611: 8.7e-15,
    # a metrics audit): no spread either
    three = one_param("adc.bits", [4, 6], values=[1.0, 2.0], seeds=3)
    three.loc[three["adc.bits"] == 6, "sqnr_db"] = 56.83792588989611
    assert np.std(np.full(3, 56.83792588989611), ddof=1) > 0
    assert plots.summary(three, "sqnr_db", ["adc.bits"])["std"].tolist()[1] == 0.0


def test_the_legend_sits_outside_the_data():
    """The legend is drawn beside the axes, never over them."""
    rows = [{"seed": 0, "adc.bits": b, "source.photons_per_mac": p, "sqnr_db": b * p}
            for b in (4, 6, 8) for p in (1.0, 2.0, 3.0)]
    line = plots.line(frame_of(rows, ["adc.bits", "source.photons_per_mac"]), "adc.bits",
                      "sqnr_db", hue="source.photons_per_mac")
    bars = plots.matmul_bars(layer_rows([1e3, 1e4, 1e5], 3), hue="source.photons_per_mac")
    for fig in (line, bars):
        renderer = drawn(fig)
        ax = fig.axes[0]
        legend, axes = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend.x0 > axes.x1
        assert fig.bbox.contains(legend.x1 - 1, legend.y0 + 1)  # and on the figure


def test_nan_seeds_are_left_out_of_the_mean_and_named():
    """One NaN seed no longer hides a point: the mean of the other seeds is
    drawn, and the title says which point lost how many seeds; a point with
    no seed left is a gap, said too. No RuntimeWarning (errors here)."""
    frame = one_param("adc.bits", [4, 6, 8], values=[1.0, 2.0, 3.0], seeds=2)
    frame.loc[(frame["adc.bits"] == 6) & (frame["seed"] == 1), "sqnr_db"] = math.nan
    frame.loc[frame["adc.bits"] == 8, "sqnr_db"] = math.nan
    fig = plots.line(frame, "adc.bits", "sqnr_db")
    ax = fig.axes[0]
    np.testing.assert_array_equal(data_lines(ax)[0].get_ydata(), [1.05, 2.0, math.nan])
    assert ax.get_title().replace("\n", " ") == (
        "NaN seeds left out of the mean: adc.bits=6 (1 of 2); adc.bits=8 (2 of 2, no mean)")
    low, high = ax.get_xlim()  # the point with no mean stays on the axis
    assert low < 4 and high > 8
    rows = layer_rows([1e3], 2, seeds=2, value=lambda h, m, s: math.nan if s else 5.0 + m)
    ax = plots.matmul_bars(rows).axes[0]
    assert [p.get_height() for p in ax.patches] == [5.0, 6.0, 7.0]
    assert ax.get_title().replace("\n", " ").startswith(
        "NaN seeds left out of the mean: m0 (1 of 2); m1 (1 of 2)")
    drawn(fig)


def test_an_infinite_mean_is_marked_at_the_edge():
    """An exact result (infinite SQNR) was an empty slot, like a missing run:
    now a triangle at the top edge of the axes labelled "inf", above every
    finite point, in lines and bars alike."""
    frame = one_param("adc.bits", [4, 6, 8], values=[10.0, 20.0, math.inf], seeds=2)
    fig = plots.line(frame, "adc.bits", "sqnr_db")
    ax = fig.axes[0]
    drawn(fig)
    (mark,) = [line for line in ax.lines if line.get_marker() == "^"]
    assert list(mark.get_xdata()) == [8]
    assert mark.get_transform() == ax.get_xaxis_transform()  # y in axes units
    (y,) = mark.get_ydata()
    top_point = ax.transLimits.transform((6, 20.1))[1]  # the highest finite mean
    assert y > top_point and y <= 1
    assert [t.get_text() for t in ax.texts] == ["inf"]
    rows = layer_rows([1e3, 1e4], 2, value=lambda h, m, s: math.inf if h > 5e3 and m == 0
                      else 10.0 + m)
    ax = plots.matmul_bars(rows, hue="source.photons_per_mac").axes[0]
    (mark,) = [line for line in ax.lines if line.get_marker() == "^"]
    assert mark.get_xdata()[0] == pytest.approx(0.2)  # the second hue's bar of m0
    assert [t.get_text() for t in ax.texts] == ["inf"]
    assert len(ax.patches) == 5


def test_crosstalk_example_figure_uses_no_pyplot_and_labels_its_axes(tmp_path):
    """examples/crosstalk_vs_optics.py leaves the caller's backend alone (it
    called matplotlib.use("Agg")) and labels at least three x ticks of each
    log axis (a one-decade sweep showed a single "10^2")."""
    import importlib.util
    from pathlib import Path

    import matplotlib

    path = Path(__file__).parents[1] / "examples" / "crosstalk_vs_optics.py"
    spec = importlib.util.spec_from_file_location("crosstalk_vs_optics_plot", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rows = np.column_stack([np.geomspace(1e-8, 1e-2, 6), np.geomspace(1e-3, 1e-1, 6),
                            np.geomspace(1e-6, 1e-2, 6), np.geomspace(0.05, 0.9, 6)])
    results = {"focal length": (np.geomspace(50.8, 406.4, 6), rows),
               "aperture": (np.geomspace(3.125, 50, 6), rows)}
    before = matplotlib.get_backend()
    try:
        matplotlib.use("svg")
        fig = example.plot(results, str(tmp_path / "fig.png"))
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    assert (tmp_path / "fig.png").read_bytes()[:4] == b"\x89PNG"
    renderer = drawn(fig)
    for ax in fig.axes:
        texts, boxes = shown_xlabels(fig, ax, renderer)
        assert len(texts) >= 3, texts
        assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False))


# --------------------------------------------------------------------------- #
# The rules' edges (each case a rule of line's or heatmap's docstring)


@pytest.mark.parametrize(("xs", "scale"), [
    ((3, 10, 30), "linear"),    # integers over one decade, not powers of two: linear
    ((2, 8, 32), "log"),        # powers of two over a decade: base 2
    ((2, 4, 8), "linear"),      # powers of two under a decade: linear
])
def test_integer_x_over_one_decade_stays_linear_unless_powers_of_two(xs, scale):
    """Integers (not powers of two) go log only past two decades; integer
    powers of two spanning a decade get a base-2 log axis."""
    ax = plots.line(one_param("core.inputs", xs), "core.inputs", "sqnr_db").axes[0]
    assert ax.get_xscale() == scale, xs
    if scale == "log":
        assert ax.xaxis.get_transform().base == 2


def test_zero_beside_one_decade_is_linear_not_symlog():
    """symlog only where 0 sits beside positive values spanning two decades."""
    path = "detector.read_noise_electrons"
    ax = plots.line(one_param(path, [0.0, 1.0, 5.0, 10.0]), path, "sqnr_db").axes[0]
    assert ax.get_xscale() == "linear"
    ax = plots.line(one_param(path, [0.0, 1.0, 10.0, 100.0]), path, "sqnr_db").axes[0]
    assert ax.get_xscale() == "symlog"


def test_ticks_sit_at_the_values_up_to_twelve_and_six_on_a_log_axis():
    """Ticks at the values for at most 12 of them (linear) or 6 (log); past
    that matplotlib's own ticks (decades on a log axis)."""
    path = "source.photons_per_mac"
    for n in (12, 13):
        xs = [float(v) for v in np.linspace(1.0, 2.0, n)]
        ax = plots.line(one_param(path, xs), path, "sqnr_db").axes[0]
        assert ax.get_xscale() == "linear"
        at_values = len(ax.get_xticks()) == n and np.allclose(ax.get_xticks(), xs, rtol=0,
                                                              atol=1e-12)
        assert at_values == (n <= 12), n
    six = [1.0, 3.0, 10.0, 30.0, 100.0, 300.0]
    for xs in (six, [*six, 1000.0]):
        fig = plots.line(one_param(path, xs), path, "sqnr_db")
        ax = fig.axes[0]
        drawn(fig)
        assert ax.get_xscale() == "log"
        ticks = [t for t in ax.get_xticks() if xs[0] <= t <= xs[-1]]
        if len(xs) <= 6:
            np.testing.assert_allclose(ticks, xs, rtol=1e-12)
        else:
            assert all(float(np.log10(t)).is_integer() for t in ticks), ticks


def test_log_y_rule_edges_zero_and_per_matmul_decibels():
    """Not all positive (a 0 among decades) stays linear, and so does a
    per-matmul decibel metric (``sqnr_db.q_proj``: the metric before the dot
    is in dB)."""
    for metric, values in [("relative_error", [0.0, 0.001, 0.1, 1.0]),
                           ("sqnr_db.q_proj", [0.5, 5.0, 30.0, 60.0])]:
        frame = one_param("adc.bits", [2, 4, 6, 8], metric, values)
        assert plots.line(frame, "adc.bits", metric).axes[0].get_yscale() == "linear", metric


def test_two_numeric_hues_take_the_ends_of_the_sequential_colormap():
    from matplotlib import colormaps
    from matplotlib.colors import to_rgba

    rows = [{"seed": 0, "adc.bits": b, "source.photons_per_mac": p, "sqnr_db": b + p}
            for b in (4, 8) for p in (1e3, 1e4)]
    fig = plots.line(frame_of(rows, ["adc.bits", "source.photons_per_mac"]), "adc.bits",
                     "sqnr_db", hue="source.photons_per_mac")
    colours = [to_rgba(line.get_color()) for line in data_lines(fig.axes[0])]
    viridis = colormaps["viridis"]
    assert colours[0] == pytest.approx(viridis(0.0))
    assert colours[1] == pytest.approx(viridis(0.85))


def test_a_minus_infinite_mean_is_marked_at_the_bottom_edge():
    """-inf: a downward triangle at the bottom edge, below every finite
    point, labelled "-inf"."""
    frame = one_param("adc.bits", [4, 6, 8], values=[10.0, 20.0, -math.inf], seeds=2)
    fig = plots.line(frame, "adc.bits", "sqnr_db")
    ax = fig.axes[0]
    drawn(fig)
    (mark,) = [line for line in ax.lines if line.get_marker() == "v"]
    assert not [line for line in ax.lines if line.get_marker() == "^"]
    assert list(mark.get_xdata()) == [8]
    (y,) = mark.get_ydata()
    bottom_point = ax.transLimits.transform((4, 10.0))[1]  # the lowest finite mean
    assert 0 <= y < bottom_point
    assert [t.get_text() for t in ax.texts] == ["-inf"]


def test_infinite_means_of_two_hues_at_one_x_share_one_label():
    rows = [{"seed": 0, "adc.bits": b, "source.photons_per_mac": p,
             "sqnr_db": math.inf if b == 8 else float(b)}
            for b in (4, 6, 8) for p in (1e3, 1e4)]
    fig = plots.line(frame_of(rows, ["adc.bits", "source.photons_per_mac"]), "adc.bits",
                     "sqnr_db", hue="source.photons_per_mac")
    ax = fig.axes[0]
    assert len([line for line in ax.lines if line.get_marker() == "^"]) == 2
    assert [t.get_text() for t in ax.texts] == ["inf"]


def test_plus_and_minus_infinite_seeds_have_no_mean():
    """Seeds of +inf and -inf at one point: no mean (a gap, no mark)."""
    frame = one_param("adc.bits", [4, 6, 8], values=[1.0, 2.0, 0.0], seeds=2)
    frame.loc[frame["adc.bits"] == 8, "sqnr_db"] = [math.inf, -math.inf]
    ax = plots.line(frame, "adc.bits", "sqnr_db").axes[0]
    np.testing.assert_array_equal(data_lines(ax)[0].get_ydata(), [1.05, 2.05, math.nan])
    assert not [line for line in ax.lines if line.get_marker() in ("^", "v")]
    assert not ax.texts


def test_nan_seeds_title_names_three_points_then_a_count_in_lines_of_80():
    """Four points with a NaN seed: three named, then "1 more"; the title
    broken between points into lines of at most 80 characters."""
    frame = one_param("adc.bits", [2, 4, 6, 8], values=[1.0, 2.0, 3.0, 4.0], seeds=2)
    frame.loc[frame["seed"] == 1, "sqnr_db"] = math.nan
    title = plots.line(frame, "adc.bits", "sqnr_db").axes[0].get_title()
    assert title.replace("\n", " ") == (
        "NaN seeds left out of the mean: adc.bits=2 (1 of 2); adc.bits=4 (1 of 2); "
        "adc.bits=6 (1 of 2); 1 more")
    assert max(len(line) for line in title.split("\n")) <= 80, title


def test_nan_seeds_are_named_by_every_coordinate_of_their_point(grid):
    """With a hue (line) and in a heatmap, the point named in the title
    gives the value of each plotted parameter."""
    grid = grid.copy()
    grid.loc[(grid["adc.bits"] == 6) & (grid["source.photons_per_mac"] == 1e3)
             & (grid["seed"] == 1), "sqnr_db"] = math.nan
    title = plots.line(grid, "adc.bits", "sqnr_db",
                       hue="source.photons_per_mac").axes[0].get_title()
    assert "source.photons_per_mac=1000, adc.bits=6 (1 of 3)" in title
    title = plots.heatmap(grid, "adc.bits", "source.photons_per_mac",
                          "sqnr_db").axes[0].get_title()
    assert "adc.bits=6, source.photons_per_mac=1000 (1 of 3)" in " ".join(title.split())


def test_heatmap_annotations_are_light_on_the_dark_half_of_the_scale_as_drawn():
    """White text where the cell's colour is in the low (dark) half of the
    colour scale as drawn: on a log scale 1e-5 of [1e-6, 1e-2] is a quarter
    up (white) and 1e-3 three quarters (black), though linearly both sit
    near the bottom."""
    from matplotlib.colors import to_rgba

    values = {(4, 1e3): 1e-6, (4, 1e4): 1e-5, (8, 1e3): 1e-3, (8, 1e4): 1e-2}
    rows = [{"seed": 0, "adc.bits": b, "source.photons_per_mac": p, "relative_error": v}
            for (b, p), v in values.items()]
    fig = plots.heatmap(frame_of(rows, ["adc.bits", "source.photons_per_mac"]),
                        "source.photons_per_mac", "adc.bits", "relative_error")
    colour = {t.get_text(): to_rgba(t.get_color()) for t in fig.axes[0].texts}
    white, black = to_rgba("white"), to_rgba("black")
    assert colour == {"1e-06": white, "1e-05": white, "0.001": black, "0.01": black}
    rows = [{"seed": 0, "adc.bits": b, "source.photons_per_mac": p, "sqnr_db": v}
            for (b, p), v in zip(values, [0.0, 1.0, 2.0, 3.0], strict=True)]
    fig = plots.heatmap(frame_of(rows, ["adc.bits", "source.photons_per_mac"]),
                        "source.photons_per_mac", "adc.bits", "sqnr_db")
    colour = {t.get_text(): to_rgba(t.get_color()) for t in fig.axes[0].texts}
    assert colour == {"0": white, "1": white, "2": black, "3": black}


def test_wrapped_matmul_bars_keep_error_bars_and_infinite_marks_on_their_row():
    """Twelve hues over nine bars wrap onto two rows (m0-m4, then m5-m7 and
    the layer output): the second row's bars keep their error bars, and an
    infinite mean of m6 is marked on the second row, over m6's bar."""
    hues = list(np.logspace(2, 7, 12))
    rows = layer_rows(hues, 8, seeds=2, value=lambda h, m, s: math.inf
                      if m == 6 and h == hues[0] else 10.0 + m + s)
    fig = plots.matmul_bars(rows, hue="source.photons_per_mac")
    first, second = fig.axes
    assert [t.get_text() for t in second.get_xticklabels()] == ["m5", "m6", "m7", "layer output"]
    for ax in (first, second):
        bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert len(bars) == 12
        half = [abs(seg[1][1] - seg[0][1]) / 2 for c in bars for seg in c[2][0].get_segments()]
        np.testing.assert_allclose(half, math.sqrt(0.5), rtol=1e-12)
    assert not [line for line in first.lines if line.get_marker() == "^"]
    (mark,) = [line for line in second.lines if line.get_marker() == "^"]
    assert mark.get_xdata()[0] == pytest.approx(1 - 0.4 + 0.8 / 12 / 2)  # m6, first hue
    assert [t.get_text() for t in second.texts] == ["inf"]


def test_a_long_title_wraps_inside_the_figure(grid):
    """Held values and NaN seeds make a title wider than a figure with its
    legend outside (and a narrow heatmap): it wraps and stays inside the
    figure, above the axes. Held numpy values read as plain numbers."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    frame = grid.copy()
    frame["detector.read_noise_electrons"] = 10.0
    frame["adc.full_scale"] = "calibrated"
    frame.attrs["sweep"] = {"params": ["adc.bits", "source.photons_per_mac",
                                       "detector.read_noise_electrons", "adc.full_scale"]}
    frame.loc[(frame["seed"] == 1) & (frame["adc.bits"] > 4), "sqnr_db"] = math.nan
    where = {"detector.read_noise_electrons": np.float64(10.0), "adc.full_scale": "calibrated"}
    small = frame[frame["adc.bits"] < 8]  # a 2 x 3 heatmap: the narrowest figure
    for fig in (plots.line(frame, "adc.bits", "sqnr_db", hue="source.photons_per_mac",
                           where=where),
                plots.heatmap(small, "adc.bits", "source.photons_per_mac", "sqnr_db",
                              where=where)):
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        ax = fig.axes[0]
        assert "detector.read_noise_electrons=10.0, adc.full_scale='calibrated'" in \
            " ".join(ax.get_title().split())  # however it is broken into lines
        box = ax.title.get_window_extent(canvas.get_renderer())
        assert 0 <= box.x0 and box.x1 <= fig.bbox.width and box.y1 <= fig.bbox.height, box
        assert box.y0 >= ax.get_window_extent(canvas.get_renderer()).y1 - 1


def test_string_values_keep_their_order_and_numbers_one_label_style():
    """Legends and categorical axes list a config choice's values in the
    order its field lists them (outliers.policy: none, static, dynamic; a
    random sweep draws them in any order), other strings in the order the
    table gives them, not alphabetically; numbers stay sorted, ints and
    floats together. Photon counts from 1e3 to 1e6 read 1e3 ... 1e6, not
    1000 ... 1e+06, in the legend and in the title's note of NaN seeds alike.
    Metrics in decibels carry their unit."""
    from optical import OpticalConfig
    from optical._plot_axes import axis_title, ordered

    policies = list(OpticalConfig.field_spec("outliers.policy")["choices"])
    assert policies == ["none", "static", "dynamic"]
    drawn_order = ["static", "dynamic", "none"]
    rows = [{"seed": 0, "outliers.policy": p, "adc.bits": b, "sqnr_db": 10.0 * i + b,
             "sqnr_db.q_proj": 20.0 + i} for i, p in enumerate(drawn_order) for b in (8, 4)]
    frame = frame_of(rows, ["outliers.policy", "adc.bits"])
    bars = plots.matmul_bars(frame, hue="outliers.policy", where={"adc.bits": 8})
    assert [t.get_text() for t in bars.axes[0].get_legend().get_texts()] == policies
    assert bars.axes[0].get_ylabel() == "sqnr_db (dB)\nmean over 1 seed"
    line = plots.line(frame, "outliers.policy", "sqnr_db", hue="adc.bits")
    ax = line.axes[0]
    drawn(line)
    assert [t.get_text() for t in ax.get_xticklabels()] == policies
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["4", "8"]
    heat = plots.heatmap(frame, "outliers.policy", "adc.bits", "sqnr_db")
    assert [t.get_text() for t in heat.axes[0].get_xticklabels()] == policies
    custom = frame_of([{"seed": 0, "mirror": m, "sqnr_db": 1.0} for m in ("zinc", "gold")],
                      ["mirror"])
    ax = plots.line(custom, "mirror", "sqnr_db").axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["zinc", "gold"]
    assert ordered([8, 4.5, 2, None], lambda v: v) == [2, 4.5, 8, None]
    # A missing choice (a table read back from CSV) goes last among the choices too.
    assert ordered(["static", None, "none"], lambda v: v,
                   choices=("none", "static", "dynamic")) == ["none", "static", None]
    from optical._plot_axes import labels

    # One style with exponents: every finite nonzero float in it, zero as "0".
    assert labels([0.0, 1e4, 1e6]) == ["0", "1e4", "1e6"]
    photons = [1e3, 1e4, 1e5, 1e6]
    rows = [{"seed": s, "adc.bits": b, "source.photons_per_mac": p,
             "sqnr_db": math.nan if (s, p) == (1, 1e6) else 1.0}
            for b in (4,) for p in photons for s in (0, 1)]
    fig = plots.line(frame_of(rows, ["adc.bits", "source.photons_per_mac"]), "adc.bits",
                     "sqnr_db", hue="source.photons_per_mac")
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == \
        ["1e3", "1e4", "1e5", "1e6"]
    assert "source.photons_per_mac=1e6, adc.bits=4 (1 of 2)" in fig.axes[0].get_title()
    assert axis_title("mask.contrast_ratio") == "mask.contrast_ratio"  # dimensionless: as named
    assert [axis_title(m) for m in ("local_sqnr_db.down_proj", "update.sqnr_db", "cosine",
                                    "workload.layer")] == \
        ["local_sqnr_db.down_proj (dB)", "update.sqnr_db (dB)", "cosine", "layer"]


def test_matmul_bars_title_names_the_stored_sweep_and_its_unfinished_runs():
    """A layer sweep's bars carry the same first title line as the line and
    heatmap figures: the workload, the base config and, while unfinished,
    how many of the planned runs the figure holds."""
    rows = layer_rows([1e3, 1e4], 2)
    rows.attrs["sweep"].update(runs=3, finished=2, workload="llama-3.2-1b layer 0, 64 tokens",
                               base="iris-like")
    title = plots.matmul_bars(rows, hue="source.photons_per_mac").axes[0].get_title()
    assert title == "llama-3.2-1b layer 0, 64 tokens; iris-like; unfinished: 2 of 3 runs"
    rows.attrs["sweep"]["runs"] = 2
    rows.attrs["sweep"]["finished"] = 2
    title = plots.matmul_bars(rows, where={"source.photons_per_mac": 1e3}).axes[0].get_title()
    assert title.split("\n") == ["llama-3.2-1b layer 0, 64 tokens; iris-like",
                                 "source.photons_per_mac=1000.0"]


def test_a_long_legend_title_leaves_the_axes_most_of_the_width(grid):
    """'source.photons_per_mac (photons)' in one line of the title font took
    40 % of the figure and left the axes half of it: the unit now has a line
    of its own and the title the entries' small font; a short title stays on
    one line."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = plots.line(grid, "adc.bits", "sqnr_db", hue="source.photons_per_mac")
    FigureCanvasAgg(fig).draw()
    assert fig.axes[0].get_position().width > 0.6
    short = grid.rename(columns={"source.photons_per_mac": "dac.bits"})
    short.attrs["sweep"] = {"params": ["adc.bits", "dac.bits"]}
    ax = plots.line(short, "adc.bits", "sqnr_db", hue="dac.bits").axes[0]
    assert ax.get_legend().get_title().get_text() == "dac.bits"


def test_a_table_read_back_from_csv_plots_its_missing_values_as_none():
    """results.csv stores a None parameter value (adc.bits = None: an exact
    ADC) as an empty cell, which pandas reads back as NaN in a float column:
    it is the same point as None, drawn as one category after the numbers,
    in lines and heatmaps alike."""
    import io

    rows = [{"point": 0, "seed": seed, "adc.bits": bits, "dac.bits": 6,
             "sqnr_db": 10.0 + (bits or 12) + seed}
            for bits in (4, None, 8) for seed in range(2)]
    text = io.StringIO()
    pd.DataFrame(rows).to_csv(text, index=False)
    text.seek(0)
    frame = pd.read_csv(text)
    frame.attrs["sweep"] = {"params": ["adc.bits", "dac.bits"]}
    assert frame["adc.bits"].isna().sum() == 2
    fig = plots.line(frame, "adc.bits", "sqnr_db")
    drawn(fig)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["4", "8", "None"]
    np.testing.assert_array_equal(data_lines(ax)[0].get_ydata(), [14.5, 18.5, 22.5])
    heat = plots.heatmap(frame, "adc.bits", "dac.bits", "sqnr_db").axes[0]
    assert [t.get_text() for t in heat.get_xticklabels()] == ["4", "8", "None"]
