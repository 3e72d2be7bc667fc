"""Stacked-bar figure of an optical prefill against the GPU.

matplotlib is an optional dependency (``pip install 'optical[plot]'``); it is
imported only when a figure is drawn, and without pyplot: no backend or other
global state of the caller (a notebook, say) is touched.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from optical._files import write_output
from optical.energy.gpu import GPUReport
from optical.energy.model import PrefillEnergy

__all__ = ["breakdown_figure", "plot_breakdown"]


def figure_path(path: str | Path, option: str = "path") -> Path:
    """``path`` with a figure format's suffix (``.png`` added when it has
    none); ValueError naming ``option`` for a suffix no format has."""
    from optical.plots import FORMATS

    path = Path(path)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    if path.suffix.lower().lstrip(".") not in FORMATS:
        raise ValueError(f"{option} {path}: unknown figure format {path.suffix!r}; valid: "
                         f"{', '.join('.' + f for f in FORMATS)} (no suffix: .png)")
    return path


def _time_axis(ax: Any, times: list[float]) -> None:
    """Scale of the time-to-first-token panel, where bar lengths must keep the
    ratio of the times: linear from 0 when they are within 10x of each other;
    otherwise log, with the bottom at least a decade below the smaller time (a
    bar's length then reads in decades, none is a sliver of the other)."""
    low, high = min(times), max(times)
    if high < 10 * low:
        ax.set_ylim(0, 1.15 * high)  # room for the value above the taller bar
        return
    ax.set_yscale("log")
    ax.set_ylim(10 ** (math.floor(math.log10(low)) - 1), high * 10 ** 0.3)


def breakdown_figure(optical: PrefillEnergy, gpu: GPUReport, *,
                     hardware: str | None = None) -> Any:
    """Energy per prompt token (optical stacked by component, GPU) and time
    to first token, each bar with its value written on it; ``hardware``
    (the preset, say) is named in the title.

    The time panel is linear when the two times are within 10x of each
    other, else log from at least a decade below the smaller one.

    Returns
    -------
    matplotlib.figure.Figure
        Axes: energy, then time; ImportError naming ``pip install
        'optical[plot]'`` without matplotlib.
    """
    from optical.plots import _figure

    fig = _figure(figsize=(10, 4.5))
    from matplotlib import colormaps

    ax_e, ax_t = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    tokens = optical.batch * optical.tokens
    bottom = 0.0
    palette = colormaps["tab10"]
    colors = [palette(i) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]  # no grey: that is the GPU
    # A caller's added components next, in tab20's light shades (no grey either).
    colors += [colormaps["tab20"](i) for i in (1, 3, 5, 7, 9, 11, 13, 17, 19)]
    names = optical.component_names
    if len(names) > len(colors):
        raise ValueError(f"the figure tells {len(colors)} components apart; the report has "
                         f"{len(names)}")
    for color, name in zip(colors, names, strict=False):
        value = optical.components.get(name, 0.0) / tokens
        if value <= 0:
            continue
        ax_e.bar("optical", value, bottom=bottom, color=color, label=name)
        bottom += value
    ax_e.bar(gpu.gpu.name, gpu.per_token, color="0.3", label=f"GPU (x{gpu.gpus})")
    for x, total in enumerate((bottom, gpu.per_token)):
        ax_e.annotate(f"{total:.3g} J", (x, total), xytext=(0, 3), textcoords="offset points",
                      ha="center", va="bottom", fontsize="small")
    ax_e.margins(y=0.1)  # room for the totals
    ax_e.set_ylabel("energy per prompt token (J)")
    cores = f"{optical.cores} core{'s' if optical.cores > 1 else ''}"
    ax_e.set_title(f"{optical.model or 'model'}: {optical.tokens} tokens x batch "
                   f"{optical.batch}, {cores}" + (f"\n{hardware}" if hardware else ""),
                   fontsize=10, wrap=True)
    times = [optical.ttft, gpu.time]
    # Not palette(0): that colour is the laser's in the shared legend.
    bars = ax_t.bar(["optical", gpu.gpu.name], times, color=["white", "0.3"], edgecolor="black")
    _time_axis(ax_t, times)
    ax_t.bar_label(bars, [f"{t:.3g} s" for t in times], padding=3, fontsize="small")
    log = ax_t.get_yscale() == "log"
    ax_t.set_ylabel("time to first token (s" + (", log scale)" if log else ")"))
    handles, labels = ax_e.get_legend_handles_labels()  # the stack's, bottom up, then the GPU
    order = [*range(len(labels) - 2, -1, -1), len(labels) - 1]  # read as the stack, top down
    fig.legend([handles[i] for i in order], [labels[i] for i in order],
               loc="outside right center", fontsize=8)
    return fig


def plot_breakdown(optical: PrefillEnergy, gpu: GPUReport, path: str | Path, *,
                   hardware: str | None = None) -> Path:
    """Draw :func:`breakdown_figure` and save it to ``path`` (format from its
    suffix: png, svg or pdf; no suffix: ``.png`` is added).

    Returns
    -------
    Path
        Where the figure was written.
    """
    path = figure_path(path)
    fig = breakdown_figure(optical, gpu, hardware=hardware)
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = path.suffix[1:].lower()  # (the temporary file's suffix is .tmp)
    write_output(path, lambda p: fig.savefig(p, format=fmt, dpi=120))
    return path
