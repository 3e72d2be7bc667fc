"""Plots of sweep results (matplotlib, no pyplot: no global state is touched).

Each function takes the tidy DataFrame of :func:`optical.sweep` /
:func:`optical.load_sweep`, averages a metric over seeds (error bars: the
sample standard deviation over seeds; NaN seeds left out and named in the title;
an infinite mean marked "inf" at the axes' edge), chooses linear or log
scales from the values (:func:`line`), and returns a ``matplotlib.figure.Figure``;
:func:`save` writes it as PNG and SVG (or the format a file name's suffix
names). Swept parameters other than the ones
plotted must be held fixed with ``where={"path": value}`` (or plotted as the
hue): a plot never silently averages over a parameter. :func:`summary` gives
the numbers a figure draws (each point's mean, sample std and seeds) as a
DataFrame.

>>> from optical import plots
>>> fig = plots.line(df, x="adc.bits", y="sqnr_db", hue="source.photons_per_mac")  # doctest: +SKIP
>>> plots.save(fig, "runs/adc/plots/sqnr")                                         # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optical import _plot_axes
from optical._files import replacing, write_output
from optical._sweep_store import META_COLUMNS
from optical._validation import check_bool
from optical.config import OpticalConfig

__all__ = ["heatmap", "line", "matmul_bars", "param_columns", "save", "summary"]



def param_columns(frame: Any) -> list[str]:
    """The swept parameters among ``frame``'s columns: config paths and
    workload fields (``workload.layer``)."""
    listed = frame.attrs.get("sweep", {}).get("params")
    if listed is not None:
        return list(listed)
    found = []
    for column in frame.columns:
        if str(column).startswith("workload."):
            found.append(str(column))
            continue
        try:
            OpticalConfig.field_spec(str(column))
        except ValueError:
            continue
        found.append(str(column))
    return found


def _metric_columns(frame: Any) -> list[str]:
    params = set(param_columns(frame))
    return [str(c) for c in frame.columns if c not in params and c not in META_COLUMNS]


def _key(value: Any) -> Any:
    """Group key: NaN (pandas' missing value) and None are one value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


def _sorted(frame: Any, name: str) -> list[Any]:
    """The distinct values of column ``name`` in axis / legend order
    (:func:`optical._plot_axes.ordered`; a config choice's in its field's order)."""
    from optical.config import OpticalConfig

    try:
        spec = OpticalConfig.field_spec(name)
    except ValueError:  # a custom workload's parameter column
        spec = {}
    return _plot_axes.ordered(frame[name], _key, spec.get("choices"))


def _check_param(frame: Any, name: str, option: str) -> None:
    params = param_columns(frame)
    if name not in params:
        raise ValueError(f"{option} {name!r} is not a swept parameter; swept: "
                         f"{', '.join(params) or '(none)'}")


def _check_runs(frame: Any) -> None:
    if not hasattr(frame, "empty") or not hasattr(frame, "columns"):
        raise TypeError(f"frame: expected a pandas DataFrame (optical.sweep's table), got "
                        f"{type(frame).__name__}")
    if frame.empty:
        raise ValueError("no finished runs to plot")


def _check_metric(frame: Any, name: str, option: str) -> None:
    if name not in _metric_columns(frame):
        local = any(str(c).startswith("local_") for c in _metric_columns(frame))
        hint = (" (local_* metrics are recorded by a layer sweep run with --local, "
                "LayerWorkload(local=True))" if str(name).startswith("local_") and not local
                else "")
        raise ValueError(f"{option} {name!r} is not a metric of this sweep{hint}; metrics: "
                         f"{', '.join(_metric_columns(frame))}")
    column = frame[name]
    if column.dtype.kind not in "biuf" and not all(  # None: a run that gave no value
            v is None or isinstance(v, numbers.Real) for v in column):
        raise TypeError(f"{option} {name!r}: the column holds {column.dtype} values, not "
                        "real numbers")


def _select(frame: Any, where: Mapping[str, Any] | None, used: Sequence[str]) -> Any:
    """Rows matching ``where``; ValueError if another parameter still varies."""
    if where is not None and not isinstance(where, Mapping):
        raise TypeError(f"where: expected a mapping of parameter paths to values, got "
                        f"{type(where).__name__}")
    where = dict(where or {})
    mask = np.ones(len(frame), dtype=bool)
    for path, value in where.items():
        _check_param(frame, path, "where")
        column = [_key(v) for v in frame[path]]
        matches = np.array([v == _key(value) for v in column], dtype=bool)
        if not matches.any() and isinstance(value, str | os.PathLike):
            # A path as the sweep stores it (workload.model_dir: resolved), from
            # one given relative or with ~: the runs of that directory.
            resolved = str(Path(os.path.expanduser(value)).resolve())
            matches = np.array([v == resolved for v in column], dtype=bool)
        mask &= matches
        if not mask.any():
            raise ValueError(f"where {path}={value!r}: no runs match; values: "
                             f"{', '.join(repr(v) for v in _sorted(frame, path))}")
    frame = frame[mask]
    for path in param_columns(frame):
        if path in used or path in where:
            continue
        values = _sorted(frame, path)
        if len(values) > 1:
            raise ValueError(f"parameter {path} also varies ({', '.join(map(repr, values))}): "
                             f"fix it with where={{'{path}': ...}} (CLI: --where {path}=VALUE) "
                             "or plot it as the hue")
    if frame.empty:
        raise ValueError("no finished runs to plot")
    return frame


def _groups(frame: Any, keys: Sequence[str], metric: str) -> dict[tuple, np.ndarray]:
    columns = [[_key(v) for v in frame[k]] for k in keys]
    values = frame[metric].to_numpy(dtype=np.float64)
    groups: dict[tuple, list[float]] = {}
    for i, value in enumerate(values):
        groups.setdefault(tuple(c[i] for c in columns), []).append(value)
    return {k: np.asarray(v) for k, v in groups.items()}


def _mean_std(values: np.ndarray) -> tuple[float, float, int]:
    """Mean and sample standard deviation over the seeds of one point, and how
    many NaN seeds were left out of them.

    A NaN seed (a metric undefined on that run) is left out and counted, so
    that one failed seed does not hide the others; the caller names it on the
    figure. An infinite seed (the SQNR of an exact result) makes the mean
    infinite, with no spread; +inf and -inf together have no mean (NaN).
    """
    kept = values[~np.isnan(values)]
    dropped = values.size - kept.size
    if kept.size == 0:
        return math.nan, 0.0, dropped
    if not np.all(np.isfinite(kept)):
        signs = set(np.sign(kept[np.isinf(kept)]))
        return (math.inf * signs.pop() if len(signs) == 1 else math.nan), 0.0, dropped
    # Equal seeds have no spread (np.std of three equal float64 values is ~1e-14:
    # an error bar drawn for none).
    std = float(np.std(kept, ddof=1)) if kept.size > 1 and np.ptp(kept) > 0 else 0.0
    return float(np.mean(kept)), std, dropped


def _spread_label(seeds: Sequence[int], errorbars: bool | None = True) -> str:
    """What the plotted values are, from the seeds behind each point (NaN
    seeds left out): ``"mean ± std over 3 seeds"``; a point of one seed has no
    error bar, which must not read as no spread. ``errorbars=None``: a figure
    that draws no spread (a heatmap's cells), ``"mean over 3 seeds"``."""
    seeds = [n for n in seeds if n > 0]
    if not seeds:
        return ""
    lo, hi = min(seeds), max(seeds)
    count = f"{lo}" if lo == hi else f"{lo}-{hi}"
    noun = "seed" if hi == 1 else "seeds"
    if errorbars is None:
        return f"mean over {count} {noun}"
    if not errorbars or hi == 1:
        return f"mean over {count} {noun}" + ("" if errorbars else ", no error bars")
    note = f"mean ± std over {count} {noun}"
    return note + (" (1 seed: no bar)" if lo == 1 else "")


def summary(frame: Any, metric: str, by: Sequence[str] = (), *,
            where: Mapping[str, Any] | None = None) -> Any:
    """The numbers a plot draws: ``metric`` over the seeds of each value of
    the parameters ``by``, as the figures average it (NaN seeds left out).

    The mean is of the values as stored: of an SQNR, the mean of its dB
    values (10 log10 of the geometric mean of the signal-to-noise ratios),
    which is at or above the dB of the mean error power, by about
    ``0.115 * std**2`` (1 dB for seeds spread by 3 dB); a sweep's run files
    hold each seed's value for another average.

    Parameters
    ----------
    frame : DataFrame of a sweep
    metric : str
    by : sequence of str
        Swept parameters, one row per combination of their values, in the
        order the figures use; every other swept parameter must be held by
        ``where`` (as for the plots).
    where : mapping, optional

    Returns
    -------
    pandas.DataFrame
        Columns ``*by``, ``mean``, ``std`` (the sample standard deviation;
        0 for one seed), ``seeds`` (those averaged) and ``nan_seeds`` (those
        left out). A ``by`` column holding None (``adc.bits`` of 4 and
        None) is of object dtype, None and ints as swept, not NaN and floats.
    """
    import pandas as pd

    _check_runs(frame)
    _check_metric(frame, metric, "metric")
    if isinstance(by, str):
        raise TypeError(f"by: expected a sequence of swept parameters, got the string {by!r} "
                        f"(one parameter: by=[{by!r}])")
    by = list(by)
    for path in by:
        _check_param(frame, path, "by")
    frame = _select(frame, where, by)
    groups = _groups(frame, by, metric) if by else {(): frame[metric].to_numpy(np.float64)}
    rows = []
    for key in itertools.product(*(_sorted(frame, path) for path in by)):
        values = groups.get(tuple(key))
        if values is None:  # not run
            continue
        mean, std, lost = _mean_std(values)
        rows.append({**dict(zip(by, key, strict=True)), "mean": mean, "std": std,
                     "seeds": values.size - lost, "nan_seeds": lost})
    table = pd.DataFrame(rows, columns=[*by, "mean", "std", "seeds", "nan_seeds"])
    for path in by:  # None among numbers (adc.bits = 4, None) stays None, 4 an int:
        if any(row[path] is None for row in rows):  # pandas would make them NaN, 4.0
            table[path] = pd.Series([row[path] for row in rows], dtype=object)
    return table


def _figure(**kwargs: Any) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'optical[plot]'") from None

    return Figure(figsize=kwargs.pop("figsize", (6.4, 4.4)), layout="constrained", **kwargs)


def _heading(frame: Any) -> str:
    """What a stored sweep ran (its workload and base config) and, while it is
    unfinished, how many of its runs the figure holds; "" for a frame that
    does not say (one built by hand)."""
    sweep = frame.attrs.get("sweep", {})
    parts = [str(sweep[key]) for key in ("workload", "base") if sweep.get(key)]
    planned, finished = sweep.get("runs"), sweep.get("finished")
    if isinstance(planned, int) and isinstance(finished, int) and finished < planned:
        parts.append(f"unfinished: {finished} of {planned} runs")  # of the sweep, not a slice
    return "; ".join(parts)


def _title(where: Mapping[str, Any] | None, dropped: Sequence[str] = (),
           heading: str = "") -> str:
    """A ``heading`` line (:func:`_heading`), the ``where`` values, and lines
    naming the points whose NaN seeds were left out of the mean (at most
    three, then a count)."""
    title = ", ".join(f"{k}={_key(v)!r}" for k, v in (where or {}).items())
    if heading:
        title = "\n".join(filter(None, [heading, title]))
    if dropped:
        pieces = [*dropped[:3]] + ([f"{len(dropped) - 3} more"] if len(dropped) > 3 else [])
        lines = ["NaN seeds left out of the mean:"]
        for i, piece in enumerate(pieces):
            piece += ";" if i < len(pieces) - 1 else ""
            # Broken between points, within the narrowest figure (6.4 in at 10 pt).
            if len(lines[-1]) + 1 + len(piece) > 80:
                lines.append(piece)
            else:
                lines[-1] += " " + piece
        title = "\n".join(([title] if title else []) + lines)
    return title


def _dropped(point: str, dropped: int, seeds: int) -> str:
    return f"{point} ({dropped} of {seeds}{', no mean' if dropped == seeds else ''})"


def line(frame: Any, x: str, y: str, *, hue: str | None = None,
         where: Mapping[str, Any] | None = None, errorbars: bool = True) -> Any:
    """A metric against one parameter, one line per value of another.

    Parameters
    ----------
    frame : DataFrame of a sweep
    x : str
        Swept parameter on the horizontal axis: log scale when its values are
        positive and span two decades or more, or one decade for a float
        parameter such as photons per MAC, whose tick labels would collide on
        a linear axis (base 2 for integer powers of two spanning a decade,
        e.g. 8 ... 512 inputs); symlog (linear up to the smallest positive
        value) when 0 sits beside positive values spanning two decades or more;
        linear otherwise; categorical when not all finite numbers, e.g.
        ``None`` bits or ``inf`` photons (strings ordered as for ``hue``).
        Ticks sit at the values (at most 12 of them; on a log axis more than
        6 get matplotlib's decades instead), and labels that would overlap
        are left out: the two ends' and a categorical axis's ``inf`` or
        ``None`` last.
    y : str
        Metric, averaged over seeds, on a log axis when all the plotted means
        are positive and span two decades or more (e.g. relative error) and
        the metric is not in decibels (``*_db``), linear otherwise. Seeds
        whose value is NaN are left out of a mean and named in the title; an
        infinite mean (an exact result's SQNR) is drawn as a triangle at the
        top (or bottom) edge labelled "inf"; with no finite mean, the y axis
        has no ticks.
    hue : str, optional
        Swept parameter drawn as separate lines: numeric values in a sequential
        colormap (viridis, low to high), others in distinct colours; a
        config choice's values in its field's order (outliers.policy: none,
        static, dynamic), other strings in the order the table lists them,
        others sorted. Numbers label in one style: ``1e3`` ...
        ``1e6`` where ``:g`` would mix ``100000`` with ``1e+06``.
    where : mapping, optional
        Values at which to hold the other swept parameters.
    errorbars : bool
        Sample standard deviation over seeds (none where it is 0); the y
        label says how many seeds each point averages (``mean ± std over 3
        seeds``), so that a point of one seed, with no bar, is not read as one
        without spread.

    Returns
    -------
    matplotlib.figure.Figure
        Axis labels are ``x`` and ``y``, a config field's with its unit
        (``source.wavelength (m)``), a ``*_db`` metric's with dB; the legend
        sits outside the axes, on the right.
    """
    _check_runs(frame)
    errorbars = check_bool(errorbars, "errorbars")
    _check_param(frame, x, "x")
    _check_metric(frame, y, "y")
    if hue is not None:
        _check_param(frame, hue, "hue")
        if hue == x:
            raise ValueError(f"hue {hue!r} is the x parameter")
    heading = _heading(frame)  # of the whole sweep, before the selection
    frame = _select(frame, where, [x] + ([hue] if hue else []))
    xs = _sorted(frame, x)
    numeric = _plot_axes.numeric(xs)
    position = {v: (v if numeric else i) for i, v in enumerate(xs)}
    groups = _groups(frame, [hue or x, x], y)
    hues = _sorted(frame, hue) if hue else [None]
    names = _plot_axes.label_map(hues)
    xnames = _plot_axes.label_map(xs)
    fig = _figure()
    ax = fig.add_subplot()
    plotted, infinite, dropped, seeds = [], [], [], []
    for h, colour in zip(hues, _plot_axes.colours(hues), strict=True):
        points = []
        for xv in xs:
            values = groups.get((h if hue else xv, xv))
            if values is None:  # not run (random sampling, an unfinished sweep)
                continue
            mean, std, lost = _mean_std(values)
            seeds.append(values.size - lost)
            if lost:
                point = f"{x}={xnames[xv]}"
                if hue:
                    point = f"{hue}={names[h]}, {point}"
                dropped.append(_dropped(point, lost, values.size))
            if math.isinf(mean):
                infinite.append((position[xv], mean, colour))
            points.append((position[xv], mean, std))
        px, mean, std = (np.array(c, dtype=np.float64) for c in zip(*points, strict=True))
        finite = np.isfinite(mean)
        plotted.extend(mean[finite])
        # Non-finite means are NaN here: the line breaks there, not across them.
        ax.errorbar(px, np.where(finite, mean, np.nan),
                    yerr=_plot_axes.spread(std) if errorbars else None,
                    marker="o", capsize=3, color=colour, label=names[h] if hue else None)
    # Every swept x value is on the axis, even where no finite mean is drawn.
    ax.update_datalim([(p, 0.0) for p in position.values()], updatey=False)
    if _plot_axes.log_values(plotted, y):
        ax.set_yscale("log")
    if not plotted:  # only infinite marks (or none): a y scale would read as data near 0
        ax.set_yticks([])
    _plot_axes.x_axis(ax, xs, numeric)
    _plot_axes.mark_infinite(ax, infinite)
    ax.set_xlabel(_plot_axes.axis_title(x))
    ax.set_ylabel("\n".join(filter(None, [_plot_axes.axis_title(y),
                                          _spread_label(seeds, errorbars)])))
    if hue:
        _plot_axes.legend(ax, hue)
    ax.grid(True, alpha=0.3)
    ax.set_title(_title(where, dropped, heading), fontsize="medium", wrap=True)
    return fig


def heatmap(frame: Any, x: str, y: str, z: str | None = None, *,
            where: Mapping[str, Any] | None = None, annotate: bool | None = None,
            value: str | None = None) -> Any:
    """A metric ``z`` (mean over seeds) over two swept parameters ``x`` and ``y``.

    The colour bar's label says over how many seeds the cells are means.
    Missing cells (random sampling, an unfinished sweep) and infinite means
    are left blank (an infinite one is annotated "inf"); seeds whose value is
    NaN are left out of a mean and named in the title. The colour scale is
    logarithmic when all finite cells are positive and span two decades or
    more (e.g. relative error) and the metric is not in decibels (``*_db``),
    linear otherwise. Cells are annotated with
    their values when the grid is small (at most 12 x 12) unless ``annotate``
    says otherwise. ``value`` is the former name of ``z``, still accepted.
    """
    if value is not None:
        if z is not None:
            raise TypeError("heatmap: give the metric as z (value is its former name), not both")
        z = value
    if z is None:
        raise TypeError("heatmap: missing the metric to plot, z")
    _check_runs(frame)
    _check_param(frame, x, "x")
    _check_param(frame, y, "y")
    _check_metric(frame, z, "z")
    if x == y:
        raise ValueError(f"x and y are both {x!r}")
    heading = _heading(frame)  # of the whole sweep, before the selection
    frame = _select(frame, where, [x, y])
    xs, ys = _sorted(frame, x), _sorted(frame, y)
    xnames = _plot_axes.label_map(xs)
    ynames = _plot_axes.label_map(ys)
    groups = _groups(frame, [y, x], z)
    grid = np.full((len(ys), len(xs)), np.nan)
    dropped, seeds = [], []
    for (yv, xv), values in groups.items():
        grid[ys.index(yv), xs.index(xv)], _, lost = _mean_std(values)
        seeds.append(values.size - lost)
        if lost:
            point = f"{x}={xnames[xv]}, {y}={ynames[yv]}"
            dropped.append(_dropped(point, lost, values.size))
    # The title broken within the figure's width (at most 12 characters an
    # inch) here, not by matplotlib when drawn, so that the layout makes room
    # for every line; each line adds to the figure's height, not taking it
    # from the axes (and their y label).
    width = 1.2 + 0.9 * max(len(xs), 4)
    title = "\n".join(textwrap.fill(line, int(12 * width), break_long_words=False)
                      for line in _title(where, dropped, heading).split("\n"))
    fig = _figure(figsize=(width, 1.2 + 0.6 * max(len(ys), 4) + 0.2 * title.count("\n")))
    ax = fig.add_subplot()
    finite = np.where(np.isfinite(grid), grid, np.nan)
    norm = None
    if _plot_axes.log_values(finite[np.isfinite(finite)], z):
        from matplotlib.colors import LogNorm

        norm = LogNorm(vmin=np.nanmin(finite), vmax=np.nanmax(finite))
    image = ax.imshow(np.ma.masked_invalid(finite), origin="lower", aspect="auto",
                      cmap="viridis", norm=norm)
    bar = fig.colorbar(image, ax=ax, label="\n".join(filter(None, [_plot_axes.axis_title(z),
                                                                     _spread_label(seeds, None)])))
    if not np.isfinite(finite).any():  # no cell coloured: a scale would read as data
        bar.set_ticks([])
    _plot_axes.categorical_ticks(ax, xs)
    ax.set_yticks(range(len(ys)), list(ynames.values()))
    if annotate if annotate is not None else len(xs) <= 12 and len(ys) <= 12:
        for (i, j), v in np.ndenumerate(grid):
            if math.isnan(v):
                continue
            # Light text on the dark (low) half of the colour scale, as drawn.
            dark = math.isfinite(v) and image.norm.vmax > image.norm.vmin and \
                float(image.norm(v)) < 0.5
            ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize="small",
                    color="white" if dark else "black")
    ax.set_xlabel(_plot_axes.axis_title(x))
    ax.set_ylabel(_plot_axes.axis_title(y))
    ax.set_title(title, fontsize="medium")
    return fig


def matmul_bars(frame: Any, metric: str = "sqnr_db", *, hue: str | None = None,
                where: Mapping[str, Any] | None = None) -> Any:
    """Per-matmul ``metric`` of a layer sweep (columns ``metric.<matmul>``).

    One bar per matmul and, if present, one for the layer output
    (``metric``); grouped by ``hue`` when given, coloured and ordered as in
    :func:`line`.
    Error bars (sample standard deviation over seeds, the y label saying over
    how many) are drawn when a spread is not zero; NaN seeds are left out of
    a mean and named in the title; an infinite mean is a triangle at the top
    edge labelled "inf". Bars are at least about 0.1 inch wide: past 14
    inches of them the matmuls wrap onto further rows of axes (sharing the y
    axis) rather than widen the figure; the legend sits outside the first
    row's axes, on the right.
    """
    _check_runs(frame)
    prefix = metric + "."
    names = [c[len(prefix):] for c in _metric_columns(frame) if c.startswith(prefix)]
    if not names:
        raise ValueError(f"no per-matmul columns {prefix}<matmul> in this sweep (a layer "
                         "sweep has them)")
    columns = [prefix + n for n in names]
    labels = list(names)
    if metric in frame.columns:
        columns.append(metric)
        labels.append("layer output")
    if hue is not None:
        _check_param(frame, hue, "hue")
    heading = _heading(frame)  # of the whole sweep, before the selection
    frame = _select(frame, where, [hue] if hue else [])
    hues = _sorted(frame, hue) if hue else [None]
    names = _plot_axes.label_map(hues)
    group_inches = max(0.54, 0.15 * len(hues))  # a group's bars fill 0.8 of its slot
    rows = math.ceil(len(columns) * group_inches / 12)
    per_row = math.ceil(len(columns) / rows)
    rows = math.ceil(len(columns) / per_row)  # (rounding per_row up can leave a row empty)
    fig = _figure(figsize=(max(6.4, min(14.0, per_row * group_inches + 2.5)),
                           4.4 + 3.0 * (rows - 1)))
    axes = fig.subplots(rows, 1, sharey=True, squeeze=False)[:, 0]
    width = 0.8 / len(hues)
    dropped, infinite, seeds = [], [[] for _ in axes], []
    finite_drawn = [False] * len(axes)
    for k, (h, colour) in enumerate(zip(hues, _plot_axes.colours(hues), strict=True)):
        rows_of_h = frame if hue is None else frame[[_key(v) == h for v in frame[hue]]]
        stats = []
        for column, label in zip(columns, labels, strict=True):
            values = rows_of_h[column].to_numpy(dtype=np.float64)
            stats.append(_mean_std(values))
            seeds.append(values.size - stats[-1][2])
            if stats[-1][2]:
                point = f"{label}" + (f", {hue}={names[h]}" if hue else "")
                dropped.append(_dropped(point, stats[-1][2], values.size))
        mean = np.array([s[0] for s in stats])
        std = np.array([s[1] for s in stats])
        for r, ax in enumerate(axes):
            part = slice(r * per_row, (r + 1) * per_row)
            centre = np.arange(len(columns))[part] - r * per_row - 0.4 + width * (k + 0.5)
            finite = np.isfinite(mean[part])
            finite_drawn[r] |= bool(finite.any())
            ax.bar(centre[finite], mean[part][finite], width,
                   yerr=_plot_axes.spread(std[part][finite]),
                   capsize=2, color=colour, label=names[h] if hue and r == 0 else None)
            infinite[r].extend((c, m, colour) for c, m in zip(centre, mean[part], strict=True)
                               if math.isinf(m))
    for r, ax in enumerate(axes):
        shown = labels[r * per_row:(r + 1) * per_row]
        ax.set_xticks(range(len(shown)), shown, rotation=30, ha="right")
        ax.set_xlim(-0.5, per_row - 0.5)  # equal bar widths on every row
        _plot_axes.mark_infinite(ax, infinite[r])
        if not finite_drawn[r]:  # only infinite marks: a y scale would read as data near 0
            ax.set_yticks([])
        ax.set_ylabel("\n".join(filter(None, [_plot_axes.axis_title(metric),
                                              _spread_label(seeds)])))
        ax.grid(True, axis="y", alpha=0.3)
    axes[-1].set_xlabel("matmul")
    if hue:
        _plot_axes.legend(axes[0], hue)
    axes[0].set_title(_title(where, dropped, heading), fontsize="medium",
                      wrap=True)
    return fig


#: Formats :func:`save` writes, by file suffix.
FORMATS = ("png", "svg", "pdf")
#: Image suffixes a figure's name may end in that are not among FORMATS: refused,
#: not read as part of a stem (``fig.jpg`` would write ``fig.jpg.png``).
_OTHER_IMAGE_SUFFIXES = ("jpg", "jpeg", "gif", "bmp", "tif", "tiff", "webp", "eps", "ps",
                         "svgz", "pgf", "raw", "rgba")


def save(fig: Any, stem: str | Path, formats: Sequence[str] | None = None,
         dpi: int = 150, *, follow_links: bool = True) -> list[Path]:
    """Write ``fig`` as ``stem.png``, ``stem.svg``, ...; returns the paths.

    ``formats`` defaults to PNG and SVG, or, when ``stem`` ends in a format's
    suffix (``fig.png``), to that format alone, written to ``stem`` itself.
    With ``formats`` given, a format suffix of ``stem`` is dropped
    (``fig.png`` with ``["png", "svg"]``: ``fig.png``, ``fig.svg``); it must be
    one of them. A symlink at a path is followed (the file it names is
    written), or, with ``follow_links=False`` (a directory the user did not
    make: ``optical plot``'s default ``DIR/plots``), replaced by the figure.
    """
    paths = output_paths(stem, formats)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for path in paths:  # whole or not at all: a kill keeps the previous figure
        if follow_links:
            write_output(path, lambda p, f=path.suffix[1:]: fig.savefig(p, format=f, dpi=dpi))
        else:  # a symlink, FIFO or device there is replaced, never written through
            with replacing(path) as tmp:
                fig.savefig(tmp, format=path.suffix[1:], dpi=dpi)
    return paths


def unwritten_suffix(stem: str | Path) -> str | None:
    """Why ``stem``'s suffix names no figure written here (``.jpg``: an
    image format not among :data:`FORMATS`), or None: a format's suffix, or
    none an image has (``run.v2`` is a stem)."""
    suffix = Path(stem).suffix.lower().lstrip(".")
    if suffix not in _OTHER_IMAGE_SUFFIXES:
        return None
    return (f".{suffix} figures are not written here; valid: "
            f"{', '.join('.' + f for f in FORMATS)}, or a name without a suffix (then every "
            "format asked for)")


def output_paths(stem: str | Path, formats: Sequence[str] | None = None) -> list[Path]:
    """The files :func:`save` writes for ``stem`` and ``formats``, without
    writing them; ValueError for a format that is not valid, TypeError for
    ``formats`` given as one string (``["png"]``, not ``"png"``)."""
    if isinstance(formats, str):
        raise TypeError(f"formats: expected a sequence of formats, got the string {formats!r} "
                        f"(one format: [{formats!r}])")
    stem = given = Path(stem)
    suffix = stem.suffix.lower().lstrip(".")
    if reason := unwritten_suffix(stem):
        raise ValueError(f"{stem.name}: {reason}")
    named = suffix if suffix in FORMATS else None
    alone = formats is None and named  # written to the stem itself, suffix as given
    if formats is None:
        formats = [named] if named else ["png", "svg"]
    formats = list(dict.fromkeys(str(f).lower() for f in formats))  # each written once
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"formats: {fmt!r} is not valid; valid: {', '.join(FORMATS)}")
    if not formats:
        raise ValueError("formats: no format given")
    if named:
        if named not in formats:
            raise ValueError(f"{stem.name} names the format {named}, but the formats are "
                             f"{', '.join(formats)}: give a name without a suffix, or "
                             "include that format")
        stem = stem.with_suffix("")
    return [given] if alone else [stem.with_name(f"{stem.name}.{fmt}") for fmt in formats]
