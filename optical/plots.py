"""Plots of sweep results (matplotlib, no pyplot: no global state is touched).

Each function takes the tidy DataFrame of :func:`optical.sweep` /
:func:`optical.load_sweep`, averages a metric over seeds (error bars: the
standard deviation over seeds), and returns a ``matplotlib.figure.Figure``;
:func:`save` writes it as PNG and SVG (or the format a file name's suffix
names). Swept parameters other than the ones
plotted must be held fixed with ``where={"path": value}`` (or plotted as the
hue): a plot never silently averages over a parameter.

>>> from optical import plots
>>> fig = plots.line(df, x="adc.bits", y="sqnr_db", hue="source.photons_per_mac")  # doctest: +SKIP
>>> plots.save(fig, "runs/adc/plots/sqnr")                                         # doctest: +SKIP
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optical.config import OpticalConfig

__all__ = ["heatmap", "line", "matmul_bars", "param_columns", "save"]

_META = ("point", "seed", "run_id", "elapsed_s", "optical_version", "config")


def param_columns(frame: Any) -> list[str]:
    """The swept config paths among ``frame``'s columns."""
    listed = frame.attrs.get("sweep", {}).get("params")
    if listed is not None:
        return list(listed)
    found = []
    for column in frame.columns:
        try:
            OpticalConfig.field_spec(str(column))
        except ValueError:
            continue
        found.append(str(column))
    return found


def _metric_columns(frame: Any) -> list[str]:
    params = set(param_columns(frame))
    return [str(c) for c in frame.columns if c not in params and c not in _META]


def _key(value: Any) -> Any:
    """Group key: NaN (pandas' missing value) and None are one value."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, np.generic):
        return value.item()
    return value


def _sorted(values: Any) -> list[Any]:
    return sorted({_key(v) for v in values}, key=lambda v: (v is None, str(type(v)), v
                                                             if v is not None else 0))


def _check_param(frame: Any, name: str, option: str) -> None:
    params = param_columns(frame)
    if name not in params:
        raise ValueError(f"{option} {name!r} is not a swept parameter; swept: "
                         f"{', '.join(params) or '(none)'}")


def _check_runs(frame: Any) -> None:
    if frame.empty:
        raise ValueError("no finished runs to plot")


def _check_metric(frame: Any, name: str, option: str) -> None:
    if name not in _metric_columns(frame):
        raise ValueError(f"{option} {name!r} is not a metric of this sweep; metrics: "
                         f"{', '.join(_metric_columns(frame))}")


def _select(frame: Any, where: Mapping[str, Any] | None, used: Sequence[str]) -> Any:
    """Rows matching ``where``; ValueError if another parameter still varies."""
    where = dict(where or {})
    mask = np.ones(len(frame), dtype=bool)
    for path, value in where.items():
        _check_param(frame, path, "where")
        column = [_key(v) for v in frame[path]]
        mask &= np.array([v == _key(value) for v in column], dtype=bool)
        if not mask.any():
            raise ValueError(f"where {path}={value!r}: no runs match; values: "
                             f"{', '.join(repr(v) for v in _sorted(frame[path]))}")
    frame = frame[mask]
    for path in param_columns(frame):
        if path in used or path in where:
            continue
        values = _sorted(frame[path])
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


def _mean_std(values: np.ndarray) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size < values.size:  # an infinite SQNR (exact result) stays infinite
        return float(np.mean(values)), 0.0
    std = float(np.std(values, ddof=1)) if values.size > 1 else 0.0
    return float(np.mean(values)), std


def _numeric(values: Sequence[Any]) -> bool:
    return all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
               for v in values)


def _figure(**kwargs: Any) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots need matplotlib: pip install 'optical[plot]'") from None

    return Figure(figsize=kwargs.pop("figsize", (6.4, 4.4)), layout="constrained", **kwargs)


def _title(where: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in (where or {}).items())


def _log_axis(xs: list) -> bool:
    """Whether positive values ``xs`` want a log axis: two decades, or one for
    floats (integers such as bit counts stay linear below two)."""
    span = max(xs) / min(xs)
    integers = all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in xs)
    return span >= 100 or (span >= 10 and not integers)


def line(frame: Any, x: str, y: str, *, hue: str | None = None,
         where: Mapping[str, Any] | None = None, errorbars: bool = True) -> Any:
    """A metric against one parameter, one line per value of another.

    Parameters
    ----------
    frame : DataFrame of a sweep
    x : str
        Swept parameter on the horizontal axis (log scale when its values
        are positive and span two decades or more, or one decade for a float
        parameter such as photons per MAC, whose tick labels would collide on
        a linear axis; categorical when not all finite numbers, e.g. ``None``
        bits or ``inf`` photons).
    y : str
        Metric, averaged over seeds.
    hue : str, optional
        Swept parameter drawn as separate lines.
    where : mapping, optional
        Values at which to hold the other swept parameters.
    errorbars : bool
        Standard deviation over seeds.

    Returns
    -------
    matplotlib.figure.Figure
        Axis labels are exactly ``x`` and ``y``.
    """
    _check_runs(frame)
    _check_param(frame, x, "x")
    _check_metric(frame, y, "y")
    if hue is not None:
        _check_param(frame, hue, "hue")
        if hue == x:
            raise ValueError(f"hue {hue!r} is the x parameter")
    frame = _select(frame, where, [x] + ([hue] if hue else []))
    xs = _sorted(frame[x])
    numeric = _numeric(xs)
    position = {v: (v if numeric else i) for i, v in enumerate(xs)}
    groups = _groups(frame, [hue or x, x], y)
    fig = _figure()
    ax = fig.add_subplot()
    for h in (_sorted(frame[hue]) if hue else [None]):
        points = [(position[xv], *_mean_std(groups[(h if hue else xv, xv)]))
                  for xv in xs if (h if hue else xv, xv) in groups]
        px, mean, std = (np.array(c) for c in zip(*points, strict=True))
        label = f"{h:g}" if isinstance(h, float) else str(h)
        ax.errorbar(px, mean, yerr=std if errorbars and np.any(std > 0) else None,
                    marker="o", capsize=3, label=label if hue else None)
    if numeric and min(xs) > 0 and _log_axis(xs):
        ax.set_xscale("log")
    if not numeric:
        ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    elif len(xs) <= 12:
        ax.set_xticks(xs, [f"{v:g}" for v in xs])
        ax.minorticks_off()
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if hue:
        ax.legend(title=hue)
    ax.grid(True, alpha=0.3)
    ax.set_title(_title(where), fontsize="medium")
    return fig


def heatmap(frame: Any, x: str, y: str, z: str | None = None, *,
            where: Mapping[str, Any] | None = None, annotate: bool | None = None,
            value: str | None = None) -> Any:
    """A metric ``z`` (mean over seeds) over two swept parameters ``x`` and ``y``.

    Missing cells (random sampling, an unfinished sweep) are left blank;
    cells are annotated with their values when the grid is small (at most
    12 x 12) unless ``annotate`` says otherwise. ``value`` is the former
    name of ``z``, still accepted.
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
    frame = _select(frame, where, [x, y])
    xs, ys = _sorted(frame[x]), _sorted(frame[y])
    groups = _groups(frame, [y, x], z)
    grid = np.full((len(ys), len(xs)), np.nan)
    for (yv, xv), values in groups.items():
        grid[ys.index(yv), xs.index(xv)] = _mean_std(values)[0]
    fig = _figure(figsize=(1.2 + 0.9 * max(len(xs), 4), 1.2 + 0.6 * max(len(ys), 4)))
    ax = fig.add_subplot()
    finite = np.where(np.isfinite(grid), grid, np.nan)
    image = ax.imshow(np.ma.masked_invalid(finite), origin="lower", aspect="auto",
                      cmap="viridis")
    fig.colorbar(image, ax=ax, label=z)
    ax.set_xticks(range(len(xs)), [_label(v) for v in xs])
    ax.set_yticks(range(len(ys)), [_label(v) for v in ys])
    if annotate if annotate is not None else len(xs) <= 12 and len(ys) <= 12:
        lo, hi = np.nanmin(finite, initial=np.inf), np.nanmax(finite, initial=-np.inf)
        for (i, j), v in np.ndenumerate(grid):
            if math.isnan(v):
                continue
            dark = math.isfinite(v) and hi > lo and (v - lo) / (hi - lo) < 0.5
            ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize="small",
                    color="white" if dark else "black")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(_title(where), fontsize="medium")
    return fig


def _label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def matmul_bars(frame: Any, metric: str = "sqnr_db", *, hue: str | None = None,
                where: Mapping[str, Any] | None = None) -> Any:
    """Per-matmul ``metric`` of a layer sweep (columns ``metric.<matmul>``),
    one bar per matmul and, if present, one for the layer output
    (``metric``); grouped by ``hue`` when given."""
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
    frame = _select(frame, where, [hue] if hue else [])
    hues = _sorted(frame[hue]) if hue else [None]
    fig = _figure(figsize=(max(6.4, 0.9 * len(columns) * max(1, len(hues)) * 0.6 + 2), 4.4))
    ax = fig.add_subplot()
    width = 0.8 / len(hues)
    for k, h in enumerate(hues):
        rows = frame if hue is None else frame[[_key(v) == h for v in frame[hue]]]
        stats = [_mean_std(rows[c].to_numpy(dtype=np.float64)) for c in columns]
        centre = np.arange(len(columns)) - 0.4 + width * (k + 0.5)
        ax.bar(centre, [s[0] for s in stats], width, yerr=[s[1] for s in stats], capsize=2,
               label=_label(h) if hue else None)
    ax.set_xticks(range(len(columns)), labels, rotation=30, ha="right")
    ax.set_xlabel("matmul")
    ax.set_ylabel(metric)
    if hue:
        ax.legend(title=hue)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(_title(where), fontsize="medium")
    return fig


#: Formats :func:`save` writes, by file suffix.
FORMATS = ("png", "svg", "pdf")


def save(fig: Any, stem: str | Path, formats: Sequence[str] | None = None,
         dpi: int = 150) -> list[Path]:
    """Write ``fig`` as ``stem.png``, ``stem.svg``, ...; returns the paths.

    ``formats`` defaults to PNG and SVG, or, when ``stem`` ends in a format's
    suffix (``fig.png``), to that format alone, written to ``stem`` itself.
    With ``formats`` given, a format suffix of ``stem`` is dropped
    (``fig.png`` with ``["png", "svg"]``: ``fig.png``, ``fig.svg``); it must be
    one of them.
    """
    paths = output_paths(stem, formats)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for path in paths:
        fig.savefig(path, format=path.suffix[1:], dpi=dpi)
    return paths


def output_paths(stem: str | Path, formats: Sequence[str] | None = None) -> list[Path]:
    """The files :func:`save` writes for ``stem`` and ``formats``, without
    writing them; ValueError for a format that is not valid."""
    stem = Path(stem)
    suffix = stem.suffix.lower().lstrip(".")
    named = suffix if suffix in FORMATS else None
    if formats is None:
        formats = [named] if named else ["png", "svg"]
    formats = [str(f).lower() for f in formats]
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
    return [stem.with_name(f"{stem.name}.{fmt}") for fmt in formats]
