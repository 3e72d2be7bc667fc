"""Plots of sweep tables: what is drawn equals the seed averages computed here."""

import math
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


def test_line_draws_seed_means_per_hue(grid):
    fig = plots.line(grid, "adc.bits", "sqnr_db", hue="source.photons_per_mac")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("adc.bits", "sqnr_db")
    assert ax.get_legend().get_title().get_text() == "source.photons_per_mac"
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
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("adc.bits", "source.photons_per_mac")
    assert fig.axes[1].get_ylabel() == "sqnr_db"
    image = ax.get_images()[0].get_array()
    expected = partial.groupby(["source.photons_per_mac", "adc.bits"])["sqnr_db"].mean()
    assert image.mask[0, 2]  # (photons 10, 8 bits): not run
    np.testing.assert_allclose(image[1, 0], expected[(1e3, 4)], rtol=1e-12)
    assert len(ax.texts) == 8


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
    assert ax.get_ylabel() == "sqnr_db"
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
    assert (name, label) == ("cosine-per-matmul", "cosine")
    assert heights == pytest.approx([0.91, 0.55], rel=1e-12)
    assert bars(None) == ("sqnr_db-per-matmul", "sqnr_db", [30.0, 20.5])


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


def test_save_takes_the_format_from_a_suffix(grid, tmp_path):
    fig = plots.line(grid, "adc.bits", "sqnr_db", where={"source.photons_per_mac": 10.0})
    assert plots.save(fig, tmp_path / "a.pdf") == [tmp_path / "a.pdf"]
    assert (tmp_path / "a.pdf").read_bytes()[:4] == b"%PDF"
    assert plots.save(fig, tmp_path / "b.PNG", ["png", "svg"]) == [tmp_path / "b.png",
                                                                  tmp_path / "b.svg"]
    assert plots.save(fig, tmp_path / "c.v2") == [tmp_path / "c.v2.png", tmp_path / "c.v2.svg"]
    with pytest.raises(ValueError, match="d.png names the format png, but the formats are svg"):
        plots.save(fig, tmp_path / "d.png", ["svg"])
    with pytest.raises(ValueError, match="formats: 'gif' is not valid"):
        plots.save(fig, tmp_path / "e", ["gif"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "a.pdf", "b.png", "b.svg", "c.v2.png", "c.v2.svg"]


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
