"""Scales, ticks, colours and marks of the sweep plots (:mod:`optical.plots`):
each rule decided from the plotted values, so a figure reads right without
options. matplotlib is imported inside the functions (an optional extra)."""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def numeric(values: Sequence[Any]) -> bool:
    """Whether every value is a finite real number (else the axis is categorical)."""
    return all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
               for v in values)


def _integers(xs: list) -> bool:
    return all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in xs)


def log_axis(xs: list) -> bool:
    """Whether positive values ``xs`` want a log axis: two decades, or one for
    floats (integers such as bit counts stay linear below two)."""
    span = max(xs) / min(xs)
    return span >= 100 or (span >= 10 and not _integers(xs))


def powers_of_two(xs: list) -> bool:
    """Whether ``xs`` are positive integer powers of two spanning a decade or
    more (8 ... 512 inputs): a base-2 log axis spaces them evenly, where a
    linear one crowds the small ones together."""
    return (_integers(xs) and all(v > 0 and v & (v - 1) == 0 for v in xs)
            and max(xs) / min(xs) >= 10)


def in_db(metric: str) -> bool:
    """Whether a metric column is in decibels: a ``*_db`` metric, of the
    layer output (``sqnr_db``), a product (``sqnr_db.q_proj``) or a part of
    the report (``update.sqnr_db``)."""
    return any(part.endswith("_db") for part in metric.split("."))


def log_values(values: Sequence[float], metric: str) -> bool:
    """Whether plotted values of ``metric`` want a log scale: all positive,
    spanning two decades or more, and not already in decibels (``sqnr_db``,
    ``sqnr_db.q_proj``, ``update.sqnr_db``: a log scale of a log scale misleads)."""
    values = np.asarray(values, dtype=np.float64)
    if in_db(metric) or values.size < 2:
        return False
    return bool(values.min() > 0 and values.max() / values.min() >= 100)


def axis_title(name: str) -> str:
    """An axis or legend title: a config field with its unit
    (``source.wavelength (m)``), a workload's field by its name
    (``workload.layer``: ``layer``), a metric in decibels with its
    (``sqnr_db.down_proj (dB)``: a ``*_db`` metric), other metrics and
    unitless fields as named."""
    from optical.config import OpticalConfig

    if name.startswith("workload."):
        return name.removeprefix("workload.")
    try:
        unit = OpticalConfig.field_unit(name)
    except ValueError:  # a metric (sqnr_db), not a config path
        unit = "dB" if in_db(name) else ""
    return f"{name} ({unit})" if unit and unit != "dimensionless" else name


def label(value: Any) -> str:
    """A value as a tick or legend label: floats in ``:g`` (``316.228``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def labels(values: Sequence[Any]) -> list[str]:
    """Labels of one axis's ticks or one legend, in one style: :func:`label`'s,
    unless that writes one of the floats with an exponent (``1e+06`` beside
    ``100000``); then every finite nonzero float in ``1e5`` / ``3.16e5`` form."""
    texts = [label(v) for v in values]
    if not any(isinstance(v, float) and "e" in t for v, t in zip(values, texts, strict=True)):
        return texts
    return [_scientific(v) if isinstance(v, float) and math.isfinite(v) and v != 0 else t
            for v, t in zip(values, texts, strict=True)]


def label_map(values: Sequence[Any]) -> dict[Any, str]:
    """Each of ``values`` with its :func:`labels` text (one style per set)."""
    return dict(zip(values, labels(values), strict=True))


def _scientific(value: float) -> str:
    mantissa, _, exponent = f"{value:.5e}".partition("e")
    mantissa = f"{float(mantissa):.6g}"
    return f"{mantissa}e{int(exponent)}"


def ordered(values: Sequence[Any], key: Any, choices: Sequence[Any] | None = None) -> list[Any]:
    """Distinct ``values`` (grouped by ``key``) in axis or legend order: a
    config choice's in the order its field lists them (``choices``:
    outliers.policy's none, static, dynamic), whatever a random sweep drew
    first; other strings in the order they first appear (a grid sweep's
    table lists them as given); numbers ascending, ints and floats alike;
    then other kinds; None last."""
    seen = list(dict.fromkeys(key(v) for v in values))
    if choices is not None and all(v in choices for v in seen if v is not None):
        rank = {c: i for i, c in enumerate(choices)}
        return sorted(seen, key=lambda v: (v is None, rank.get(v, 0)))
    if seen and all(isinstance(v, str) for v in seen):
        return seen

    def order(v: Any) -> tuple:
        if v is None:
            return (2, "", 0)
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            return (0, "", v)
        return (1, str(type(v)), v)

    return sorted(seen, key=order)


def colours(values: Sequence[Any]) -> list[Any]:
    """One distinct colour per hue value: numbers from a sequential colormap
    (viridis, light end left out: it vanishes on white), so that the order of
    the lines reads as magnitude; other values from tab10, or evenly from turbo
    past ten values, where tab10 would repeat."""
    from matplotlib import colormaps

    n = len(values)
    if n > 1 and numeric(values):
        return [colormaps["viridis"](0.85 * i / (n - 1)) for i in range(n)]
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    return [colormaps["turbo"](0.05 + 0.9 * i / (n - 1)) for i in range(n)]


@functools.cache
def _spaced_labels() -> type:
    """The tick formatter class of :func:`label_ticks` (defined on first use:
    matplotlib is an optional dependency)."""
    from matplotlib.textpath import TextToPath
    from matplotlib.ticker import Formatter

    class SpacedLabels(Formatter):
        """Given labels at fixed x ticks, less any that would overlap one
        kept before it: decided when the axis is drawn, at its final length.
        The labels at ``first`` (the ends, an axis's non-numeric values) are
        kept first, then the others from left to right."""

        def __init__(self, texts: Mapping[float, str], first: Sequence[float] = ()):
            self.texts = dict(texts)
            self.first = set(first)

        def __call__(self, x: float, pos: int | None = None) -> str:
            return self.texts.get(x, "")

        def format_ticks(self, values: Sequence[float]) -> list[str]:
            texts = [self(v) for v in values]
            ax = self.axis.axes
            font = self.axis.majorTicks[0].label1.get_fontproperties()
            pixels = ax.figure.dpi / 72  # per point
            bottom = ax.get_ylim()[0]
            centres = ax.transData.transform([(v, bottom) for v in values])[:, 0]
            gap, kept = font.get_size_in_points() * pixels / 2, []
            measure = TextToPath().get_text_width_height_descent  # in points, no renderer
            shown = [""] * len(texts)
            for i in sorted(range(len(texts)), key=lambda i: values[i] not in self.first):
                half = measure(texts[i], font, False)[0] / 2 * pixels
                left, right = centres[i] - half, centres[i] + half
                if texts[i] and all(left >= b + gap or right + gap <= a for a, b in kept):
                    kept.append((left, right))
                    shown[i] = texts[i]
            return shown

    return SpacedLabels


def label_ticks(ax: Any, positions: Sequence[float], texts: Sequence[str],
                first: Sequence[float] = ()) -> None:
    """x ticks at ``positions`` labelled ``texts``, leaving out labels that
    would overlap (many values, or values crowded on the scale); the two
    ends' labels and those at ``first`` are left out last."""
    from matplotlib.ticker import FixedLocator

    positions = list(positions)
    ends = [min(positions), max(positions)] if positions else []
    ax.xaxis.set_major_locator(FixedLocator(positions))
    ax.xaxis.set_major_formatter(_spaced_labels()(dict(zip(positions, texts, strict=True)),
                                                  [*first, *ends]))
    ax.xaxis.set_minor_locator(FixedLocator([]))


def categorical_ticks(ax: Any, xs: Sequence[Any]) -> None:
    """x ticks at 0, 1, ... labelled with the values ``xs``: those that are
    not finite numbers (inf, None) are the last left out where labels crowd."""
    label_ticks(ax, range(len(xs)), labels(xs),
                first=[i for i, v in enumerate(xs) if not numeric([v])])


def x_axis(ax: Any, xs: list, is_numeric: bool) -> None:
    """Scale and ticks of a line's x axis: the rule in
    :func:`optical.plots.line`'s docstring (``is_numeric``: :func:`numeric` of ``xs``)."""
    if not is_numeric:
        categorical_ticks(ax, xs)
        return
    positive = [v for v in xs if v > 0]
    if min(xs) > 0 and powers_of_two(xs):
        ax.set_xscale("log", base=2)
    elif min(xs) > 0 and log_axis(xs):
        ax.set_xscale("log")
        if len(xs) > 6:  # labels at decades read better than many values' labels
            return
    elif min(xs) == 0 and len(positive) > 1 and max(positive) / min(positive) >= 100:
        # 0 beside decades: the linear part ends at the smallest positive value
        ax.set_xscale("symlog", linthresh=min(positive))
    if len(xs) <= 12:
        label_ticks(ax, xs, labels(xs))


def mark_infinite(ax: Any, marks: Sequence[tuple[float, float, Any]]) -> None:
    """Draw each infinite mean ``(x, +-inf, colour)`` as a triangle at the top
    (+inf) or bottom edge of the axes, labelled "inf": an exact result (an
    infinite SQNR) must not look like a missing run. The y margins grow so that
    no finite point is drawn there."""
    if not marks:
        return
    ax.set_ymargin(0.15)  # the finite data stay within 11.5% ... 88.5% of the height
    labelled = set()
    for x, mean, colour in marks:
        top = mean > 0
        y = 0.95 if top else 0.05
        ax.plot([x], [y], marker="^" if top else "v", color=colour, linestyle="none",
                transform=ax.get_xaxis_transform(), clip_on=False)
        if (x, top) not in labelled:
            labelled.add((x, top))
            ax.annotate("inf" if top else "-inf", (x, y), xycoords=ax.get_xaxis_transform(),
                        xytext=(0, -6 if top else 6), textcoords="offset points",
                        rotation=90, ha="center", va="top" if top else "bottom",
                        fontsize="small", color="0.2")


def spread(std: np.ndarray) -> np.ndarray | None:
    """Error bars of standard deviations ``std``: none where it is 0 (one
    seed, equal seeds), whose cap alone would look like a measured spread."""
    return np.where(std > 0, std, np.nan) if np.any(std > 0) else None


def legend(ax: Any, param: str) -> None:
    """The legend of swept ``param`` outside the axes, to their right, where
    it covers no data; its title in the entries' small font with the unit on
    a line of its own, so that a long config path does not take the axes'
    width."""
    title = axis_title(param)
    if len(title) > 16:
        title = title.replace(" (", "\n(", 1)
    ax.legend(title=title, loc="upper left", bbox_to_anchor=(1.02, 1),
              borderaxespad=0, fontsize="small", title_fontsize="small")
